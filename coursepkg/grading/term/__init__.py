"""The instructor's end of term, after ``coursepkg grade``: grade export for Canvas and
Gradescope (:mod:`.export`), the late-penalty policy (:mod:`.late`), regrade requests with
their audit trail (:mod:`.regrade`) and the similarity list of submissions (:mod:`.similarity`).

Every piece reads and writes nbgrader's own gradebook (SQLite or PostgreSQL) through nbgrader's
API; the command line is in :mod:`.commands`.
"""
