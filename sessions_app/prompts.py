"""Reads the prompt files: ``loop.json``, the system prompt, the mode files and the task texts."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from django.conf import settings

from sessions_app.hygiene.config import ContextConfig, context_config, deep_merge


def prompts_dir() -> Path:
    return Path(settings.CACHET_PROMPTS)


@cache
def _load_json(path: Path, mtime: float) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def loop_json() -> dict[str, Any]:
    """The whole of ``prompts/loop.json``."""
    path = prompts_dir() / "loop.json"
    return _load_json(path, path.stat().st_mtime)


def loop_settings() -> dict[str, Any]:
    loop: dict[str, Any] = loop_json()["loop"]
    return loop


def rules_config(override: dict[str, Any] | None = None) -> ContextConfig:
    """The typed ``context`` configuration, with ``override`` deep-merged over it."""
    context = loop_json()["context"]
    if override:
        context = deep_merge(context, override)
    return context_config(context)


def read_prompt(relative: str) -> str:
    return (prompts_dir() / relative).read_text(encoding="utf-8")


def mode_text(mode: str) -> str:
    return read_prompt(f"modes/{mode}.md").strip()


def compact_task() -> str:
    return read_prompt("tasks/compact.md").replace("{{transcript}}", "").strip()


def system_prompt() -> str:
    """The system prompt every session starts with: nothing session-specific in it (no workspace, model,
    mode, date, time or counter), so sessions with the same tool list share it byte for byte."""
    text = read_prompt("system.md").replace("{{context}}", read_prompt("blocks/context.md").strip())
    return text.strip() + "\n"
