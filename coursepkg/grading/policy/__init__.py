"""The course's grading policies, which ``coursepkg grade`` applies and the instructor's
end-of-term commands change: the late penalty (:mod:`.late`), the regrade requests' store and
their re-application after a rerun (:mod:`.regrade`), and the dashboard's end-of-term sections
(:mod:`.pages`).

The folders of :mod:`coursepkg.grading` import one way: ``framework`` and ``checks`` at the
bottom, then ``kernel`` and this package, then ``classroom`` (``coursepkg grade``), then
``term`` (``coursepkg export``, ``regrade``, ``similarity``) on top. Nothing here imports
``classroom`` or ``term``.
"""
