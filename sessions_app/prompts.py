"""Reads the prompt files: ``loop.json``, the system prompt, the mode files and the task texts."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
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


@dataclass(frozen=True)
class LoopSettings:
    """The reply loop's numbers and texts, from ``loop.json`` ``loop``."""

    max_steps: int
    step_limit_text: str
    edit_max_bytes: int
    run_timeout: int
    run_max_timeout: int
    grep_timeout: float
    grep_max_bytes: int
    run_memory_bytes: int
    run_max_processes: int
    run_file_max_bytes: int
    run_output_max_bytes: int
    document_max_bytes: int
    document_max_pages: int
    document_max_chars: int
    document_memory_bytes: int
    document_timeout: float
    image_max_bytes: int
    image_max_pixels: int
    image_max_side: int
    image_sent_max_bytes: int
    image_tokens_estimate: int
    image_format_text: str
    image_unreadable_text: str
    image_pixels_text: str
    image_bytes_text: str
    images_refused_text: str
    answer_room_tokens: int
    bytes_per_token_before_usage: float
    too_large_text: str
    uncompactable_text: str
    switch_too_small_text: str


_FIELD_TYPES: dict[str, type[int | float | str]] = {"int": int, "float": float, "str": str}


def loop_settings_of(loop: Mapping[str, Any]) -> LoopSettings:
    """:class:`LoopSettings` from a ``loop`` object; a key it lacks is a ``KeyError`` naming it."""
    values: dict[str, Any] = {
        field.name: _FIELD_TYPES[str(field.type)](loop[field.name]) for field in fields(LoopSettings)
    }
    return LoopSettings(**values)


@cache
def _loop_settings(path: Path, mtime: float) -> LoopSettings:
    return loop_settings_of(_load_json(path, mtime)["loop"])


def loop_settings() -> LoopSettings:
    """The loop's settings, read once per version of ``loop.json``."""
    path = prompts_dir() / "loop.json"
    return _loop_settings(path, path.stat().st_mtime)


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


def continue_words() -> str:
    """The message a person sends with Continue under a reply that was cut off."""
    return read_prompt("tasks/continue.md").strip()


def title_task() -> str:
    """The message that asks for a session's title, after the conversation as the next turn would send it."""
    return read_prompt("tasks/title.md").strip()


def system_prompt() -> str:
    """The system prompt every session starts with: nothing session-specific in it (no workspace, model,
    mode, date, time or counter), so sessions with the same tool list share it byte for byte."""
    text = read_prompt("system.md").replace("{{context}}", read_prompt("blocks/context.md").strip())
    return text.strip() + "\n"
