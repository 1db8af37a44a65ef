"""What a terminal following a job (``manage.py ask``) prints of each typed event (``chat.wire``) it hears: the
streamed text as it comes, a line per tool call and result, what the asker is told (on standard output where it
is information, on standard error where it is a warning or an error), nothing for the rest."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

from sessions_app.text import storable


class EchoLine(TypedDict):
    """A piece of the terminal's output: on standard error where ``err``, followed by ``ending``."""

    err: bool
    text: str
    ending: str


def _out(text: str, ending: str = "\n") -> EchoLine:
    return {"err": False, "text": text, "ending": ending}


def echo_lines(event: Mapping[str, Any], *, result_line: str = "") -> list[EchoLine]:
    """What the terminal prints of ``event`` (a checked event); ``result_line``: the first line of the result a
    ``result_stored`` event names, read by the caller."""
    match event["event"]:
        case "text":
            return [_out(storable(event["text"]), "")]
        case "tool_called":
            return [_out(f"\n[{event['name']}]", "")]
        case "result_stored":
            return [_out(f"\n  {result_line}")]
        case "notice":
            err = event["level"] != "info"
            return [
                {"err": err, "text": text, "ending": "\n"}
                for text in [event["text"], *(f"  {line}" for line in event["lines"])]
            ]
        case "turn_ended":
            return [_out("")]
    return []


def result_line(inserted_text: str) -> str:
    """The line a terminal prints of a stored result: its first."""
    return inserted_text.splitlines()[0] if inserted_text else ""
