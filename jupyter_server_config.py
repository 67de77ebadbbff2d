"""Jupyter server settings for an instructor who starts `jupyter lab` in the course root.

nbgrader's formgrader loads MathJax 2 from a CDN; without a network its page stops and no score
can be saved. `coursepkg.grading.formgrader_offline` points it at the MathJax 2 that
jupyter-server-mathjax serves from the same server.
"""

c = get_config()  # noqa: F821  (injected by traitlets when it loads this file)

c.ServerApp.jpserver_extensions.update(
    {"jupyter_server_mathjax": True, "coursepkg.grading.formgrader_offline": True}
)
