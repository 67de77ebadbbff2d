"""nbgrader's ``Execute`` preprocessor, starting a kernel again when one never answered.

A kernel can die before it answers for reasons that are the machine's, not the notebook's:
another process starting at the same moment took one of the ports jupyter_client picked for it,
or the machine was too busy. nbgrader then gives up on the whole submission ("There was an error
processing assignment ..."), and the instructor has to autograde it again by hand. No cell has
run before the kernel answers, so starting a fresh kernel is safe: :class:`RestartingExecute`
does, up to :data:`~coursepkg.grading.notebook.KERNEL_STARTS` starts in all, as the student's
self-check (:func:`~coursepkg.grading.notebook.run_notebook`) does.

The course's ``nbgrader_config.py`` puts it in ``nbgrader autograde``'s preprocessors with
:func:`autograde_preprocessors`; ``coursepkg grade`` uses its subclass
:class:`~coursepkg.grading.kernel.forked.ForkExecute`.
"""

from __future__ import annotations

from typing import Any

from nbgrader.preprocessors import Execute

from ..notebook import KERNEL_STARTS

__all__ = ["RestartingExecute", "autograde_preprocessors"]


class RestartingExecute(Execute):
    """nbgrader's ``Execute``; a kernel that never answered is replaced by a fresh one."""

    _answered = False

    def start_new_kernel_client(self) -> Any:
        """nbclient's, noting that the kernel answered (the sync path ``preprocess`` takes).

        Returns:
            The kernel client, ready.
        """
        client = super().start_new_kernel_client()
        self._answered = True
        return client

    def preprocess(self, nb: Any, resources: Any = None, km: Any = None) -> tuple[Any, dict]:
        """Run every cell of ``nb`` (in place), starting the kernel again while it never answers.

        Args:
            nb: the notebook.
            resources: nbconvert's resources (the folder to run in).
            km: a kernel manager to use; given one, a failed start is not retried (the caller
                owns that kernel).

        Returns:
            The executed notebook and the resources.
        """
        for start in range(1, KERNEL_STARTS + 1):
            self._answered = False
            try:
                return super().preprocess(nb, resources, km)
            except Exception as err:
                if self._answered or km is not None or start == KERNEL_STARTS:
                    raise
                self.log.warning(
                    "The kernel did not answer (%s: %s); no cell has run, so a fresh one starts "
                    "(start %d of %d)",
                    type(err).__name__,
                    err,
                    start + 1,
                    KERNEL_STARTS,
                )
        raise AssertionError("unreachable")


def autograde_preprocessors(execute: type = RestartingExecute) -> list:
    """nbgrader's default ``Autograde.autograde_preprocessors`` with ``execute`` for its
    ``Execute``.

    Args:
        execute: the preprocessor that runs the notebook (a subclass of nbgrader's ``Execute``).

    Returns:
        The list to set as ``c.Autograde.autograde_preprocessors``.
    """
    from nbgrader.converters import Autograde

    defaults = Autograde.class_traits()["autograde_preprocessors"].default()
    return [execute if pp is Execute else pp for pp in defaults]
