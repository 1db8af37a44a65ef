from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from chat.tools import TOOLS, ToolContext
from sessions_app.hygiene.config import ContextConfig, context_config
from tests.sandbox_kit import for_commands

LOOP_JSON = Path(__file__).resolve().parents[2] / "prompts" / "loop.json"


@pytest.fixture(scope="session")
def config() -> ContextConfig:
    with LOOP_JSON.open(encoding="utf-8") as handle:
        return context_config(json.load(handle)["context"])


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    return for_commands(folder.resolve())


@pytest.fixture
def make_ctx(ws: Path, config: ContextConfig) -> Callable[..., ToolContext]:
    def make(**overrides: Any) -> ToolContext:
        values: dict[str, Any] = {
            "root": ws,
            "config": config,
            "mode": "full",
            "tools": tuple(tool.name for tool in TOOLS),
            "allow_commands": True,
            "last_seen_sha": lambda path: None,
            "recall": lambda number: None,
        }
        values.update(overrides)
        return ToolContext(**values)

    return make


@pytest.fixture
def ctx(make_ctx: Callable[..., ToolContext]) -> ToolContext:
    return make_ctx()
