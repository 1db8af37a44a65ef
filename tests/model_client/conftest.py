from __future__ import annotations

from collections.abc import Iterator

import pytest

from chat.testing.scripted_server import ScriptedServer


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "llama: runs a real llama.cpp server (xllamacpp) on a generated model")


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as running:
        yield running
