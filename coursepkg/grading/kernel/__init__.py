"""The kernels that run students' notebooks when a class is graded.

* :mod:`.confine` -- confinement helpers (Landlock, a network namespace, a process ceiling, the
  environment a kernel may see), shared by the launcher, the fork server and the worker.
* :mod:`.sandbox` -- the sandbox kernel's launcher and kernelspec, and the guard of the checks.
* :mod:`.forkserver` -- kernels forked from a process that has imported torch.
"""
