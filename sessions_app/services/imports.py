"""Importing a session exported as JSON (:mod:`sessions_app.selectors.exports`): the whole tree, its results
with their ids and texts, its requests, recreated for the person importing it in a workspace they may use.

The file is checked whole before anything is written, then written in one transaction: a bad file gets a
message naming what is wrong and leaves nothing behind. Every field is checked for what the code that reads it
later needs (its type, its range, the keys of its objects), so that an imported session behaves as one made here:
an edit's ``changed_files`` hold what undo reads to restore files, ``pending_breaks`` what the next request reads.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import IO, Any, Literal, TypeGuard, TypeVar

from django.conf import settings
from django.contrib.auth.models import User
from django.db import DatabaseError, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from sessions_app.errors import StoreError
from sessions_app.hygiene.outcomes import FileChange
from sessions_app.models import (
    BreakCause,
    ChatSession,
    Generation,
    LastRequest,
    Mode,
    ModelEndpoint,
    ModelRequest,
    RequestKind,
    RequestStatus,
    Result,
    ResultKind,
    Step,
    TakenBackBy,
    Turn,
    TurnStatus,
    Workspace,
)
from sessions_app.selectors.exports import EXPORT_FORMAT, EXPORT_VERSION
from sessions_app.selectors.sessions import endpoint_default, workspaces_for
from sessions_app.text import storable, storable_json
from sessions_app.types import PendingBreak

BATCH = 500
T = TypeVar("T")
CHANGE_FIELDS = tuple(field.name for field in fields(FileChange))
_ACTIONS: dict[str, Literal["update", "create", "delete"]] = {
    "update": "update",
    "create": "create",
    "delete": "delete",
}
# A pending break names the first turn taken back (undo, rewind, regenerate, branch) or only its cause.
_TURN_BREAKS = (BreakCause.UNDO, BreakCause.REWIND, BreakCause.REGENERATE, BreakCause.BRANCH)
_CAUSE_BREAKS = (BreakCause.COMPACTION, BreakCause.MODEL_CHANGE)


class ImportRejected(StoreError):
    """The file cannot be imported; ``str()`` says why, naming the place in the file."""


def _fail(where: str, what: str) -> ImportRejected:
    return ImportRejected(f"{where}: {what}" if where else what)


def _whole(value: object, minimum: int) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and minimum <= value < 2**31


class _Row:
    """One object of the file, read field by field; each read names the field when it fails."""

    def __init__(self, value: object, where: str) -> None:
        if not isinstance(value, dict):
            raise _fail(where, "an object is expected")
        self.value: dict[str, object] = value
        self.where = where

    def _get(self, name: str) -> object:
        if name not in self.value:
            raise _fail(f"{self.where}.{name}".lstrip("."), "missing")
        return self.value[name]

    def only(self, names: Collection[str]) -> None:
        """Refuse a field the object may not have."""
        for name in self.value:
            if name not in names:
                raise _fail(f"{self.where}.{name}", "not a field of this object")

    def text(self, name: str, *, limit: int | None = None, blank: bool = True) -> str:
        value = self._get(name)
        if not isinstance(value, str):
            raise _fail(f"{self.where}.{name}", "a string is expected")
        if limit is not None and len(value) > limit:
            raise _fail(f"{self.where}.{name}", f"at most {limit} characters")
        if not blank and not value:
            raise _fail(f"{self.where}.{name}", "must not be empty")
        return storable(value)

    def text_or_none(self, name: str) -> str | None:
        value = self._get(name)
        return None if value is None else self.text(name)

    def choice(self, name: str, choices: list[str], *, blank: bool = False) -> str:
        value = self.text(name)
        if value not in choices and not (blank and value == ""):
            raise _fail(f"{self.where}.{name}", f"{value!r} is none of {', '.join(choices)}")
        return value

    def number(self, name: str, *, minimum: int = 0) -> int:
        value = self._get(name)
        if not _whole(value, minimum):
            raise _fail(f"{self.where}.{name}", f"a whole number from {minimum} is expected")
        return value

    def number_or_none(self, name: str, *, minimum: int = 0) -> int | None:
        return None if self._get(name) is None else self.number(name, minimum=minimum)

    def real_or_none(self, name: str) -> float | None:
        value = self._get(name)
        if value is None:
            return None
        if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value < math.inf:
            raise _fail(f"{self.where}.{name}", "a number from 0 is expected")
        return float(value)

    def flag(self, name: str) -> bool:
        value = self._get(name)
        if not isinstance(value, bool):
            raise _fail(f"{self.where}.{name}", "true or false is expected")
        return value

    def json(self, name: str) -> Any:
        return storable_json(self._get(name))

    def listing(self, name: str) -> list[Any]:
        value = self.json(name)
        if not isinstance(value, list):
            raise _fail(f"{self.where}.{name}", "a list is expected")
        return value

    def object_or_none(self, name: str) -> dict[str, Any] | None:
        value = self.json(name)
        if value is not None and not isinstance(value, dict):
            raise _fail(f"{self.where}.{name}", "an object or null is expected")
        return value

    def objects(self, name: str, read: Callable[[_Row], T]) -> list[T]:
        """The list ``name``, each of its items an object read by ``read``."""
        value = self._get(name)
        if not isinstance(value, list):
            raise _fail(f"{self.where}.{name}", "a list is expected")
        return [read(_Row(item, f"{self.where}.{name}[{index}]")) for index, item in enumerate(value)]

    def numbers(self, name: str, *, minimum: int = 0) -> list[int]:
        value = self._get(name)
        if not isinstance(value, list):
            raise _fail(f"{self.where}.{name}", "a list is expected")
        for index, item in enumerate(value):
            if not _whole(item, minimum):
                raise _fail(f"{self.where}.{name}[{index}]", f"a whole number from {minimum} is expected")
        return value

    def moment(self, name: str) -> datetime | None:
        value = self._get(name)
        if value is None:
            return None
        parsed = parse_datetime(value) if isinstance(value, str) else None
        if parsed is None:
            raise _fail(f"{self.where}.{name}", "a date and time (ISO 8601) is expected")
        return parsed if timezone.is_aware(parsed) else timezone.make_aware(parsed, timezone.get_current_timezone())


def _rows(data: _Row, name: str, read: Callable[[_Row], T]) -> list[T]:
    value = data._get(name)
    if not isinstance(value, list):
        raise _fail(name, "a list is expected")
    return [read(_Row(item, f"{name}[{index}]")) for index, item in enumerate(value)]


def _max_length(model: type[Any], name: str) -> int:
    return int(model._meta.get_field(name).max_length)


@dataclass
class _Imported:
    """The file read and checked: model rows not yet saved, with the numbers that link them."""

    session: ChatSession
    endpoint_name: str
    generations: list[Generation]
    turns: list[tuple[Turn, int | None, int]]  # turn, parent's number, generation's number
    steps: list[tuple[Step, int]]  # step, turn's number
    results: list[tuple[Result, int, int | None]]  # result, turn's number, step's number
    requests: list[tuple[ModelRequest, int | None]]  # request, turn's number
    last_request: tuple[bytes, int | None] | None


def _session(row: _Row) -> tuple[ChatSession, str]:
    session = ChatSession(
        title=row.text("title", limit=_max_length(ChatSession, "title")),
        model_name=row.text("model_name", limit=_max_length(ChatSession, "model_name"), blank=False),
        mode=row.choice("mode", Mode.values),
        next_result_number=row.number("next_result_number", minimum=1),
        next_turn_number=row.number("next_turn_number", minimum=1),
        generation_number=row.number("generation_number", minimum=1),
        revision=row.number("revision"),
        pending_breaks=row.objects("pending_breaks", _pending_break),
        created_at=row.moment("created_at") or timezone.now(),
    )
    return session, row.text("endpoint")


def _pending_break(row: _Row) -> PendingBreak:
    cause = row.choice("cause", [*_TURN_BREAKS, *_CAUSE_BREAKS])
    if cause in _CAUSE_BREAKS:
        row.only(("cause",))
        return {"cause": cause}
    row.only(("cause", "turn", "generation_changed"))
    return {"cause": cause, "turn": row.number("turn", minimum=1), "generation_changed": row.flag("generation_changed")}


def _tools(row: _Row, name: str) -> str:
    """The tools a generation lists, as the request sends them: a JSON list of functions, each with its name."""
    text = row.text(name)
    try:
        tools = json.loads(text)
    except (ValueError, RecursionError):
        tools = None
    if not isinstance(tools, list) or not all(
        isinstance(tool, dict)
        and isinstance(tool.get("function"), dict)
        and isinstance(tool["function"].get("name"), str)
        for tool in tools
    ):
        raise _fail(f"{row.where}.{name}", "a JSON list of tools, each a function with a name, is expected")
    return text


def _change(row: _Row) -> dict[str, object]:
    """One file an edit changed, as undo reads it to restore the file."""
    row.only(CHANGE_FIELDS)
    change = FileChange(
        path=row.text("path"),
        abs_path=row.text("abs_path", blank=False),
        action=_ACTIONS[row.choice("action", list(_ACTIONS))],
        sha256=row.text("sha256", limit=64),
        diff=row.text("diff"),
        lines=row.number("lines"),
        previous_sha256=row.text_or_none("previous_sha256"),
        previous_text=row.text_or_none("previous_text"),
    )
    return asdict(change)


def _generation(row: _Row) -> Generation:
    return Generation(
        number=row.number("number", minimum=1),
        system_prompt=row.text("system_prompt"),
        system_prompt_sha256=row.text("system_prompt_sha256", limit=64),
        tools_json=_tools(row, "tools_json"),
        mode=row.choice("mode", Mode.values),
        model_name=row.text("model_name", limit=_max_length(Generation, "model_name")),
        summary=row.text("summary"),
        table=row.text("table"),
        covers_through_turn=row.number_or_none("covers_through_turn"),
        taken_back=row.flag("taken_back"),
        revision=row.number("revision"),
        created_at=row.moment("created_at") or timezone.now(),
    )


def _turn(row: _Row) -> tuple[Turn, int | None, int]:
    turn = Turn(
        number=row.number("number", minimum=1),
        position=row.number("position", minimum=1),
        words=row.text("words"),
        message=row.text("message"),
        note_workspace=row.text("note_workspace", limit=_max_length(Turn, "note_workspace")),
        note_model=row.text("note_model", limit=_max_length(Turn, "note_model")),
        note_date=row.text("note_date", limit=_max_length(Turn, "note_date")),
        note_mode=row.choice("note_mode", Mode.values, blank=True),
        note_instructions=row.text_or_none("note_instructions"),
        mode=row.choice("mode", Mode.values),
        reply_text=row.text("reply_text"),
        status=row.choice("status", TurnStatus.values),
        error=row.text("error"),
        taken_back_by=row.choice("taken_back_by", TakenBackBy.values, blank=True),
        live_status=row.choice("live_status", TurnStatus.values, blank=True),
        taken_back_in=row.number_or_none("taken_back_in"),
        revision=row.number("revision"),
        started_at=row.moment("started_at") or timezone.now(),
        finished_at=row.moment("finished_at"),
    )
    return turn, row.number_or_none("parent", minimum=1), row.number("generation", minimum=1)


def _step(row: _Row) -> tuple[Step, int]:
    calls = row.listing("tool_calls")
    for index, call in enumerate(calls):
        if not isinstance(call, dict) or not all(isinstance(call.get(key), str) for key in ("id", "name", "arguments")):
            raise _fail(f"{row.where}.tool_calls[{index}]", "an object with id, name and arguments (strings)")
    step = Step(
        number=row.number("number", minimum=1),
        text=row.text("text"),
        reasoning=row.text("reasoning"),
        tool_calls=calls,
        finish_reason=row.text("finish_reason", limit=_max_length(Step, "finish_reason")),
        created_at=row.moment("created_at") or timezone.now(),
    )
    return step, row.number("turn", minimum=1)


def _result(row: _Row) -> tuple[Result, int, int | None]:
    result = Result(
        number=row.number("number", minimum=1),
        call_id=row.text("call_id", limit=_max_length(Result, "call_id")),
        tool=row.text("tool", limit=_max_length(Result, "tool")),
        arguments=row.json("arguments"),
        arguments_raw=row.text("arguments_raw"),
        args_key=row.text("args_key"),
        kind=row.choice("kind", ResultKind.values),
        full_text=row.text("full_text"),
        inserted_text=row.text("inserted_text"),
        refers_to=row.number_or_none("refers_to"),
        stale=row.numbers("stale", minimum=1),
        changed_files=row.objects("changed_files", _change),
        path=row.text("path"),
        abs_path=row.text("abs_path"),
        first_line=row.number_or_none("first_line"),
        last_line=row.number_or_none("last_line"),
        total_lines=row.number_or_none("total_lines"),
        sha256=row.text("sha256", limit=64),
        created_at=row.moment("created_at") or timezone.now(),
    )
    return result, row.number("turn", minimum=1), row.number_or_none("step", minimum=1)


def _request(row: _Row) -> tuple[ModelRequest, int | None]:
    request = ModelRequest(
        step_number=row.number("step_number"),
        kind=row.choice("kind", RequestKind.values),
        endpoint_url=row.text("endpoint_url", limit=_max_length(ModelRequest, "endpoint_url")),
        model_name=row.text("model_name", limit=_max_length(ModelRequest, "model_name")),
        body_sha256=row.text("body_sha256", limit=64),
        bytes_sent=row.number("bytes_sent"),
        shared_prefix_bytes=row.number("shared_prefix_bytes"),
        break_cause=row.choice("break_cause", BreakCause.values, blank=True),
        expected_shared_bytes=row.number("expected_shared_bytes"),
        status=row.choice("status", RequestStatus.values),
        error=row.text("error"),
        prompt_tokens=row.number_or_none("prompt_tokens"),
        cached_tokens=row.number_or_none("cached_tokens"),
        completion_tokens=row.number_or_none("completion_tokens"),
        time_to_first_token=row.real_or_none("time_to_first_token"),
        total_time=row.real_or_none("total_time"),
        usage=row.object_or_none("usage"),
        timings=row.object_or_none("timings"),
        started_at=row.moment("started_at") or timezone.now(),
        finished_at=row.moment("finished_at"),
    )
    return request, row.number_or_none("turn", minimum=1)


def _unique(numbers: list[int], where: str) -> set[int]:
    seen: set[int] = set()
    for number in numbers:
        if number in seen:
            raise _fail(where, f"{number} appears twice")
        seen.add(number)
    return seen


def _generations_checked(generations: list[Generation], turns: set[int], current: int) -> None:
    """As undo and compaction keep them: the first generation covers no turn, one that covers none is never taken
    back, a compaction covers a turn there is, and the session is in its newest live generation."""
    first = min(generations, key=lambda generation: generation.number)
    for index, generation in enumerate(generations):
        covers = generation.covers_through_turn
        if generation is first and covers is not None:
            raise _fail(f"generations[{index}].covers_through_turn", "the first generation covers no turn")
        if covers is None and generation.taken_back:
            raise _fail(f"generations[{index}].taken_back", "a generation that covers no turn is never taken back")
        if covers is not None and covers not in turns:
            raise _fail(f"generations[{index}].covers_through_turn", f"there is no turn {covers}")
    newest = max(generation.number for generation in generations if not generation.taken_back)
    if current != newest:
        raise _fail("session.generation_number", f"must be the newest live generation, {newest}")


def _checked(imported: _Imported) -> _Imported:
    """The links between rows hold: every number referred to exists, numbers are unique, counters run past."""
    generations = _unique([g.number for g in imported.generations], "generations")
    turns = _unique([turn.number for turn, _, _ in imported.turns], "turns")
    results = _unique([result.number for result, _, _ in imported.results], "results")
    session = imported.session
    if session.generation_number not in generations:
        raise _fail("session.generation_number", f"there is no generation {session.generation_number}")
    _generations_checked(imported.generations, turns, session.generation_number)
    for index, (turn, parent, generation) in enumerate(imported.turns):
        if parent is not None and (parent not in turns or parent >= turn.number):
            raise _fail(f"turns[{index}].parent", f"there is no earlier turn {parent}")
        if generation not in generations:
            raise _fail(f"turns[{index}].generation", f"there is no generation {generation}")
    steps: set[tuple[int, int]] = set()
    for index, (step, turn_number) in enumerate(imported.steps):
        if turn_number not in turns:
            raise _fail(f"steps[{index}].turn", f"there is no turn {turn_number}")
        if (turn_number, step.number) in steps:
            raise _fail(f"steps[{index}]", f"turn {turn_number} has two steps {step.number}")
        steps.add((turn_number, step.number))
    for index, (result, turn_number, step_number) in enumerate(imported.results):
        if turn_number not in turns:
            raise _fail(f"results[{index}].turn", f"there is no turn {turn_number}")
        if result.refers_to is not None and (result.refers_to not in results or result.refers_to >= result.number):
            raise _fail(f"results[{index}].refers_to", f"there is no earlier result {result.refers_to}")
        for at, number in enumerate(result.stale):
            if number not in results:
                raise _fail(f"results[{index}].stale[{at}]", f"there is no result {number}")
        if step_number is not None and (turn_number, step_number) not in steps:
            raise _fail(f"results[{index}].step", f"turn {turn_number} has no step {step_number}")
    for index, (_, request_turn) in enumerate(imported.requests):
        if request_turn is not None and request_turn not in turns:
            raise _fail(f"requests[{index}].turn", f"there is no turn {request_turn}")
    if results and session.next_result_number <= max(results):
        raise _fail("session.next_result_number", f"must be past the last result, {max(results)}")
    if turns and session.next_turn_number <= max(turns):
        raise _fail("session.next_turn_number", f"must be past the last turn, {max(turns)}")
    revisions = [session.revision, *(g.revision for g in imported.generations)]
    for turn, _, _ in imported.turns:
        revisions += [turn.revision, turn.taken_back_in or 0]
    session.revision = max(revisions)
    return imported


def parse_export(raw: bytes) -> _Imported:
    """The rows of an exported session, checked; :class:`ImportRejected` says what is wrong."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ImportRejected("This file is not text in UTF-8, so not a Cachet export.") from error
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise ImportRejected(f"This file is not valid JSON: {error}.") from error
    if not isinstance(value, dict) or value.get("format") != EXPORT_FORMAT:
        raise ImportRejected(f'This is not a Cachet session export (its "format" is not "{EXPORT_FORMAT}").')
    data = _Row(value, "")
    version = value.get("version")
    if version != EXPORT_VERSION:
        raise ImportRejected(f"This export has version {version!r}; this Cachet reads version {EXPORT_VERSION}.")
    session, endpoint_name = _session(_Row(data._get("session"), "session"))
    last = data._get("last_request")
    last_request = None
    if last is not None:
        row = _Row(last, "last_request")
        last_request = (row.text("body").encode(), row.number_or_none("turn", minimum=1))
    return _checked(
        _Imported(
            session=session,
            endpoint_name=endpoint_name,
            generations=_rows(data, "generations", _generation),
            turns=_rows(data, "turns", _turn),
            steps=_rows(data, "steps", _step),
            results=_rows(data, "results", _result),
            requests=_rows(data, "requests", _request),
            last_request=last_request,
        )
    )


def read_upload(file: IO[bytes], *, size: int, limit: int | None = None) -> bytes:
    """The uploaded file's bytes, refused past ``limit`` (``CACHET_IMPORT_MAX_BYTES``) with the sizes named."""
    limit = settings.CACHET_IMPORT_MAX_BYTES if limit is None else limit
    if size > limit:
        raise ImportRejected(f"The file is {size / 1_048_576:.1f} MB; an import is at most {limit // 1_048_576} MB.")
    raw = file.read(limit + 1)
    if len(raw) > limit:
        raise ImportRejected(f"The file is larger than {limit // 1_048_576} MB, the most an import takes.")
    return raw


def _bulk(model: type[Any], rows: list[Any], field: str) -> None:
    """Create ``rows``, then put back the times of ``field`` the file gives (creating sets them to now)."""
    times = [getattr(row, field) for row in rows]
    model.objects.bulk_create(rows, batch_size=BATCH)
    for row, moment in zip(rows, times, strict=True):
        setattr(row, field, moment)
    if rows:
        model.objects.bulk_update(rows, [field], batch_size=BATCH)


@transaction.atomic
def _store(imported: _Imported, *, owner: User, workspace: Workspace, endpoint: ModelEndpoint) -> ChatSession:
    session = imported.session
    created_at = session.created_at
    session.owner = owner
    session.workspace = workspace
    session.endpoint = endpoint
    session.save()
    if created_at is not None:
        ChatSession.objects.filter(pk=session.pk).update(created_at=created_at)
    for generation in imported.generations:
        generation.session = session
    _bulk(Generation, imported.generations, "created_at")
    generation_ids = {generation.number: generation.pk for generation in imported.generations}
    for turn, _, generation_number in imported.turns:
        turn.session = session
        turn.generation_id = generation_ids[generation_number]
    turns = [turn for turn, _, _ in imported.turns]
    _bulk(Turn, turns, "started_at")
    turn_ids = {turn.number: turn.pk for turn in turns}
    children = []
    for turn, parent, _ in imported.turns:
        if parent is not None:
            turn.parent_id = turn_ids[parent]
            children.append(turn)
    Turn.objects.bulk_update(children, ["parent"], batch_size=BATCH)
    for step, turn_number in imported.steps:
        step.turn_id = turn_ids[turn_number]
    steps = [step for step, _ in imported.steps]
    _bulk(Step, steps, "created_at")
    step_ids = {(turn_number, step.number): step.pk for step, turn_number in imported.steps}
    for result, turn_number, step_number in imported.results:
        result.session = session
        result.turn_id = turn_ids[turn_number]
        result.step_id = step_ids[(turn_number, step_number)] if step_number is not None else None
    _bulk(Result, [result for result, _, _ in imported.results], "created_at")
    for request, request_turn in imported.requests:
        request.session = session
        request.turn_id = turn_ids[request_turn] if request_turn is not None else None
    _bulk(ModelRequest, [request for request, _ in imported.requests], "started_at")
    if imported.last_request is not None:
        body, last_turn = imported.last_request
        LastRequest.objects.create(session=session, body=body, turn_number=last_turn)
    return session


def session_import(*, owner: User, workspace: Workspace, raw: bytes) -> ChatSession:
    """Recreate the session exported in ``raw`` for ``owner`` (never the exporter) on ``workspace``, which they
    must be allowed to use; on the endpoint of the exported one's name, else the default. All or nothing."""
    if not workspaces_for(user=owner).filter(pk=workspace.pk).exists():
        raise ImportRejected(f"You may not use the workspace {workspace.name}.")
    imported = parse_export(raw)
    endpoint = ModelEndpoint.objects.filter(name=imported.endpoint_name).first() or endpoint_default()
    if endpoint is None:
        raise ImportRejected("No model endpoint is configured; ask staff to add one in the admin.")
    try:
        return _store(imported, owner=owner, workspace=workspace, endpoint=endpoint)
    except DatabaseError as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ImportRejected(f"The file could not be stored ({reason}); nothing was imported.") from error
