"""Two modules per assignment, named like its stub in :mod:`coursepkg.stubs` and its notebook in
``solutions/``: ``exNN_x.py`` holds the configurations and the public checks (declared with
:func:`coursepkg.grading.framework.public_check`), ``exNN_x_mistakes.py`` its catalogue of known
mistakes (``BUGS``; ``<PREFIX>_ITEM`` and ``<PREFIX>_BUGS`` per item, the prefix being the bug
ids' own: ``sdpa.`` -> ``SDPA_BUGS``). A check module imports the framework, the reference and its
own catalogue, never another check module: what several share is in
:mod:`coursepkg.grading.framework` (a layer's pieces find an earlier check's catalogue through
the registry). DEVELOPING.md, at the repository root, says how to add a check and a mistake."""
