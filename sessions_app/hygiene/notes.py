"""Notes (spec §10.3): what changed during a session goes at the end of the next user message."""

from __future__ import annotations

from dataclasses import dataclass

from .config import ContextConfig


@dataclass(frozen=True)
class StatedContext:
    """What the request being built last stated; ``instructions`` ``None``: none shown, or shown removed.

    A caller starts from the mode the system prompt states, and no date nor instructions.
    """

    date: str | None
    mode: str | None
    instructions: str | None


@dataclass(frozen=True)
class ComposedMessage:
    """A user message with its note; ``instructions_noted``: ``""`` removed, ``None`` not mentioned."""

    text: str
    date_noted: str | None
    mode_noted: str | None
    instructions_noted: str | None


def compose_message(
    words: str,
    *,
    today: str,
    mode: str,
    mode_text: str,
    instructions: str | None,
    stated: StatedContext,
    config: ContextConfig,
) -> ComposedMessage:
    """The person's ``words`` with a note of the date, mode and instructions that differ from ``stated``.

    Instructions are compared and shown stripped; blank ones count as none.
    """
    items: list[str] = []
    date_noted = mode_noted = instructions_noted = None
    if stated.date != today:
        date_noted = today
        items.append(config.note["date"].format(date=today))
    if stated.mode != mode:
        mode_noted = mode
        items.append(config.note["mode"].format(mode=mode, text=mode_text.strip()))
    current = _shown_instructions(instructions)
    if current != _shown_instructions(stated.instructions):
        if current is None:
            instructions_noted = ""
            items.append(config.note["instructions_removed"])
        else:
            instructions_noted = current
            items.append(config.note["instructions"].format(text=current))
    text = words
    if items:
        text = config.note["format"].format(message=words, body=config.note["separator"].join(items))
    return ComposedMessage(text, date_noted, mode_noted, instructions_noted)


def stated_after(stated: StatedContext, composed: ComposedMessage) -> StatedContext:
    """What the request states once ``composed`` is part of it."""
    instructions = stated.instructions
    if composed.instructions_noted is not None:
        instructions = composed.instructions_noted or None
    return StatedContext(
        date=composed.date_noted if composed.date_noted is not None else stated.date,
        mode=composed.mode_noted if composed.mode_noted is not None else stated.mode,
        instructions=instructions,
    )


def _shown_instructions(instructions: str | None) -> str | None:
    if instructions is None:
        return None
    return instructions.strip() or None
