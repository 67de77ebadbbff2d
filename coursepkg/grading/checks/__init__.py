"""One module per assignment, named like its stub in :mod:`coursepkg.stubs` and its notebook in
``solutions/``: each holds the catalogue of known mistakes of its items and their public checks,
declared with :func:`coursepkg.grading.framework.public_check`. A later assignment may import an
earlier one's catalogue (the encoder layer's mistakes include the attention's), never the other
way round."""
