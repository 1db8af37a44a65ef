"""What the store refuses, with a message a person can read."""

from __future__ import annotations

import psycopg
from django.db import InterfaceError, OperationalError

DATABASE_UNAVAILABLE = "The database is unavailable; your message is kept."


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


class NoLiveTurnFrom(StoreError):
    def __init__(self, number: int) -> None:
        super().__init__(f"No live turn is left from turn {number} on; nothing was taken back.")


class NoSuchTurn(StoreError):
    def __init__(self, number: int) -> None:
        super().__init__(f"This session has no turn {number}.")


class AlreadyLive(StoreError):
    def __init__(self) -> None:
        super().__init__("That turn is already on the live branch.")


class EmptyMessage(StoreError):
    def __init__(self) -> None:
        super().__init__("Write a message first.")


class EmptySummary(StoreError):
    def __init__(self) -> None:
        super().__init__("The model wrote no summary, so nothing was compacted.")


class NothingToCompact(StoreError):
    def __init__(self) -> None:
        super().__init__("There is nothing to compact yet.")


class WorkspaceRefused(StoreError):
    """The session's owner may no longer use its workspace, or its folder is one Cachet may not use: the
    session is read-only."""


class NotAMember(WorkspaceRefused):
    def __init__(self, workspace: str, *, during_reply: bool = False) -> None:
        then = "the reply ended before its next tool call, and " if during_reply else ""
        super().__init__(f"You are no longer a member of the workspace “{workspace}”: {then}this session is read-only.")


class FolderRefused(WorkspaceRefused):
    def __init__(self, workspace: str, reason: str) -> None:
        super().__init__(
            f"The workspace “{workspace}” is on a folder Cachet may not use ({reason}): this session is read-only "
            "until staff change the folder in the admin."
        )


class EndpointRefused(StoreError):
    """The session's owner may no longer use its model endpoint: its model is not asked until they choose another."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(
            f"You may no longer use the model endpoint “{endpoint}” (staff decide who may): choose another model "
            "in the model menu, then send again."
        )


def is_database_unavailable(error: BaseException) -> bool:
    """Whether ``error`` says the database cannot be reached (stopped, restarting, the connection lost)."""
    return isinstance(error, OperationalError | InterfaceError | psycopg.OperationalError | psycopg.InterfaceError)


def person_message(error: BaseException) -> str:
    """The one line a person sees for ``error``: a store refusal as it is, the database being away as
    :data:`DATABASE_UNAVAILABLE`, anything else by its type only (no path, no host, no detail)."""
    if isinstance(error, StoreError):
        return str(error)
    if is_database_unavailable(error):
        return DATABASE_UNAVAILABLE
    return f"Cachet failed: {type(error).__name__}"


class PrivateFolderRefused(StoreError):
    def __init__(self, folder: str, reason: str) -> None:
        super().__init__(
            f"Cachet may not make your own workspace at {folder} ({reason}); ask staff to move the workspace "
            "named there, or choose a shared workspace."
        )
