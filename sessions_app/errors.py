"""What the store refuses, with a message a person can read."""

from __future__ import annotations


class StoreError(Exception):
    """A request to the store that cannot be carried out; ``str()`` says why."""


class ReplyInProgress(StoreError):
    def __init__(self) -> None:
        super().__init__("A reply is already running in this session; wait for it or stop it first.")


class NothingToTakeBack(StoreError):
    def __init__(self) -> None:
        super().__init__("There is no turn to take back.")


class TurnNotFound(StoreError):
    def __init__(self, number: int) -> None:
        super().__init__(f"This session has no live turn {number}.")


class EmptySummary(StoreError):
    def __init__(self) -> None:
        super().__init__("The model wrote no summary, so nothing was compacted.")


class NothingToCompact(StoreError):
    def __init__(self) -> None:
        super().__init__("There is nothing to compact yet.")


def person_message(error: BaseException) -> str:
    """The one line a person is shown for ``error``: what the store says, else what failed, never a path."""
    from django.db import DatabaseError

    if isinstance(error, StoreError):
        return str(error)
    if isinstance(error, DatabaseError):
        return "The database is unavailable; your message is kept."
    return f"Cachet failed: {type(error).__name__}."
