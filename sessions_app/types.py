"""The shapes the store hands between modules."""

from __future__ import annotations

from typing import TypedDict


class StoredCall(TypedDict):
    """A tool call as a step stores it: the call's id, the tool's name and the arguments as generated."""

    id: str
    name: str
    arguments: str


class PendingBreak(TypedDict, total=False):
    """Something that happened since the last request which lets the next one share less of it."""

    cause: str
    turn: int
    generation_changed: bool
