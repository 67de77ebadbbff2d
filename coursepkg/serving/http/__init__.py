"""``coursepkg serve``: a trained model behind an OpenAI-compatible HTTP API, with a chat page.

- :mod:`.engine`: the checkpoint loaded with its tokenizer (:func:`load_served_model`) and the
  continuous-batching scheduler run online, one thread owning the model
  (:class:`OnlineBatcher`).
- :mod:`.protocol`: OpenAI's request bodies and error object.
- :mod:`.app`: the FastAPI application (:func:`create_app`): ``/v1/chat/completions``,
  ``/v1/completions``, ``/v1/models``, ``/health`` and the chat page at ``/``.
- :mod:`.launch`: the server started as a child process (:class:`~.launch.ServerProcess`).
- :mod:`.load`: the server measured through the ``openai`` client (greedy answers against
  offline generation; all at once against one at a time).

``docs/serving.md`` shows the command, the ``openai`` client against it and the errors.
"""

from .app import create_app
from .engine import Busy, OnlineBatcher, ServedModel, Ticket, load_served_model
from .protocol import ApiError

__all__ = [
    "ApiError",
    "Busy",
    "OnlineBatcher",
    "ServedModel",
    "Ticket",
    "create_app",
    "load_served_model",
]
