"""nbgrader settings on the students' side (`make lab`): which course, and where its exchange is.

The Assignment List fetches and submits through the exchange folder COURSE_EXCHANGE (a folder
the instructor and the students share, e.g. /srv/nbgrader/exchange on a course server). Without
it, `make lab` works on the notebooks in exercises/ and offers Validate only.
"""

import os

c = get_config()  # noqa: F821  (injected by traitlets when it loads this file)

c.CourseDirectory.course_id = "transformers"
if os.environ.get("COURSE_EXCHANGE"):
    c.Exchange.root = os.environ["COURSE_EXCHANGE"]

# Fetch into the folder JupyterLab shows. nbgrader's Assignment List reads this file from
# JupyterLab's root folder, but would fetch into the folder JupyterLab was started from (the
# repository under `make lab`) if assignment_dir kept its default ".".
c.Exchange.assignment_dir = os.getcwd()

# Validate starts a kernel each time; nbgrader's 60 s for it to start is too short on a busy
# machine (a course server at a deadline), where a late start would read as a failed validation.
c.ExecutePreprocessor.startup_timeout = 300
