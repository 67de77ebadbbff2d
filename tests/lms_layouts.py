"""The column layouts the learning platforms document for grade CSVs, kept here as fixtures.

Only the header rows are kept (column names are the platforms' own; the student rows of the
sources are left out).

* Canvas: the gradebook CSV that Canvas's "Export" writes and its "Import" reads back
  (Canvas Instructor Guide, "How do I import grades in the Gradebook?"; the Ohio State guide
  to the same import names the required columns: Student Name or ID or SIS User ID, SIS Login
  ID, Section, then one column per assignment,
  https://teaching.resources.osu.edu/toolsets/carmencanvas/guides/calculating-final-grades/
  import-csv-file-carmen-grades).
  The header is copied from a real export kept by gradelib's tests
  (github.com/eldridgejm/gradelib, tests/examples/canvas.csv): identity columns, assignment
  columns, then Canvas's read-only totals (which an import ignores); the third row is
  ``Points Possible``.
* Gradescope: the course's "Download Grades" CSV, whose identity columns are also the roster's
  (Gradescope Help, "Adding Students and Staff",
  https://guides.gradescope.com/hc/en-us/articles/21926598776333); header copied from a real
  export kept by gradelib's tests (tests/examples/gradescope.csv, first two assignments, less
  its ``section_name`` column, which only a course linked with Canvas has): First Name, Last
  Name, SID, Email, then per assignment its score, ``- Max Points``, ``- Submission Time`` and
  ``- Lateness (H:M:S)``.
"""

CANVAS_EXPORT = (
    "Student,ID,SIS User ID,SIS Login ID,Section,Lab 01 (150834),Midterm Exam (157892),"
    "Final Exam (186585),Assignments Current Points,Assignments Final Points,"
    "Assignments Current Score,Assignments Unposted Current Score,Assignments Final Score,"
    "Assignments Unposted Final Score,Current Points,Final Points,Current Score,"
    "Unposted Current Score,Final Score,Unposted Final Score\n"
    ",,,,,Manual Posting,Manual Posting,Manual Posting,,,,,,,,,,,,\n"
    "    Points Possible,,,,,10.00,24.00,30.00,(read only),(read only),(read only),(read only),"
    "(read only),(read only),(read only),(read only),(read only),(read only),(read only),"
    "(read only)\n"
)
#: Canvas's identity columns, and where the assignment columns begin.
CANVAS_IDENTITY_COLUMNS = 5

GRADESCOPE_EXPORT = (
    "First Name,Last Name,SID,Email,Lab 01,Lab 01 - Max Points,Lab 01 - Submission Time,"
    "Lab 01 - Lateness (H:M:S),Homework 01,Homework 01 - Max Points,"
    "Homework 01 - Submission Time,Homework 01 - Lateness (H:M:S),Total Lateness (H:M:S)\n"
)
GRADESCOPE_IDENTITY_COLUMNS = 4
