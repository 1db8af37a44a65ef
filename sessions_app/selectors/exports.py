"""A session as JSON: everything stored, every branch of its tree, for a person to keep or to import again.

The format (``"format": "cachet-session"``, ``"version": 1``) is one object: ``session``, then ``generations``,
``turns``, ``steps``, ``results`` and ``requests``, each a list of rows, and ``last_request``. Rows refer to each
other by their numbers within the session (a turn's ``parent`` and ``generation``, a step's ``turn``, a result's
``turn`` and ``step``), never by database ids. Texts are as stored. The text is written row by row, each list
read from the database in chunks, so a large session is never held whole.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import connection, transaction
from django.db.models import CharField, Model, QuerySet

from sessions_app.models import (
    BreakCause,
    ChatSession,
    Generation,
    LastRequest,
    Mode,
    ModelRequest,
    Rating,
    RequestKind,
    RequestStatus,
    Result,
    ResultKind,
    Step,
    TakenBackBy,
    Turn,
    TurnStatus,
)

EXPORT_FORMAT = "cachet-session"
EXPORT_VERSION = 1
CHUNK_ROWS = 200

# What a field holds: a text, one of its choices, a whole number, a number from 0, true or false, any JSON, a JSON
# object, a time (ISO 8601); and the shapes read later: a generation's tools (a JSON list as text), a step's tool
# calls, a list of whole numbers, the session's pending breaks, an edit's changed files.
FieldKind = Literal[
    "text",
    "choice",
    "whole",
    "real",
    "flag",
    "json",
    "object",
    "moment",
    "tools",
    "calls",
    "numbers",
    "breaks",
    "changes",
]


@dataclass(frozen=True)
class Field:
    """One field of an exported row: its name, the kind of JSON value it holds, and what the import checks of it.

    ``nullable``: null is one of its values. ``blank``: a text may be empty, a choice may be empty besides its
    ``choices``. ``minimum``: the least whole number (each of a list's). A text's longest is its model field's
    ``max_length``; a real number's greatest is ``maximum`` (``None``: any). ``source``: the row's value it holds
    where that is not the model field of its name (another row's number, a name). ``imported``: read back by the
    import (not so: where the session lived, its last change). ``added``: added to version 1 of the format later,
    so a file written before may lack it (read as ``absent``).
    """

    name: str
    kind: FieldKind
    nullable: bool = False
    blank: bool = False
    minimum: int = 0
    choices: tuple[str, ...] = ()
    source: str | None = None
    imported: bool = True
    added: bool = False
    maximum: float | None = None

    @property
    def absent(self) -> object:
        """What a file written before the field was ``added`` to the format stands for with it: null, or empty."""
        return None if self.nullable else ""

    @property
    def read_from(self) -> str:
        return self.source or self.name

    @property
    def is_link(self) -> bool:
        """Whether it refers to another row (by its number or name) rather than being a field of the row's own."""
        return self.source is not None


@dataclass(frozen=True)
class Table:
    """The fields of one model's rows in an export, in the order they are written and checked."""

    name: str
    model: type[Model]
    fields: tuple[Field, ...]

    def longest(self, field: Field) -> int | None:
        """The most characters a text field holds: its model field's ``max_length`` (``None``: any)."""
        if field.kind != "text" or field.is_link:
            return None
        model_field = self.model._meta.get_field(field.name)
        return model_field.max_length if isinstance(model_field, CharField) else None


def _text(
    name: str, *, blank: bool = True, nullable: bool = False, source: str | None = None, added: bool = False
) -> Field:
    return Field(name, "text", nullable=nullable, blank=blank, source=source, added=added)


def _choice(name: str, choices: list[str], *, blank: bool = False, added: bool = False) -> Field:
    return Field(name, "choice", blank=blank, choices=tuple(choices), added=added)


def _whole(
    name: str, *, minimum: int = 0, nullable: bool = False, source: str | None = None, added: bool = False
) -> Field:
    return Field(name, "whole", nullable=nullable, minimum=minimum, source=source, added=added)


def _moment(name: str, *, nullable: bool = False, imported: bool = True, added: bool = False) -> Field:
    """A time, or null; null in a field that cannot be null is read back as the time of the import."""
    return Field(name, "moment", nullable=nullable, imported=imported, added=added)


SESSION = Table(
    "session",
    ChatSession,
    (
        _text("title"),
        _text("model_name", blank=False),
        _choice("mode", Mode.values),
        _whole("next_result_number", minimum=1),
        _whole("next_turn_number", minimum=1),
        _whole("generation_number", minimum=1),
        _whole("revision"),
        Field("pending_breaks", "breaks"),
        _moment("created_at"),
        _moment("updated_at", imported=False),
        Field("workspace", "text", source="workspace__name", imported=False),
        _text("endpoint", source="endpoint__name"),
        _text("instructions", added=True),
        _whole("max_tokens", minimum=1, nullable=True, added=True),
        Field("temperature", "real", nullable=True, maximum=2.0, added=True),
    ),
)
GENERATIONS = Table(
    "generations",
    Generation,
    (
        _whole("number", minimum=1),
        _text("system_prompt"),
        _text("system_prompt_sha256"),
        Field("tools_json", "tools"),
        _choice("mode", Mode.values),
        _text("model_name"),
        _text("summary"),
        _text("table"),
        _whole("covers_through_turn", nullable=True),
        _whole("resumes_after_step", nullable=True, added=True),
        _whole("resumed_turn", minimum=1, nullable=True, added=True),
        _text("resumed_message", added=True),
        _text("resumed_note_workspace", added=True),
        _text("resumed_note_model", added=True),
        _text("resumed_note_date", added=True),
        _choice("resumed_note_mode", Mode.values, blank=True, added=True),
        _text("resumed_note_instructions", nullable=True, added=True),
        _text("resumed_note_session_instructions", nullable=True, added=True),
        Field("resumed_note_tool_instructions", "object", nullable=True, added=True),
        Field("taken_back", "flag"),
        _whole("revision"),
        _moment("created_at"),
    ),
)
TURNS = Table(
    "turns",
    Turn,
    (
        _whole("number", minimum=1),
        _whole("position", minimum=1),
        _text("words"),
        _text("message"),
        _text("note_workspace"),
        _text("note_model"),
        _text("note_date"),
        _choice("note_mode", Mode.values, blank=True),
        _text("note_instructions", nullable=True),
        _text("note_session_instructions", nullable=True, added=True),
        Field("note_tool_instructions", "object", nullable=True, added=True),
        _choice("mode", Mode.values),
        _text("reply_text"),
        _choice("status", TurnStatus.values),
        _text("error"),
        _choice("taken_back_by", TakenBackBy.values, blank=True),
        _choice("live_status", TurnStatus.values, blank=True),
        _whole("taken_back_in", nullable=True),
        _whole("revision"),
        _moment("started_at"),
        _moment("finished_at", nullable=True),
        _whole("parent", minimum=1, nullable=True, source="parent__number"),
        _whole("generation", minimum=1, source="generation__number"),
        _choice("rating", Rating.values, blank=True, added=True),
        _moment("rated_at", nullable=True, added=True),
    ),
)
STEPS = Table(
    "steps",
    Step,
    (
        _whole("number", minimum=1),
        _text("text"),
        _text("reasoning"),
        Field("tool_calls", "calls"),
        _text("finish_reason"),
        _moment("created_at"),
        _whole("turn", minimum=1, source="turn__number"),
    ),
)
RESULTS = Table(
    "results",
    Result,
    (
        _whole("number", minimum=1),
        _text("call_id"),
        _text("tool"),
        Field("arguments", "json", nullable=True),
        _text("arguments_raw"),
        _text("args_key"),
        _choice("kind", ResultKind.values),
        _text("full_text"),
        _text("inserted_text"),
        _whole("refers_to", nullable=True),
        Field("stale", "numbers", minimum=1),
        Field("changed_files", "changes"),
        _text("path"),
        _text("abs_path"),
        _whole("first_line", nullable=True),
        _whole("last_line", nullable=True),
        _whole("total_lines", nullable=True),
        _text("sha256"),
        _moment("created_at"),
        _whole("turn", minimum=1, source="turn__number"),
        _whole("step", minimum=1, nullable=True, source="step__number"),
    ),
)
REQUESTS = Table(
    "requests",
    ModelRequest,
    (
        _whole("step_number"),
        _choice("kind", RequestKind.values),
        _text("endpoint_url"),
        _text("model_name"),
        _text("body_sha256"),
        _whole("bytes_sent"),
        _whole("shared_prefix_bytes"),
        _choice("break_cause", BreakCause.values, blank=True),
        _whole("expected_shared_bytes"),
        _choice("status", RequestStatus.values),
        _text("error"),
        _whole("prompt_tokens", nullable=True),
        _whole("cached_tokens", nullable=True),
        _whole("completion_tokens", nullable=True),
        Field("time_to_first_token", "real", nullable=True),
        Field("total_time", "real", nullable=True),
        Field("usage", "object", nullable=True),
        Field("timings", "object", nullable=True),
        _moment("started_at"),
        _moment("finished_at", nullable=True),
        _whole("turn", minimum=1, nullable=True, source="turn__number"),
    ),
)
LISTS = (GENERATIONS, TURNS, STEPS, RESULTS, REQUESTS)
"""The lists of rows of an export, in the order the file holds them after ``session``."""


def _value(value: object) -> object:
    return value.isoformat() if isinstance(value, datetime) else value


def _row(values: dict[str, Any], table: Table) -> dict[str, object]:
    return {field.name: _value(values[field.read_from]) for field in table.fields}


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _rows(table: Table, rows: QuerySet[Any]) -> Iterator[str]:
    yield f',\n"{table.name}":['
    first = True
    for values in rows.values(*(field.read_from for field in table.fields)).iterator(chunk_size=CHUNK_ROWS):
        yield ("\n" if first else ",\n") + _dumps(_row(values, table))
        first = False
    yield "]"


def _lists(session: ChatSession) -> dict[str, QuerySet[Any]]:
    """Each list's rows of ``session``, in the order they are written."""
    return {
        GENERATIONS.name: Generation.objects.filter(session=session).order_by("number"),
        TURNS.name: Turn.objects.filter(session=session).order_by("number"),
        STEPS.name: Step.objects.filter(turn__session=session).order_by("turn__number", "number"),
        RESULTS.name: Result.objects.filter(session=session).order_by("number"),
        REQUESTS.name: ModelRequest.objects.filter(session=session).order_by("id"),
    }


def _last_request(session: ChatSession) -> object:
    last = LastRequest.objects.filter(session=session).first()
    if last is None:
        return None
    try:
        body = bytes(last.body).decode()
    except UnicodeDecodeError:
        return None
    return {"body": body, "turn": last.turn_number}


def export_chunks(session: ChatSession, *, exported_at: datetime) -> Iterator[str]:
    """The JSON text of ``session``, a piece at a time. Iterate it inside one transaction for a consistent copy
    (:func:`session_export`)."""
    values = ChatSession.objects.filter(pk=session.pk).values(*(field.read_from for field in SESSION.fields)).get()
    head = {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "exported_at": exported_at.isoformat(),
        SESSION.name: _row(values, SESSION),
    }
    yield _dumps(head)[:-1]
    lists = _lists(session)
    for table in LISTS:
        yield from _rows(table, lists[table.name])
    yield ',\n"last_request":' + json.dumps(_last_request(session), ensure_ascii=False) + "}\n"


def session_export(
    *, owner: AbstractBaseUser | AnonymousUser, session_id: int, exported_at: datetime
) -> Iterator[str] | None:
    """The JSON text of the owner's session ``session_id``, read as one snapshot; ``None`` when it is not
    theirs. The pieces come as the caller iterates (each from within the snapshot's transaction)."""
    session = ChatSession.objects.filter(owner_id=owner.pk, pk=session_id, deleted_at__isnull=True).first()
    if session is None:
        return None
    return export_snapshot(session, exported_at=exported_at)


def export_snapshot(session: ChatSession, *, exported_at: datetime) -> Iterator[str]:
    """The JSON text of ``session``, read as one snapshot (a transaction of its own where none is open)."""
    outer = connection.in_atomic_block
    with transaction.atomic():
        if not outer:
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        yield from export_chunks(session, exported_at=exported_at)
