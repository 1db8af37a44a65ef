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
from datetime import datetime
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import connection, transaction

from sessions_app.models import ChatSession, Generation, LastRequest, ModelRequest, Result, Step, Turn

EXPORT_FORMAT = "cachet-session"
EXPORT_VERSION = 1
CHUNK_ROWS = 200

SESSION_FIELDS = (
    "title",
    "model_name",
    "mode",
    "next_result_number",
    "next_turn_number",
    "generation_number",
    "revision",
    "pending_breaks",
    "created_at",
    "updated_at",
)
GENERATION_FIELDS = (
    "number",
    "system_prompt",
    "system_prompt_sha256",
    "tools_json",
    "mode",
    "model_name",
    "summary",
    "table",
    "covers_through_turn",
    "taken_back",
    "revision",
    "created_at",
)
TURN_FIELDS = (
    "number",
    "position",
    "words",
    "message",
    "note_workspace",
    "note_model",
    "note_date",
    "note_mode",
    "note_instructions",
    "mode",
    "reply_text",
    "status",
    "error",
    "taken_back_by",
    "live_status",
    "taken_back_in",
    "revision",
    "started_at",
    "finished_at",
)
STEP_FIELDS = ("number", "text", "reasoning", "tool_calls", "finish_reason", "created_at")
RESULT_FIELDS = (
    "number",
    "call_id",
    "tool",
    "arguments",
    "arguments_raw",
    "args_key",
    "kind",
    "full_text",
    "inserted_text",
    "refers_to",
    "stale",
    "changed_files",
    "path",
    "abs_path",
    "first_line",
    "last_line",
    "total_lines",
    "sha256",
    "created_at",
)
REQUEST_FIELDS = (
    "step_number",
    "kind",
    "endpoint_url",
    "model_name",
    "body_sha256",
    "bytes_sent",
    "shared_prefix_bytes",
    "break_cause",
    "expected_shared_bytes",
    "status",
    "error",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "time_to_first_token",
    "total_time",
    "usage",
    "timings",
    "started_at",
    "finished_at",
)


def _value(value: object) -> object:
    return value.isoformat() if isinstance(value, datetime) else value


def _row(values: dict[str, Any], fields: tuple[str, ...], **refs: object) -> str:
    row: dict[str, object] = {name: _value(values[name]) for name in fields}
    row.update(refs)
    return json.dumps(row, ensure_ascii=False, separators=(",", ":"))


def _rows(name: str, rows: Iterator[str]) -> Iterator[str]:
    yield f',\n"{name}":['
    first = True
    for row in rows:
        yield ("\n" if first else ",\n") + row
        first = False
    yield "]"


def _generations(session: ChatSession) -> Iterator[str]:
    for values in Generation.objects.filter(session=session).order_by("number").values(*GENERATION_FIELDS):
        yield _row(values, GENERATION_FIELDS)


def _turns(session: ChatSession) -> Iterator[str]:
    rows = (
        Turn.objects.filter(session=session)
        .order_by("number")
        .values(*TURN_FIELDS, "parent__number", "generation__number")
        .iterator(chunk_size=CHUNK_ROWS)
    )
    for values in rows:
        yield _row(values, TURN_FIELDS, parent=values["parent__number"], generation=values["generation__number"])


def _steps(session: ChatSession) -> Iterator[str]:
    rows = (
        Step.objects.filter(turn__session=session)
        .order_by("turn__number", "number")
        .values(*STEP_FIELDS, "turn__number")
        .iterator(chunk_size=CHUNK_ROWS)
    )
    for values in rows:
        yield _row(values, STEP_FIELDS, turn=values["turn__number"])


def _results(session: ChatSession) -> Iterator[str]:
    rows = (
        Result.objects.filter(session=session)
        .order_by("number")
        .values(*RESULT_FIELDS, "turn__number", "step__number")
        .iterator(chunk_size=CHUNK_ROWS)
    )
    for values in rows:
        yield _row(values, RESULT_FIELDS, turn=values["turn__number"], step=values["step__number"])


def _requests(session: ChatSession) -> Iterator[str]:
    rows = (
        ModelRequest.objects.filter(session=session)
        .order_by("id")
        .values(*REQUEST_FIELDS, "turn__number")
        .iterator(chunk_size=CHUNK_ROWS)
    )
    for values in rows:
        yield _row(values, REQUEST_FIELDS, turn=values["turn__number"])


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
    values = (
        ChatSession.objects.filter(pk=session.pk).values(*SESSION_FIELDS, "workspace__name", "endpoint__name").get()
    )
    head = {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "exported_at": exported_at.isoformat(),
        "session": {
            **{name: _value(values[name]) for name in SESSION_FIELDS},
            "workspace": values["workspace__name"],
            "endpoint": values["endpoint__name"],
        },
    }
    yield json.dumps(head, ensure_ascii=False, separators=(",", ":"))[:-1]
    yield from _rows("generations", _generations(session))
    yield from _rows("turns", _turns(session))
    yield from _rows("steps", _steps(session))
    yield from _rows("results", _results(session))
    yield from _rows("requests", _requests(session))
    yield ',\n"last_request":' + json.dumps(_last_request(session), ensure_ascii=False) + "}\n"


def session_export(
    *, owner: AbstractBaseUser | AnonymousUser, session_id: int, exported_at: datetime
) -> Iterator[str] | None:
    """The JSON text of the owner's session ``session_id``, read as one snapshot; ``None`` when it is not
    theirs. The pieces come as the caller iterates (each from within the snapshot's transaction)."""
    session = ChatSession.objects.filter(owner_id=owner.pk, pk=session_id).first()
    if session is None:
        return None
    return _snapshot(session, exported_at=exported_at)


def _snapshot(session: ChatSession, *, exported_at: datetime) -> Iterator[str]:
    outer = connection.in_atomic_block
    with transaction.atomic():
        if not outer:
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        yield from export_chunks(session, exported_at=exported_at)
