"""What a terminal following a job (``manage.py ask``) prints of each event of the reply loop: lines the worker
running the job sends to the terminal's channel, in order, as they happen."""

from __future__ import annotations

from typing import TypedDict

from chat.agent.events import (
    Compacted,
    Notice,
    ReplyEvent,
    ResultStored,
    TextDelta,
    ToolCalled,
    TurnEnded,
    TurnsTakenBack,
    taken_back_text,
)
from sessions_app.text import storable


class EchoLine(TypedDict):
    """A piece of the terminal's output: on standard error where ``err``, followed by ``ending``."""

    err: bool
    text: str
    ending: str


def _out(text: str, ending: str = "\n") -> EchoLine:
    return {"err": False, "text": text, "ending": ending}


def _err(text: str) -> EchoLine:
    return {"err": True, "text": text, "ending": "\n"}


def echo_lines(event: ReplyEvent) -> list[EchoLine]:
    """What the terminal prints of ``event`` (nothing for most of them)."""
    match event:
        case TextDelta(text=text) if event.turn_number:
            return [_out(storable(text), "")]
        case ToolCalled(name=name) if event.turn_number:
            return [_out(f"\n[{name}]", "")]
        case ResultStored(result=result):
            first = result.inserted_text.splitlines()[0] if result.inserted_text else ""
            return [_out(f"\n  {first}")]
        case TurnsTakenBack(turns=turns, conflicts=conflicts) if turns:
            text = taken_back_text(event, [turn.position for turn in reversed(turns)])
            return ([_out(text)] if text else []) + [_out(f"Not restored: {conflict}") for conflict in conflicts]
        case Compacted():
            return [_out("Compacted: the next turn starts from the summary.")]
        case Notice(text=text, lines=lines):
            return [_err(text)] + [_err(f"  {line}") for line in lines]
        case TurnEnded():
            return [_out("")]
    return []
