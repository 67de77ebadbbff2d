"""The code the book's pages call to train, measure and draw: the chapters' ready-made runs
(:mod:`~coursepkg.chapters.recipes`, :mod:`~coursepkg.chapters.char_gpt`, ...), the run cache, the
small ``fit`` loop, the measurements and the figures.

This is not the reference Transformer: the model students read lives in the package root
(:mod:`coursepkg`), and nothing there imports from here.
"""
