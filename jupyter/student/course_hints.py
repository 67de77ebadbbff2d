"""Run in each notebook kernel started by `make lab` (see ipython_kernel_config.py).

After a kernel restart nothing the notebook defined exists any more, and a test cell run on its
own fails with a bare ``NameError``. This adds what to do to that message: run the setup cell
(for the checks and imports) or the cells above (for the student's own functions).
"""

from IPython import get_ipython

SETUP_NAMES = {"torch", "math", "nn", "F", "Tensor"}


def _explain(name: str) -> str:
    if name.startswith("check_") or name in SETUP_NAMES:
        return (
            f"`{name}` comes from the notebook's setup cell (the first code cell): run it "
            "first. After a kernel restart, run the cells above this one again (Run > Run All "
            "Above Selected Cell)."
        )
    return (
        f"if `{name}` is defined in a cell above, run that cell first. After a kernel restart, "
        "run the cells above this one again (Run > Run All Above Selected Cell)."
    )


def _name_error(shell, etype, value, tb, tb_offset=None):
    name = getattr(value, "name", None)
    if name:
        value = NameError(f"{value}: {_explain(name)}", name=name)
    shell.showtraceback((etype, value, tb), tb_offset=tb_offset)


shell = get_ipython()
if shell is not None:
    shell.set_custom_exc((NameError,), _name_error)
