"""nbgrader configuration for the course.

Run nbgrader from the repository root with .venv/bin first on PATH, for example
`PATH=$PWD/.venv/bin:$PATH nbgrader generate_assignment ex01_attention`.

solutions/<assignment id>/  instructor notebooks (nbgrader's "source"): solutions and hidden tests
exercises/<assignment id>/  student notebooks (nbgrader's "release"), generated from solutions/

With an exchange (the folder that `nbgrader release_assignment`, `collect`, `release_feedback` and
the students' Assignment List share), set COURSE_EXCHANGE to it; the students' side of these
settings is jupyter/student/nbgrader_config.py.
"""

import os

c = get_config()  # noqa: F821  (injected by traitlets when it loads this file)

c.CourseDirectory.course_id = "transformers"
c.CourseDirectory.root = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "exercises"
if os.environ.get("COURSE_EXCHANGE"):
    c.Exchange.root = os.environ["COURSE_EXCHANGE"]

# Feedback shows each student their graded notebook. Keep the hidden tests' code out of it (their
# score and the check's message, which says what is wrong, still show), so the hidden shapes stay
# hidden from the next cohort too: nbgrader's ClearHiddenTests clears the source; the course's
# HideHiddenTestOutputs does that and clears the outputs first (an error keeps only its name and
# message, no traceback quoting the hidden call).
# The feedback also explains a late penalty and lists the student's regrade requests with their
# answers, with a link to ask for one (coursepkg.grading.policy; docs/instructors.md, end of term).
c.GenerateFeedback.preprocessors = [
    "coursepkg.grading.policy.late.ReassessPenalty",  # from the points now (hand scores too)
    "nbgrader.preprocessors.GetGrades",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
    "coursepkg.grading.classroom.preprocessors.HideHiddenTestOutputs",  # ClearHiddenTests, and more
    "coursepkg.grading.policy.late.LateNote",
    "coursepkg.grading.policy.regrade.RegradeNote",
]
# The name regrade answers are signed with in the feedback (`coursepkg regrade answer --by`'s
# default; without it, the login of whoever runs the command, "root" on some servers).
# c.RegradeNote.answered_by = "Dr. Turing"

# The late policy (applied by `coursepkg grade` and `nbgrader autograde`); uncomment and adapt.
# Due dates: ISO 8601 with a zone ("2026-12-01 17:00 Europe/Berlin", "... UTC" or "...+01:00").
# c.AssignLatePenalties.plugin_class = "coursepkg.grading.policy.late.LatePolicy"
# c.LatePolicy.due_dates = {"ex01_attention": "2026-11-20 17:00:00 UTC"}
# c.LatePolicy.grace_minutes = 15
# c.LatePolicy.percent_per_day = 10
# c.LatePolicy.max_percent = 50
# Extensions are often accommodations, which are private: not here (this file is tracked) but in
# extensions.csv beside it, ignored by git and never in the student kit, written by
# `coursepkg extension grant bob 24 --assignment ex01_attention` (docs/instructors.md).

# Autograding: the longest one cell may run (the checks take seconds; a stuck notebook stops here).
c.ExecutePreprocessor.timeout = 120
# A kernel that dies or stays silent before it answers (another process took its port; a very busy
# machine) is started again, up to 3 starts in all: no cell has run, and nbgrader would give up
# on the whole submission, to be autograded again by hand (coursepkg.grading.kernel.execute).
from coursepkg.grading.kernel.execute import autograde_preprocessors  # noqa: E402

c.Autograde.autograde_preprocessors = autograde_preprocessors()
# The longest a kernel may take to start (Validate and autograde start one each time): nbgrader's
# 60 s is too short on a busy course server, where a start that fails is an error to the student.
c.ExecutePreprocessor.startup_timeout = 300

# Feedback is made again each time, so scores given by hand in the formgrader after a first
# `generate_feedback` reach the students (nbgrader would otherwise skip the existing feedback).
c.GenerateFeedback.force = True

# release_feedback skips, with a warning, students who did not submit through the exchange
# (zip_collect) instead of stopping at the first of them.
c.ExchangeFactory.release_feedback = "coursepkg.grading.release.ReleaseFeedback"

# Feedback typesets its math without a network (MathJax inlined instead of nbconvert's CDN).
c.GenerateFeedback.exporter_class = "coursepkg.grading.release.FeedbackExporter"

# `coursepkg grade`: each student's kernel's limits (its options --memory-mb ... win over these).
# Memory counts files in /dev/shm and the page cache too where the grading host has a memory
# cgroup; the working and scratch folders are a private tmpfs of disk_mb, gone with the kernel.
c.GradeLimits.memory_mb = 4096  # MiB per kernel (ex09 trains in well under 1 GiB)
c.GradeLimits.disk_mb = 1024  # MiB of files per kernel, and the largest single file
c.GradeLimits.shm_mb = 256  # MiB of its private /dev/shm
c.GradeLimits.notebook_timeout = 900  # seconds per notebook in all
# c.GradeLimits.cell_timeout = 120  # seconds per cell (default: what the notebook asks for)
