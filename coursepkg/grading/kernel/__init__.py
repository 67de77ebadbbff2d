"""The kernels that run students' notebooks when a class is graded.

* :mod:`.confine` -- confinement helpers (Landlock, a network namespace, a process ceiling, a
  memory cgroup, the environment a kernel may see), shared by the launcher, the fork server and
  the worker.
* :mod:`.mounts` -- private, size-bounded ``/dev/shm``, working and scratch folders (a mount
  namespace of the kernel's own).
* :mod:`.sandbox` -- the sandbox kernel's launcher and kernelspec.
* :mod:`.guard` -- the guard of the checks, installed by the sandbox kernel before the first cell.
* :mod:`.execute` -- nbgrader's ``Execute``, starting a kernel again when one never answered.
* :mod:`.forkserver` -- kernels forked from a process that has imported torch; :mod:`.forked`,
  the kernel manager and nbgrader ``Execute`` that ask it for them.
* :mod:`.replies` -- a kernel client that waits for replies without losing a wake-up.
"""

import sys

__all__ = ["skip_iri_grammar"]


def skip_iri_grammar() -> None:
    """Make ``jsonschema`` skip its IRI format checks in this process.

    Imported under ``nbformat`` and ``nbgrader``, ``jsonschema`` builds a parser for IRIs when
    the optional ``rfc3987-syntax`` package is installed (it is, for JupyterLab's event
    schemas): about 1.2 s of CPU in every process that imports it. No schema the grader
    validates (notebooks, nbgrader's) uses the ``iri`` formats, so the grader's own processes
    (the client, each Dask worker, each fork server and sandbox kernel) start without it;
    in them ``import rfc3987_syntax`` raises ``ImportError``. Has no effect once ``jsonschema``
    is imported.
    """
    if "jsonschema" not in sys.modules:
        sys.modules.setdefault("rfc3987_syntax", None)


skip_iri_grammar()
