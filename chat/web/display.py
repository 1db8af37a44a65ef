"""What the chat page shows of the store: turns, their steps and tool calls, as plain objects for templates.

Everything here is bounded, whatever a session holds: a page shows the last turns only (older ones load as
the person scrolls up), a tool row the first lines of what the model was sent (the rest is a click away, by
the paged result view), a step the first characters of a very long text. The texts are cut in the database,
so a page never loads a result's whole text to show its first lines.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from django.db.models import BooleanField, Exists, ExpressionWrapper, OuterRef, Q, QuerySet, Value
from django.db.models.functions import Length, Replace, Right, Substr

from sessions_app import prompts
from sessions_app.hygiene import format_id
from sessions_app.models import (
    ChatSession,
    Generation,
    Result,
    ResultKind,
    Step,
    StepDraft,
    TakenBackBy,
    Turn,
    TurnStatus,
    Upload,
)
from sessions_app.selectors.sessions import compactions, turn_position
from sessions_app.tool_names import split_name

TARGET_KEYS = ("path", "pattern", "command", "id", "target")
PRIMARY_KEY = {"grep": "pattern", "glob": "pattern", "run": "command", "recall": "id"}
PATCH_FILE = re.compile(r"^\*\*\* (?:Add|Update|Delete) File: (.+)$", re.MULTILINE)
BRACKET_LINE = re.compile(r"^\[(#[0-9a-f]+)\]\s?(.*)$")
STATUS_CHARS = 120
TARGET_CHARS = 80
PAGE_TURNS = 20
ROW_LINES = 50
ROW_CHARS = 8_000
STEP_CHARS = 50_000
TAIL_CHARS = 200


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
    if split_name(tool) is not None:  # an MCP server's tool: its arguments, whatever they are called
        return one_line(", ".join(f"{key}: {_shown_value(value)}" for key, value in arguments.items()), TARGET_CHARS)
    return ""


def _shown_value(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


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


@dataclass(frozen=True)
class ResultFacts:
    """What a tool row needs of a result, without its whole texts: the first part of what the model was
    sent, and the length, line count and last line of the full text."""

    inserted_head: str
    inserted_chars: int
    full_chars: int
    full_lines: int
    full_tail: str

    @classmethod
    def of(cls, result: Result) -> ResultFacts:
        """The facts of a result loaded by :func:`rows_queryset`, or of one loaded whole."""
        annotated = getattr(result, "inserted_head", None)
        if annotated is not None:
            tail: str = getattr(result, "full_tail", "")
            newlines: int = getattr(result, "full_newlines", 0)
            return cls(
                inserted_head=annotated,
                inserted_chars=getattr(result, "inserted_chars", len(annotated)),
                full_chars=getattr(result, "full_chars", 0),
                full_lines=newlines + (1 if tail and not tail.endswith("\n") else 0),
                full_tail=tail,
            )
        full = result.full_text
        newlines = full.count("\n")
        return cls(
            inserted_head=result.inserted_text[:ROW_CHARS],
            inserted_chars=len(result.inserted_text),
            full_chars=len(full),
            full_lines=newlines + (1 if full and not full.endswith("\n") else 0),
            full_tail=full[-TAIL_CHARS:],
        )


def rows_queryset(results: QuerySet[Result]) -> QuerySet[Result]:
    """``results`` with the first part of their inserted texts and facts of their full texts computed by the
    database, the whole texts left behind."""
    return results.defer("inserted_text", "full_text", "arguments").annotate(
        inserted_head=Substr("inserted_text", 1, ROW_CHARS),
        inserted_chars=Length("inserted_text"),
        full_chars=Length("full_text"),
        full_newlines=Length("full_text") - Length(Replace("full_text", Value("\n"), Value(""))),
        full_tail=Right("full_text", TAIL_CHARS),
    )


def result_status(result: Result, facts: ResultFacts | None = None) -> str:
    """One line saying how a call went: the lines a read shows, an error's message, an edit's size."""
    facts = facts or ResultFacts.of(result)
    first, _, _ = facts.inserted_head.partition("\n")
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
        lines = facts.full_lines
        last = facts.full_tail.rstrip("\n").rpartition("\n")[2]
        if lines <= 1:
            return one_line(facts.full_tail or "no output", STATUS_CHARS)
        status = f"{lines} lines"
        if result.kind == ResultKind.OUTPUT and last.startswith("["):
            status += f", {last}"
        if facts.inserted_chars < facts.full_chars:
            status += ", capped"
        return one_line(status, STATUS_CHARS)
    text = first.strip("[]")
    prefix = result_id(result.number) + " "
    return one_line(text.removeprefix(prefix) if text.startswith(prefix) else text, STATUS_CHARS)


def head_lines(text: str, *, lines: int, chars: int) -> tuple[str, bool]:
    """The first ``lines`` lines of ``text``, at most ``chars`` characters; and whether anything was left out."""
    cut = text[:chars]
    position = -1
    for _ in range(lines):
        position = cut.find("\n", position + 1)
        if position < 0:
            break
    if position >= 0 and position < len(cut) - 1:
        return cut[:position], True
    return cut, len(cut) < len(text)


@dataclass
class ToolRow:
    dom_id: str
    call_id: str
    tool: str
    target: str
    result: Result | None = None
    rid: str = ""
    status: str = "running…"
    shown_text: str = ""
    more: bool = False
    not_run: bool = False

    @property
    def changed_paths(self) -> str:
        """The files the call changed, as JSON (for Rewind here's question), or ``""``."""
        changes = self.result.changed_files if self.result is not None else []
        paths = [str(change.get("path", "")) for change in changes if change.get("path")]
        return json.dumps(paths) if paths else ""


@dataclass
class StepView:
    step: Step
    rows: list[ToolRow]
    text: str
    text_cut: bool
    reasoning: str
    reasoning_cut: bool


def _cut(text: str) -> tuple[str, bool]:
    if len(text) <= STEP_CHARS:
        return text, False
    return text[: text.rfind("\n", 0, STEP_CHARS) + 1 or STEP_CHARS], True


@dataclass
class TurnView:
    turn: Turn
    steps: list[StepView]
    running: bool = False
    is_last: bool = False
    draft: StepDraft | None = None
    siblings: tuple[int, ...] = ()  # the stored numbers of the turns that share its parent, itself among them
    uploads: tuple[Upload, ...] = ()  # the files attached with the message

    @property
    def order(self) -> int:
        return self.turn.number * 2

    @property
    def label(self) -> int:
        """The turn's place in the live branch, which the page names it by (its stored number stays its id)."""
        return self.turn.position

    @property
    def sibling_at(self) -> int:
        return self.siblings.index(self.turn.number) + 1 if self.turn.number in self.siblings else 1

    @property
    def previous_sibling(self) -> int | None:
        at = self.sibling_at
        return self.siblings[at - 2] if at > 1 else None

    @property
    def next_sibling(self) -> int | None:
        at = self.sibling_at
        return self.siblings[at] if at < len(self.siblings) else None

    @property
    def words(self) -> str:
        return _cut(self.turn.words)[0]

    @property
    def words_cut(self) -> bool:
        return _cut(self.turn.words)[1]

    @property
    def is_open(self) -> bool:
        return self.turn.status == TurnStatus.OPEN and self.running

    @property
    def orphaned(self) -> bool:
        """Open, but no process is replying: its server stopped (the next reply marks it interrupted)."""
        return self.turn.status == TurnStatus.OPEN and not self.running

    @property
    def failed(self) -> bool:
        return self.turn.status in (TurnStatus.FAILED, TurnStatus.INTERRUPTED) or self.orphaned

    @property
    def error(self) -> str:
        if self.orphaned:
            from sessions_app.services.locks import ORPHAN_REASON

            return ORPHAN_REASON
        return self.turn.error

    @property
    def can_retry(self) -> bool:
        return self.failed and self.is_last

    @property
    def cut_off(self) -> bool:
        """The last reply, ended before the model finished it: stopped, interrupted, or out of tokens."""
        if not self.is_last or self.is_open or self.turn.status == TurnStatus.FAILED:
            return False
        if self.turn.status == TurnStatus.INTERRUPTED or self.orphaned:
            return bool(self.turn.reply_text or self.steps)
        return bool(self.steps) and self.steps[-1].step.finish_reason == "length"

    @property
    def continue_values(self) -> str:
        """What Continue sends: the person's message that asks the model to go on."""
        return json.dumps({"type": "send", "text": prompts.continue_words()})

    @property
    def live_step(self) -> int:
        return self.draft.number if self.draft is not None else len(self.steps) + 1

    @property
    def unstepped_text(self) -> str:
        """Text of a stopped or failed reply that no stored step holds (what streamed before it ended)."""
        if self.orphaned and self.draft is not None:
            return self.draft.text
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
        if self.turn.note_workspace:
            notes.append(f"workspace {self.turn.note_workspace}")
        if self.turn.note_model:
            notes.append(f"model {self.turn.note_model}")
        if self.turn.note_mode:
            notes.append(f"mode {self.turn.note_mode}")
        if self.turn.note_date:
            notes.append(self.turn.note_date)
        if self.turn.note_instructions is not None:
            notes.append("AGENTS.md" if self.turn.note_instructions else "AGENTS.md removed")
        if self.turn.note_session_instructions is not None:
            notes.append("instructions" if self.turn.note_session_instructions else "instructions removed")
        return notes


@dataclass
class CompactionView:
    generation: Generation

    is_compaction = True

    @property
    def order(self) -> int:
        return (self.generation.covers_through_turn or 0) * 2 + 1

    @cached_property
    def covers_through(self) -> int | None:
        """The last turn the summary covers, by its place in the live branch, as the page labels turns."""
        return turn_position(session_id=self.generation.session_id, number=self.generation.covers_through_turn)


def tool_row(step: Step, position: int, call: dict[str, str], result: Result | None) -> ToolRow:
    row = ToolRow(
        dom_id=f"call-{step.pk}-{position}",
        call_id=str(call.get("id", "")),
        tool=str(call.get("name", "")),
        target=call_target(str(call.get("name", "")), str(call.get("arguments", ""))),
    )
    if result is not None:
        facts = ResultFacts.of(result)
        row.result = result
        row.rid = result_id(result.number)
        row.status = result_status(result, facts)
        row.shown_text, cut = head_lines(facts.inserted_head, lines=ROW_LINES, chars=ROW_CHARS)
        row.more = cut or facts.inserted_chars > len(facts.inserted_head)
    return row


def tool_rows(step: Step, results: Iterable[Result]) -> list[ToolRow]:
    by_call = {result.call_id: result for result in results}
    return [
        tool_row(step, position, dict(call), by_call.get(str(call.get("id", ""))))
        for position, call in enumerate(step.tool_calls)
    ]


def row_for_result(result: Result) -> ToolRow | None:
    """The row of the call ``result`` answers, for replacing it on the page once the result is stored."""
    step = result.step
    if step is None:
        return None
    for position, call in enumerate(step.tool_calls):
        if call.get("id") == result.call_id:
            return tool_row(step, position, dict(call), result)
    return None


def step_view(step: Step, results: Iterable[Result]) -> StepView:
    text, text_cut = _cut(step.text)
    reasoning, reasoning_cut = _cut(step.reasoning)
    return StepView(step, tool_rows(step, results), text, text_cut, reasoning, reasoning_cut)


def turn_views(turns: Sequence[Turn], *, running: bool, last_number: int | None) -> list[TurnView]:
    """Views of ``turns`` with their steps, results, drafts and attached files in four queries, whatever their
    number."""
    ids = [turn.pk for turn in turns]
    steps: dict[int, list[Step]] = {}
    for step in Step.objects.filter(turn_id__in=ids).order_by("turn_id", "number"):
        steps.setdefault(step.turn_id, []).append(step)
    results: dict[int, list[Result]] = {}
    for result in rows_queryset(Result.objects.filter(turn_id__in=ids, step__isnull=False)).order_by("number"):
        assert result.step_id is not None
        results.setdefault(result.step_id, []).append(result)
    drafts = {draft.turn_id: draft for draft in StepDraft.objects.filter(turn_id__in=ids).order_by("number")}
    uploads: dict[int, list[Upload]] = {}
    for upload in turn_uploads(Upload.objects.filter(turn_id__in=ids)):
        assert upload.turn_id is not None
        uploads.setdefault(upload.turn_id, []).append(upload)
    siblings = _siblings(turns)
    return [
        TurnView(
            turn=turn,
            steps=[step_view(step, results.get(step.pk, [])) for step in steps.get(turn.pk, [])],
            running=running,
            is_last=turn.number == last_number,
            draft=drafts.get(turn.pk),
            siblings=siblings.get(turn.parent_id, (turn.number,)),
            uploads=tuple(uploads.get(turn.pk, ())),
        )
        for turn in turns
    ]


def turn_uploads(uploads: QuerySet[Upload]) -> QuerySet[Upload]:
    """The files a message said arrived, oldest first, without an image's data; ``shown``: an image that went
    with it to the model."""
    shown = Q(image_type__gt="") & Q(turn__generation__reads_images=True)
    return uploads.defer("image").annotate(shown=ExpressionWrapper(shown, output_field=BooleanField())).order_by("id")


def _siblings(turns: Sequence[Turn]) -> dict[int | None, tuple[int, ...]]:
    """The numbers of the turns under each parent of ``turns`` (None: first turns), in one query. An attempt
    that came to nothing (it failed or was interrupted before any text or step) and was retried is no branch
    to go back to: the retry asks the same message, so five retries of a failing request do not show
    ``◀ 5 / 5 ▶``; the admin lists it."""
    if not turns:
        return {}
    parents = {turn.parent_id for turn in turns}
    under = Q(parent_id__in=[parent for parent in parents if parent is not None])
    if None in parents:
        under |= Q(parent__isnull=True)
    came_to_nothing = Q(
        status=TurnStatus.TAKEN_BACK,
        taken_back_by=TakenBackBy.REGENERATE,
        live_status__in=[TurnStatus.FAILED, TurnStatus.INTERRUPTED],
        reply_text="",
    ) & ~Exists(Step.objects.filter(turn_id=OuterRef("pk")))
    found: dict[int | None, list[int]] = {}
    rows = Turn.objects.filter(under, session_id=turns[0].session_id).exclude(came_to_nothing).order_by("number")
    for parent, number in rows.values_list("parent_id", "number"):
        found.setdefault(parent, []).append(number)
    return {parent: tuple(numbers) for parent, numbers in found.items()}


def live_turns(session_id: int) -> QuerySet[Turn]:
    return Turn.objects.filter(session_id=session_id).exclude(status=TurnStatus.TAKEN_BACK)


def last_live_number(session_id: int) -> int | None:
    return live_turns(session_id).order_by("-number").values_list("number", flat=True).first()


@dataclass
class TranscriptPage:
    """The turns a page shows, oldest first, compaction markers among them, and the turn before them."""

    entries: list[TurnView | CompactionView]
    earlier_than: int | None


def compaction_views(session: ChatSession, *, low: int, high: int | None) -> list[CompactionView]:
    generations = compactions(session).filter(covers_through_turn__gte=low)
    if high is not None:
        generations = generations.filter(covers_through_turn__lt=high)
    return [CompactionView(generation) for generation in generations]


def transcript_page(
    session: ChatSession, *, running: bool, before: int | None = None, count: int = PAGE_TURNS
) -> TranscriptPage:
    """The last ``count`` live turns (before turn ``before`` where given), with the compactions between."""
    turns_query = live_turns(session.pk)
    if before is not None:
        turns_query = turns_query.filter(number__lt=before)
    turns = list(reversed(turns_query.order_by("-number")[: count + 1]))
    earlier = len(turns) > count
    turns = turns[1:] if earlier else turns
    views = turn_views(turns, running=running, last_number=last_live_number(session.pk))
    low = turns[0].number if turns and earlier else 0
    markers = compaction_views(session, low=low, high=before) if turns else []
    entries: list[TurnView | CompactionView] = sorted([*views, *markers], key=lambda entry: entry.order)
    return TranscriptPage(entries=entries, earlier_than=turns[0].number if earlier and turns else None)


def single_turn(turn: Turn, *, running: bool) -> TurnView:
    return turn_views([turn], running=running, last_number=last_live_number(turn.session_id))[0]


def ended_turn(
    turn: Turn, *, steps: Sequence[Step], results: Mapping[int, Sequence[Result]], siblings: tuple[int, ...]
) -> TurnView:
    """The view of a turn whose reply just ended, from what the reply stored (``results`` by step id) and the
    siblings seen as it started, without a query: the last live turn, its drafts gone with its steps."""
    return TurnView(
        turn=turn,
        steps=[step_view(step, results.get(step.pk, ())) for step in steps],
        running=False,
        is_last=True,
        draft=None,
        siblings=siblings,
    )


def started_turn(turn: Turn) -> TurnView:
    """The view of a turn whose reply just started: the last live turn, with no step, result or draft yet (two
    queries: the turns beside it, and the files attached with its message)."""
    siblings = _siblings([turn])
    return TurnView(
        turn=turn,
        steps=[],
        running=True,
        is_last=True,
        draft=None,
        siblings=siblings.get(turn.parent_id, (turn.number,)),
        uploads=tuple(turn_uploads(Upload.objects.filter(turn=turn))),
    )
