"""The actions a tab or a terminal asks of a session (send, regenerate, edit, flip, undo, rewind, compact), as
a queued job's arguments carry them: queued by web processes and ``ask``, run by workers."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from chat.agent.events import ReplyEvent
    from chat.agent.loop import ReplyLoop

QUEUE = "replies"
CHECKS_QUEUE = "checks"


def session_key(session_id: int) -> str:
    """The queue's lock (and queueing lock) of a session's jobs: one runs at a time, one waits."""
    return f"cachet-session-{session_id}"


class Action:
    """Something a job does with the session's reply loop."""

    label: ClassVar[str] = "Working…"
    kind: ClassVar[str] = ""

    def events(self, loop: ReplyLoop) -> AsyncGenerator[ReplyEvent, None]:
        raise NotImplementedError

    def payload(self) -> dict[str, Any]:
        """The action as the queued job's arguments carry it (JSON)."""
        return {"kind": self.kind, **dataclasses.asdict(self)}  # type: ignore[call-overload]


@dataclass(frozen=True)
class Send(Action):
    words: str
    label: ClassVar[str] = "Replying…"
    kind: ClassVar[str] = "send"

    def events(self, loop: ReplyLoop) -> AsyncGenerator[ReplyEvent, None]:
        return loop.send(self.words)


@dataclass(frozen=True)
class Regenerate(Action):
    restore: bool = False
    label: ClassVar[str] = "Replying again…"
    kind: ClassVar[str] = "regenerate"

    def events(self, loop: ReplyLoop) -> AsyncGenerator[ReplyEvent, None]:
        return loop.regenerate(restore=self.restore)


@dataclass(frozen=True)
class Edit(Action):
    turn: int
    words: str
    restore: bool = False
    label: ClassVar[str] = "Replying…"
    kind: ClassVar[str] = "edit"

    def events(self, loop: ReplyLoop) -> AsyncGenerator[ReplyEvent, None]:
        return loop.edit(self.turn, self.words, restore=self.restore)


@dataclass(frozen=True)
class Flip(Action):
    turn: int
    label: ClassVar[str] = "Switching branch…"
    kind: ClassVar[str] = "flip"

    def events(self, loop: ReplyLoop) -> AsyncGenerator[ReplyEvent, None]:
        return loop.flip(self.turn)


@dataclass(frozen=True)
class Undo(Action):
    restore: bool = False
    label: ClassVar[str] = "Undoing…"
    kind: ClassVar[str] = "undo"

    def events(self, loop: ReplyLoop) -> AsyncGenerator[ReplyEvent, None]:
        return loop.undo(restore=self.restore)


@dataclass(frozen=True)
class Rewind(Action):
    turn: int
    restore: bool = False
    label: ClassVar[str] = "Rewinding…"
    kind: ClassVar[str] = "rewind"

    def events(self, loop: ReplyLoop) -> AsyncGenerator[ReplyEvent, None]:
        return loop.rewind(self.turn, restore=self.restore)


@dataclass(frozen=True)
class Compact(Action):
    label: ClassVar[str] = "Compacting…"
    kind: ClassVar[str] = "compact"

    def events(self, loop: ReplyLoop) -> AsyncGenerator[ReplyEvent, None]:
        return loop.compact()


ACTIONS: dict[str, type[Action]] = {
    action.kind: action for action in (Send, Regenerate, Edit, Flip, Undo, Rewind, Compact)
}


def action_from(payload: dict[str, Any]) -> Action:
    """The action a queued job's arguments carry (:meth:`Action.payload`)."""
    fields = dict(payload)
    return ACTIONS[str(fields.pop("kind"))](**fields)
