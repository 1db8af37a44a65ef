"""What the reply loop yields as it goes: one typed event for each thing that happened.

Stored things (a turn, a step, a result, a request) are handed over as they were stored; deltas carry the
text as it streamed. ``manage.py ask`` prints them; the web side publishes them to the session's tabs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sessions_app.models import ChatSession, Generation, ModelRequest, Result, Step, TakenBackBy, Turn
from sessions_app.selectors.totals import RequestTotals


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
class BarPlace:
    """Where a finished request's bar stands on its session's chart: its number (from 1) and the time to first
    token of the newest bar before it that has one (where its line comes from)."""

    index: int
    previous_ttft: float | None


@dataclass(frozen=True)
class RequestFinished:
    """A request ended, with the server's figures (or its error); ``place`` is its bar's on the chart and
    ``totals`` the session's requests added up, this one included."""

    request: ModelRequest
    place: BarPlace
    totals: RequestTotals


@dataclass(frozen=True)
class CacheChecked:
    """A finished request's cache check is stored: what it should have found cached and, where the server
    reused less, why (it runs beside the reply, so it comes after the request's other events)."""

    request: ModelRequest
    place: BarPlace


@dataclass(frozen=True)
class StepStored:
    """A step of the reply is stored as the model sent it; ``revision`` is the session's once it was (the
    event may be yielded later, after the step's results are stored too)."""

    step: Step
    revision: int


@dataclass(frozen=True)
class ResultStored:
    """A tool call's result is stored with its id; ``revision`` is the session's once it was."""

    result: Result
    revision: int


@dataclass(frozen=True)
class TurnEnded:
    """The reply ended: done, failed or interrupted (the turn's status and error say which)."""

    turn: Turn


@dataclass(frozen=True)
class TurnsTakenBack:
    """Undo, rewind, regenerate or an edit took these turns back, newest first; ``conflicts`` are the files
    that could not be restored; ``compactions`` the generations taken back with the turns."""

    turns: tuple[Turn, ...]
    restored: bool
    edits: int
    conflicts: tuple[str, ...] = ()
    compactions: tuple[int, ...] = ()

    @property
    def said(self) -> bool:
        """Whether the person asked for the turns to go (undo, rewind), not for something new in their place."""
        return bool(self.turns) and self.turns[0].taken_back_by in (TakenBackBy.UNDO, TakenBackBy.REWIND)


@dataclass(frozen=True)
class BranchFlipped:
    """A flip made another branch the live one: the turns taken back (newest first), the turns made live
    again (first first), and the compactions (generation numbers) taken back and made live with them."""

    taken_back: tuple[Turn, ...]
    made_live: tuple[Turn, ...]
    compactions_taken_back: tuple[int, ...] = ()
    compactions_made_live: tuple[int, ...] = ()


@dataclass(frozen=True)
class Compacted:
    """A compaction started a new generation from the summary."""

    generation: Generation


@dataclass(frozen=True)
class Titled:
    """The model titled the session after its first reply (the first words typed were its title until then)."""

    session: ChatSession


@dataclass(frozen=True)
class Notice:
    """Something the person should read that is not part of the transcript."""

    text: str
    level: str = "info"
    lines: tuple[str, ...] = field(default_factory=tuple)


def turns_named(labels: Sequence[int]) -> str:
    """``turn 2``, ``turns 2 and 3``, ``turns 2, 3 and 4``."""
    words = [str(label) for label in labels]
    if len(words) == 1:
        return f"turn {words[0]}"
    return f"turns {', '.join(words[:-1])} and {words[-1]}"


def taken_back_text(event: TurnsTakenBack, labels: Sequence[int]) -> str:
    """What a person is told of turns taken back, named by ``labels`` (oldest first): "Took back turn 2; the
    files it changed were restored." An edit or a regenerate says only what it restored, if anything."""
    restored = event.restored and event.edits > 0
    named = turns_named(labels)
    they = "it" if len(labels) == 1 else "they"
    ending = " except:" if event.conflicts else "."
    if event.said:
        if restored:
            return f"Took back {named}; the files {they} changed were restored{ending}"
        return f"Took back {named}."
    if restored:
        return f"The files {named} changed were restored{ending}"
    return ""


ReplyEvent = (
    TurnStarted
    | RequestStarted
    | TextDelta
    | ReasoningDelta
    | ToolCalled
    | RequestFinished
    | CacheChecked
    | StepStored
    | ResultStored
    | TurnEnded
    | TurnsTakenBack
    | BranchFlipped
    | Compacted
    | Titled
    | Notice
)
