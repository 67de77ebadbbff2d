"""What ``coursepkg grade``'s workers rely on when they set nbconvert's
``Exporter.optimistic_validation`` (:meth:`~coursepkg.grading.classroom.worker._PrivateCourse.
_api`): an exporter validates its notebook once, after its last preprocessor, and a notebook
made invalid by any preprocessor is still refused before anything is written."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbconvert.exporters import NotebookExporter
from nbconvert.preprocessors import Preprocessor
from traitlets.config import Config

SOURCE = (
    Path(__file__).resolve().parents[3] / "solutions" / "ex01_attention" / "ex01_attention.ipynb"
)


class _Touch(Preprocessor):
    """Marks the notebook (a valid change)."""

    def preprocess(self, nb, resources):
        nb.metadata["touched"] = nb.metadata.get("touched", 0) + 1
        return nb, resources


class _Corrupt(Preprocessor):
    """Makes the notebook invalid: a code cell without its outputs."""

    def preprocess(self, nb, resources):
        del next(c for c in nb.cells if c.cell_type == "code")["outputs"]
        return nb, resources


def _exporter(optimistic: bool, *steps) -> NotebookExporter:
    config = Config()
    config.Exporter.optimistic_validation = optimistic  # as the worker sets it
    exporter = NotebookExporter(config=config)
    for step in steps:
        exporter.register_preprocessor(step, enabled=True)
    return exporter


@pytest.mark.parametrize("optimistic", [False, True])
def test_validated_once_with_the_workers_setting(optimistic, monkeypatch):
    validations = []
    real = NotebookExporter._validate_preprocessor

    def counted(self, nb, step):
        validations.append(step)
        real(self, nb, step)

    monkeypatch.setattr(NotebookExporter, "_validate_preprocessor", counted)
    exporter = _exporter(optimistic, _Touch(), _Touch(), _Touch())
    output, _ = exporter.from_notebook_node(nbformat.read(str(SOURCE), as_version=4))
    assert nbformat.reads(output, as_version=4).metadata["touched"] == 3
    # nbconvert's default preprocessors (disabled ones too) run, and were validated after, each
    steps = len(exporter._preprocessors)
    assert steps > 3
    assert len(validations) == (1 if optimistic else steps)


@pytest.mark.parametrize("optimistic", [False, True])
@pytest.mark.parametrize("where", [0, 1, 2])
def test_a_notebook_made_invalid_by_any_step_is_still_refused(optimistic, where):
    steps = [_Touch(), _Touch(), _Touch()]
    steps[where] = _Corrupt()
    with pytest.raises(nbformat.ValidationError):
        _exporter(optimistic, *steps).from_notebook_node(nbformat.read(str(SOURCE), as_version=4))
