"""The ``coursepkg`` command line: every command has one home and one form, and ``coursepkg
info`` and ``coursepkg params`` run as a user runs them (the console script, in a fresh
process).

The other commands are run the same way where their work is tested: ``check`` in
``exercises/test_exercises.py``, ``release`` in ``grading/term/test_course_folder.py``,
``grade`` in ``grading/classroom/test_classroom.py``, ``export`` in
``grading/term/test_export.py``, ``regrade`` in ``grading/term/test_course.py``,
``similarity`` in ``grading/term/test_similarity.py``, ``train`` in ``training/test_loop.py``.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import processes
import pytest
import torch

import coursepkg
from coursepkg import cli
from coursepkg.config import TransformerConfig
from coursepkg.params import count_parameters

BIN = Path(sys.executable).parent
VERBS = [
    "info",
    "params",
    "check",
    "release",
    "grade",
    "kit",
    "extension",
    "export",
    "regrade",
    "similarity",
    "leaderboard",
    "data",
    "curate",
    "train",
    "finetune",
    "serve",
    "pipeline",
]


def coursepkg_run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    return processes.run([str(BIN / "coursepkg"), *args], env=env, idle=300, check=False)


def _subcommands(parser, dest: str = "command") -> dict:
    (action,) = [a for a in parser._actions if a.dest == dest]  # noqa: SLF001 - argparse's
    return dict(action.choices)


def _runs(sub) -> set:
    """What a subcommand runs: its own default, or its actions' (``regrade request``, ...)."""
    if sub.get_default("func") is not None:
        return {sub.get_default("func")}
    return {a.get_default("func") for a in _subcommands(sub, "action").values()}


def test_every_command_is_one_pair_in_one_home():
    """``_add_<verb>`` declares it and ``_<verb>`` runs it, both in the same home module, which
    lists it in its ``COMMANDS``; ``cli/__init__.py`` itself only builds and dispatches."""
    found = _subcommands(cli.build_parser())
    assert list(found) == VERBS
    homes = {home.__name__: home for home in cli.HOMES}
    for verb, sub in found.items():
        (run,) = _runs(sub)
        assert run.__name__ == f"_{verb}" and run.__module__ in homes, (verb, run)
        assert hasattr(homes[run.__module__], f"_add_{verb}"), verb
        assert verb in homes[run.__module__].COMMANDS, verb
    tree = ast.parse(inspect.getsource(cli))
    defined = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert defined == ["build_parser", "main"]


@pytest.mark.parametrize("verb", VERBS)
def test_each_command_explains_itself(verb):
    found = _subcommands(cli.build_parser())
    assert found[verb].format_help().startswith(f"usage: coursepkg {verb}")
    assert found[verb].description or verb == "train", verb  # train's is its epilog and help


# What `coursepkg --help` and an argument's error must not import (seconds on a busy machine;
# benchmarks/cli_startup.py times them against `python -c pass`).
HEAVY = ("torch", "nbgrader", "dask", "distributed", "sqlalchemy", "nbconvert", "numpy")
_QUICK = """
import contextlib, io, json, sys
from coursepkg.cli import main
said = {}
for args in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(args)
        except SystemExit as stop:
            said[" ".join(args)] = [stop.code, out.getvalue(), err.getvalue()]
heavy = json.loads(sys.argv[2])
print(json.dumps({"said": said, "heavy": [m for m in heavy if m in sys.modules]}))
"""


def test_help_and_argument_errors_import_neither_torch_nor_nbgrader():
    # train and finetune declare their flags from their settings' dataclasses, which live in
    # modules that import torch; every other command answers without it
    quick = [v for v in VERBS if v not in ("train", "finetune")]
    cases = [["--help"], *([verb, "--no-such-option"] for verb in quick)]
    run = subprocess.run(
        [sys.executable, "-c", _QUICK, json.dumps(cases), json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    found = json.loads(run.stdout)
    assert found["heavy"] == [], found["heavy"]
    code, text, _ = found["said"]["--help"]
    assert code == 0 and all(f"    {verb} " in text or f"    {verb}\n" in text for verb in VERBS)
    for verb in quick:
        code, _, err = found["said"][f"{verb} --no-such-option"]
        assert code == 2 and "coursepkg" in err and "error: " in err, (verb, err)


_CONSOLE = """
import json, sys
sys.argv = ["coursepkg", *json.loads(sys.argv[1])]
from coursepkg.cli import main
code = main()  # as the console script calls it: no argv
grammar = sys.modules.get("rfc3987_syntax", "not imported")
print(json.dumps([code, "jsonschema" in sys.modules, repr(grammar)]))
"""


def test_a_command_skips_jsonschemas_iri_grammar(tmp_path):
    # `regrade list` imports nbgrader (hence jsonschema) and answers from an empty folder; the
    # IRI grammar (~2 s of CPU) is never built: its import is made to fail, which jsonschema
    # takes as "not installed" (the grader's processes do the same)
    args = ["regrade", "list", "--root", str(tmp_path)]
    run = processes.run([sys.executable, "-c", _CONSOLE, json.dumps(args)], what="regrade list")
    code, imported_jsonschema, grammar = json.loads(run.stdout.strip().splitlines()[-1])
    assert imported_jsonschema and grammar == "None", (code, grammar, run.stderr[-2000:])


def test_the_similarity_defaults_in_the_help_are_the_reports():
    # read from the module's source: importing it imports the grader (nbgrader, torch)
    source = (Path(cli.__file__).parents[1] / "grading" / "term" / "similarity.py").read_text()
    values = {
        t.id: ast.literal_eval(node.value)
        for node in ast.parse(source).body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name) and t.id.startswith("DEFAULT_")
    }
    DEFAULT_THRESHOLD, DEFAULT_TOP = values["DEFAULT_THRESHOLD"], values["DEFAULT_TOP"]
    text = _subcommands(cli.build_parser(["similarity"]))["similarity"].format_help()
    assert f"side ({DEFAULT_THRESHOLD:g})" in " ".join(text.split())
    assert f"side ({DEFAULT_TOP})" in " ".join(text.split())


@pytest.mark.slow  # a coursepkg process of its own (torch's import)
def test_info_prints_the_versions_and_the_device():
    run = coursepkg_run("info")
    assert run.returncode == 0, run.stderr
    first, second = run.stdout.splitlines()
    assert first == f"coursepkg {coursepkg.__version__}"
    assert second.startswith(f"torch {torch.__version__} (device: ")


@pytest.mark.slow  # a coursepkg process of its own per case
@pytest.mark.parametrize(
    ("args", "kind", "config"),
    [
        ([], "encoder-decoder", TransformerConfig.base(vocab_size=37000)),
        (
            ["--preset", "big", "--untied"],
            "encoder-decoder",
            TransformerConfig.big(vocab_size=37000, tie_embeddings=False),
        ),
        (
            [
                "--decoder-only",
                "--vocab-size",
                "50257",
                "--d-model",
                "768",
                "--n-heads",
                "12",
                "--d-ff",
                "3072",
                "--n-layers",
                "12",
            ],
            "decoder-only",
            TransformerConfig.base(
                vocab_size=50257, d_model=768, n_heads=12, d_ff=3072, n_layers=12
            ),
        ),
    ],
)
def test_params_prints_the_closed_form_total(args, kind, config):
    run = coursepkg_run("params", *args)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith(f"{kind} model: D={config.d_model} H={config.n_heads}")
    (total,) = [ln for ln in lines if ln.split()[:1] == ["total"]]
    assert int(total.split()[1].replace(",", "")) == count_parameters(config, kind)
    assert ("one layer:" in lines) == (kind == "encoder-decoder")


@pytest.mark.slow  # a coursepkg process of its own (torch's import)
def test_a_bad_value_is_a_clear_error_without_a_traceback():
    run = coursepkg_run("params", "--n-heads", "7")  # 512 is not a multiple of 7
    assert run.returncode == 2
    assert run.stderr.startswith("coursepkg: error: ") and "Traceback" not in run.stderr


def test_the_lazy_package_root_still_reaches_its_submodules_as_attributes():
    """`import coursepkg` then `coursepkg.model_parts.X` worked when the root imported eagerly; the
    lazy root (PEP 562) imports a submodule named as an attribute, and unknown names still
    raise AttributeError."""
    code = (
        "import coursepkg\n"
        "assert coursepkg.model_parts.TokenEmbedding.__name__ == 'TokenEmbedding'\n"
        "assert callable(coursepkg.masks.causal_mask)\n"
        "assert not hasattr(coursepkg, 'no_such_module')\n"
        "assert not hasattr(coursepkg, '__wrapped__')\n"
    )
    done = processes.run([sys.executable, "-c", code], what="import coursepkg's submodules")
    assert done.returncode == 0, done.stderr
