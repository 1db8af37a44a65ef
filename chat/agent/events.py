"""What the reply loop yields as it goes: one typed event for each thing that happened.

Stored things (a turn, a step, a result, a request) are handed over as they were stored; deltas carry the
text as it streamed. ``manage.py ask`` prints them; the web side publishes them to the session's tabs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sessions_app.models import Generation, ModelRequest, Result, Step, Turn


@dataclass(frozen=True)
class TurnStarted:
    """A new open turn: the person's message is stored (``again``: a regenerate asked it once more)."""

    turn: Turn
    again: bool = False


@dataclass(frozen=True)
class RequestStarted:
    """A request is recorded and about to be sent."""

    request: ModelRequest


@dataclass(frozen=True)
class TextDelta:
    """Text the model is writing in step ``step`` of turn ``turn_number`` (0: no turn, a summary)."""

    turn_number: int
    step: int
    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    """Reasoning the model is writing in step ``step`` of turn ``turn_number``."""

    turn_number: int
    step: int
    text: str


@dataclass(frozen=True)
class ToolCalled:
    """The model began calling ``name`` in step ``step``."""

    turn_number: int
    step: int
    name: str


@dataclass(frozen=True)
class RequestFinished:
    """A request ended, with the server's figures (or its error)."""

    request: ModelRequest


@dataclass(frozen=True)
class StepStored:
    """A step of the reply is stored as the model sent it; its calls are about to run."""

    step: Step


@dataclass(frozen=True)
class ResultStored:
    """A tool call's result is stored with its id."""

    result: Result


@dataclass(frozen=True)
class TurnEnded:
    """The reply ended: done, failed or interrupted (the turn's status and error say which)."""

    turn: Turn


@dataclass(frozen=True)
class TurnsTakenBack:
    """Undo, rewind or regenerate took these turns back, newest first; ``conflicts`` are the files that
    could not be restored."""

    turns: tuple[Turn, ...]
    restored: bool
    edits: int
    conflicts: tuple[str, ...] = ()


@dataclass(frozen=True)
class Compacted:
    """A compaction started a new generation from the summary."""

    generation: Generation


@dataclass(frozen=True)
class Notice:
    """Something the person should read that is not part of the transcript."""

    text: str
    level: str = "info"
    lines: tuple[str, ...] = field(default_factory=tuple)


ReplyEvent = (
    TurnStarted
    | RequestStarted
    | TextDelta
    | ReasoningDelta
    | ToolCalled
    | RequestFinished
    | StepStored
    | ResultStored
    | TurnEnded
    | TurnsTakenBack
    | Compacted
    | Notice
)
