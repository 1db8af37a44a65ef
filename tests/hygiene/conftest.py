from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sessions_app.hygiene import ContextConfig, context_config, deep_merge

LOOP_JSON = Path(__file__).resolve().parents[2] / "prompts" / "loop.json"


def load_context() -> dict[str, Any]:
    with LOOP_JSON.open(encoding="utf-8") as handle:
        context: dict[str, Any] = json.load(handle)["context"]
    return context


@pytest.fixture(scope="session")
def config() -> ContextConfig:
    return context_config(load_context())


@pytest.fixture(scope="session")
def make_config() -> Callable[..., ContextConfig]:
    context = load_context()

    def make(**overrides: Any) -> ContextConfig:
        return context_config(deep_merge(context, overrides))

    return make
