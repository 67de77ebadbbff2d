"""The instructor's end of term, after ``coursepkg grade``: grade export for Canvas and
Gradescope (:mod:`.export`), answering regrade requests (:mod:`.regrade`) and the similarity
list of submissions (:mod:`.similarity`); the command line is in :mod:`.commands`.

This folder is the top floor of :mod:`coursepkg.grading`: it imports the class grader
(:mod:`coursepkg.grading.classroom`) and the policies (:mod:`coursepkg.grading.policy`: the late
penalty, the regrade store, the dashboard's end-of-term sections), and nothing imports it back.
:mod:`.late` and the ``RegradeNote`` of :mod:`.regrade` are aliases of the policies, kept for
the courses whose ``nbgrader_config.py`` names them by their old dotted paths.

Every piece reads and writes nbgrader's own gradebook (SQLite or PostgreSQL) through nbgrader's
API.
"""
