"""The numbers and texts of the rules, from ``loop.json`` ``context``, as typed values."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CapLimits:
    max_lines: int
    max_chars: int
    head_lines: int
    head_chars: int
    tail_lines: int
    tail_chars: int


@dataclass(frozen=True)
class ContextConfig:
    id_digits: int
    sha_digits: int
    cap: CapLimits
    read_window: int
    recall_window: int
    compaction_rows: int
    compaction_auto_at: float
    dedupe_by_result: frozenset[str]
    texts: Mapping[str, str]
    errors: Mapping[str, str]
    unavailable: Mapping[str, str]
    note: Mapping[str, str]
    tools: Mapping[str, Any]  # the tools' schemas as loop.json declares them; read by chat.tools.schemas

    def text(self, key: str, **values: object) -> str:
        return self.texts[key].format(**values)

    def error(self, key: str, **values: object) -> str:
        return self.errors[key].format(**values)


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``base`` with ``override`` merged in, key by key, recursively."""
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def context_config(context: Mapping[str, Any]) -> ContextConfig:
    """Build the typed configuration from the ``context`` object of ``loop.json``."""
    cap = context["cap"]
    return ContextConfig(
        id_digits=int(context["ids"]["digits"]),
        sha_digits=int(context["sha_digits"]),
        cap=CapLimits(
            max_lines=int(cap["max_lines"]),
            max_chars=int(cap["max_chars"]),
            head_lines=int(cap["head_lines"]),
            head_chars=int(cap["head_chars"]),
            tail_lines=int(cap["tail_lines"]),
            tail_chars=int(cap["tail_chars"]),
        ),
        read_window=int(context["read"]["window"]),
        recall_window=int(context["recall"]["window"]),
        compaction_rows=int(context["compaction"]["rows"]),
        compaction_auto_at=float(context["compaction"]["auto_at"]),
        dedupe_by_result=frozenset(context["dedupe"]["by_result"]),
        texts=dict(context["texts"]),
        errors=dict(context["errors"]),
        unavailable=dict(context["unavailable"]),
        note=dict(context["note"]),
        tools=dict(context["tools"]),
    )
