"""nbgrader configuration for the course.

Run nbgrader from the repository root with .venv/bin first on PATH, for example
`PATH=$PWD/.venv/bin:$PATH nbgrader generate_assignment ex01_attention`.

solutions/<assignment id>/  instructor notebooks (nbgrader's "source"): solutions and hidden tests
exercises/<assignment id>/  student notebooks (nbgrader's "release"), generated from solutions/
"""

import os

c = get_config()  # noqa: F821  (injected by traitlets when it loads this file)

c.CourseDirectory.course_id = "transformers"
c.CourseDirectory.root = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "exercises"

# Feedback shows each student their graded notebook. Keep the hidden tests' code out of it (their
# score and the check's message, which says what is wrong, still show), so the hidden shapes stay
# hidden from the next cohort too.
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
    "nbgrader.preprocessors.ClearHiddenTests",
]

# Autograding: the longest one cell may run (the checks take seconds; a stuck notebook stops here).
c.ExecutePreprocessor.timeout = 120
