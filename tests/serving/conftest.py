"""The HTTP tests' fixtures: one chat checkpoint and one ``coursepkg serve`` for the session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from served import CACHE, MAX_BATCH, chat_checkpoint, start_server

from coursepkg.serving.http.launch import ServerProcess


@pytest.fixture(scope="session")
def chat_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chat_checkpoint(tmp_path_factory.mktemp("tiny-chat"))


@pytest.fixture(scope="session")
def server(chat_model_dir: Path) -> Iterator[ServerProcess]:
    running = start_server(
        chat_model_dir, "--cache-tokens", str(CACHE), "--max-batch", str(MAX_BATCH)
    )
    yield running
    running.stop()
