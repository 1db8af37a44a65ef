"""What the chat page shows of the store: turns, their steps and tool calls, as plain objects for templates."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from sessions_app import prompts
from sessions_app.hygiene import count_lines, format_id
from sessions_app.models import ChatSession, Generation, Result, ResultKind, Step, Turn, TurnStatus

TARGET_KEYS = ("path", "pattern", "command", "id", "target")
PRIMARY_KEY = {"grep": "pattern", "glob": "pattern", "run": "command", "recall": "id"}
PATCH_FILE = re.compile(r"^\*\*\* (?:Add|Update|Delete) File: (.+)$", re.MULTILINE)
BRACKET_LINE = re.compile(r"^\[(#[0-9a-f]+)\]\s?(.*)$")
STATUS_CHARS = 120
TARGET_CHARS = 80


def result_id(number: int) -> str:
    """``#`` and the number in lowercase hex, as wide as the rules make ids."""
    return format_id(number, prompts.rules_config().id_digits)


def one_line(text: str, limit: int) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def call_target(tool: str, arguments_raw: str) -> str:
    """What a call is about, in a few words: its path, pattern, command or recalled id."""
    try:
        arguments = json.loads(arguments_raw) if arguments_raw.strip() else {}
    except (ValueError, RecursionError):
        return one_line(arguments_raw, TARGET_CHARS)
    if not isinstance(arguments, dict):
        return ""
    if tool == "apply_patch" and isinstance(arguments.get("patch"), str):
        return one_line(", ".join(PATCH_FILE.findall(arguments["patch"])), TARGET_CHARS)
    primary = PRIMARY_KEY.get(tool)
    for key in ((primary,) if primary else ()) + TARGET_KEYS:
        value = arguments.get(key)
        if isinstance(value, str | int) and str(value):
            text = str(value)
            where = arguments.get("path")
            if key == "pattern" and isinstance(where, str) and where not in ("", "."):
                text = f"{text} in {where}"
            return one_line(text, TARGET_CHARS)
    return ""


def _diff_counts(diff: str) -> tuple[int, int]:
    added = removed = 0
    for line in diff.splitlines():
        if line.startswith("+"):
            added += 1
        elif line.startswith("-"):
            removed += 1
    return added, removed


def _edit_status(result: Result) -> str:
    parts: list[str] = []
    for change in result.changed_files:
        action = change.get("action")
        name = change.get("path", "") if len(result.changed_files) > 1 else ""
        if action == "create":
            text = f"created, {change.get('lines', 0)} lines"
        elif action == "delete":
            text = "deleted"
        else:
            added, removed = _diff_counts(str(change.get("diff", "")))
            text = f"+{added} −{removed}"
        parts.append(f"{name} {text}".strip())
    if result.stale:
        parts.append("stale: " + ", ".join(result_id(number) for number in result.stale))
    return "; ".join(parts) or "changed"


def result_status(result: Result) -> str:
    """One line saying how a call went: the lines a read shows, an error's message, an edit's size."""
    first, _, _ = result.inserted_text.partition("\n")
    bracket = BRACKET_LINE.match(first)
    after = bracket.group(2) if bracket else ""
    if result.kind == ResultKind.READ:
        if not result.total_lines:
            return "empty"
        return f"lines {result.first_line}-{result.last_line} of {result.total_lines}"
    if result.kind in (ResultKind.ERROR, ResultKind.STUB, ResultKind.SAME) and after:
        return one_line(after, STATUS_CHARS)
    if result.kind == ResultKind.EDIT:
        return one_line(_edit_status(result), STATUS_CHARS)
    if result.kind in (ResultKind.LISTING, ResultKind.OUTPUT):
        lines = count_lines(result.full_text)
        last = result.full_text.rstrip("\n").rpartition("\n")[2]
        if lines <= 1:
            return one_line(result.full_text or "no output", STATUS_CHARS)
        status = f"{lines} lines"
        if result.kind == ResultKind.OUTPUT and last.startswith("["):
            status += f", {last}"
        if len(result.inserted_text) < len(result.full_text):
            status += ", capped"
        return one_line(status, STATUS_CHARS)
    text = first.strip("[]")
    prefix = result_id(result.number) + " "
    return one_line(text.removeprefix(prefix) if text.startswith(prefix) else text, STATUS_CHARS)


@dataclass
class ToolRow:
    dom_id: str
    call_id: str
    tool: str
    target: str
    result: Result | None = None
    rid: str = ""
    status: str = "running…"


@dataclass
class StepView:
    step: Step
    rows: list[ToolRow]


@dataclass
class LiveText:
    """What the current step of an open turn has streamed so far (kept in the runner's memory)."""

    text: str = ""
    reasoning: str = ""
    calls: list[str] = field(default_factory=list)


@dataclass
class TurnView:
    turn: Turn
    steps: list[StepView]
    is_last: bool = False
    live: LiveText | None = None

    @property
    def is_open(self) -> bool:
        return self.turn.status == TurnStatus.OPEN

    @property
    def failed(self) -> bool:
        return self.turn.status in (TurnStatus.FAILED, TurnStatus.INTERRUPTED)

    @property
    def can_retry(self) -> bool:
        return self.failed and self.is_last

    @property
    def unstepped_text(self) -> str:
        """Text of a stopped or failed reply that no stored step holds (what streamed before it ended)."""
        if not self.failed or not self.turn.reply_text:
            return ""
        stepped = "\n\n".join(view.step.text for view in self.steps if view.step.text)
        reply = self.turn.reply_text
        if not stepped:
            return reply
        return reply.removeprefix(stepped + "\n\n") if reply.startswith(stepped + "\n\n") else ""

    @property
    def notes(self) -> list[str]:
        """The note stored with the message, in a few words."""
        notes: list[str] = []
        if self.turn.note_date:
            notes.append(self.turn.note_date)
        if self.turn.note_mode:
            notes.append(f"mode {self.turn.note_mode}")
        if self.turn.note_instructions is not None:
            notes.append("AGENTS.md" if self.turn.note_instructions else "AGENTS.md removed")
        return notes


@dataclass
class CompactionView:
    generation: Generation

    is_compaction = True


def tool_rows(step: Step, results: list[Result]) -> list[ToolRow]:
    by_call = {result.call_id: result for result in results}
    rows: list[ToolRow] = []
    for position, call in enumerate(step.tool_calls):
        row = ToolRow(
            dom_id=f"call-{step.pk}-{position}",
            call_id=str(call.get("id", "")),
            tool=str(call.get("name", "")),
            target=call_target(str(call.get("name", "")), str(call.get("arguments", ""))),
        )
        result = by_call.get(row.call_id)
        if result is not None:
            row.result = result
            row.rid = result_id(result.number)
            row.status = result_status(result)
        rows.append(row)
    return rows


def row_for_result(result: Result) -> ToolRow | None:
    """The row of the call ``result`` answers, for replacing it on the page once the result is stored."""
    step = result.step
    if step is None:
        return None
    for row in tool_rows(step, [result]):
        if row.call_id == result.call_id:
            return row
    return None


def turn_view(turn: Turn, *, is_last: bool = False, live: LiveText | None = None) -> TurnView:
    results = list(turn.results.all())
    steps = [
        StepView(step=step, rows=tool_rows(step, [r for r in results if r.step_id == step.pk]))
        for step in turn.steps.all()
    ]
    return TurnView(turn=turn, steps=steps, is_last=is_last, live=live if turn.status == TurnStatus.OPEN else None)


def live_turns(session: ChatSession) -> list[Turn]:
    return list(
        Turn.objects.filter(session=session)
        .exclude(status=TurnStatus.TAKEN_BACK)
        .order_by("number")
        .prefetch_related("steps", "results")
    )


def transcript(session: ChatSession, *, live: LiveText | None = None) -> list[TurnView | CompactionView]:
    """The live turns, oldest first, with a marker after the last turn each live compaction summarized."""
    turns = live_turns(session)
    compactions: dict[int, list[Generation]] = {}
    for generation in Generation.objects.filter(
        session=session, taken_back=False, covers_through_turn__isnull=False
    ).exclude(summary=""):
        assert generation.covers_through_turn is not None
        compactions.setdefault(generation.covers_through_turn, []).append(generation)
    entries: list[TurnView | CompactionView] = []
    for position, turn in enumerate(turns):
        entries.append(turn_view(turn, is_last=position == len(turns) - 1, live=live))
        entries.extend(CompactionView(generation) for generation in compactions.get(turn.number, []))
    return entries


def single_turn(turn: Turn, *, live: LiveText | None = None) -> TurnView:
    turn = Turn.objects.prefetch_related("steps", "results").get(pk=turn.pk)
    later = Turn.objects.filter(session_id=turn.session_id, number__gt=turn.number)
    is_last = not later.exclude(status=TurnStatus.TAKEN_BACK).exists()
    return turn_view(turn, is_last=is_last, live=live)
