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
import sys
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
    ModelEndpoint,
    ModelRequest,
    Result,
    Step,
    Turn,
    Workspace,
)
from sessions_app.selectors.exports import (
    EXPORT_FORMAT,
    EXPORT_VERSION,
    GENERATIONS,
    REQUESTS,
    RESULTS,
    SESSION,
    STEPS,
    TURNS,
    Field,
    Table,
)
from sessions_app.selectors.sessions import endpoint_default, workspaces_for
from sessions_app.text import storable, storable_json
from sessions_app.types import PendingBreak

BATCH = 500
T = TypeVar("T")
CHANGE_FIELDS = tuple(field.name for field in fields(FileChange))
IMPORTED = " (imported)"
TITLE_LENGTH = 200  # ChatSession.title's max_length
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
            if name not in names and name.isidentifier():
                raise _fail(f"{self.where}.{name}", "not a field of this object")
            if name not in names:  # a name that cannot be part of a place: said in the message, quoted
                raise _fail(self.where, f"{json.dumps(name)} is not a field of this object")

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

    def real_or_none(self, name: str, *, maximum: float | None = None) -> float | None:
        value = self._get(name)
        if value is None:
            return None
        highest = sys.float_info.max if maximum is None else maximum
        if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= highest < math.inf:
            expected = "a number from 0" if maximum is None else f"a number from 0 to {maximum:g}"
            raise _fail(f"{self.where}.{name}", f"{expected} is expected")
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


def _read(row: _Row, field: Field, table: Table) -> Any:
    """The value of ``field`` in ``row``, checked as the table says."""
    name, kind = field.name, field.kind
    if field.nullable and kind in ("text", "whole") and row._get(name) is None:
        return None
    match kind:
        case "text":
            return row.text(name, limit=table.longest(field), blank=field.blank)
        case "choice":
            return row.choice(name, list(field.choices), blank=field.blank)
        case "whole":
            return row.number(name, minimum=field.minimum)
        case "real":
            return row.real_or_none(name, maximum=field.maximum)
        case "flag":
            return row.flag(name)
        case "json":
            return row.json(name)
        case "object":
            return row.object_or_none(name)
        case "moment":
            moment = row.moment(name)
            return moment if moment is not None or field.nullable else timezone.now()
        case "tools":
            return _tools(row, name)
        case "calls":
            return _calls(row, name)
        case "numbers":
            return row.numbers(name, minimum=field.minimum)
        case "breaks":
            return row.objects(name, _pending_break)
        case "changes":
            return row.objects(name, _change)


def _fields(row: _Row, table: Table) -> tuple[dict[str, Any], dict[str, Any]]:
    """The row's own fields (for its model) and its links to other rows, each read as ``table`` says."""
    own: dict[str, Any] = {}
    links: dict[str, Any] = {}
    for field in table.fields:
        if not field.imported:
            continue
        if field.added and field.name not in row.value:  # a file written before the field was added
            (links if field.is_link else own)[field.name] = field.absent
            continue
        (links if field.is_link else own)[field.name] = _read(row, field, table)
    return own, links


def _session(row: _Row) -> tuple[ChatSession, str]:
    own, links = _fields(row, SESSION)
    return ChatSession(**own), links["endpoint"]


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


def _calls(row: _Row, name: str) -> list[Any]:
    """A step's tool calls, as requests send them again: each an object with its id, name and arguments."""
    calls = row.listing(name)
    for index, call in enumerate(calls):
        if not isinstance(call, dict) or not all(isinstance(call.get(key), str) for key in ("id", "name", "arguments")):
            raise _fail(f"{row.where}.{name}[{index}]", "an object with id, name and arguments (strings)")
    return calls


def _generation(row: _Row) -> Generation:
    own, _ = _fields(row, GENERATIONS)
    return Generation(**own)


def _turn(row: _Row) -> tuple[Turn, int | None, int]:
    own, links = _fields(row, TURNS)
    return Turn(**own), links["parent"], links["generation"]


def _step(row: _Row) -> tuple[Step, int]:
    own, links = _fields(row, STEPS)
    return Step(**own), links["turn"]


def _result(row: _Row) -> tuple[Result, int, int | None]:
    own, links = _fields(row, RESULTS)
    return Result(**own), links["turn"], links["step"]


def _request(row: _Row) -> tuple[ModelRequest, int | None]:
    own, links = _fields(row, REQUESTS)
    return ModelRequest(**own), links["turn"]


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
    session, endpoint_name = _session(_Row(data._get(SESSION.name), SESSION.name))
    last = data._get("last_request")
    last_request = None
    if last is not None:
        row = _Row(last, "last_request")
        last_request = (row.text("body").encode(), row.number_or_none("turn", minimum=1))
    return _checked(
        _Imported(
            session=session,
            endpoint_name=endpoint_name,
            generations=_rows(data, GENERATIONS.name, _generation),
            turns=_rows(data, TURNS.name, _turn),
            steps=_rows(data, STEPS.name, _step),
            results=_rows(data, RESULTS.name, _result),
            requests=_rows(data, REQUESTS.name, _request),
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
    if ChatSession.objects.filter(owner=owner, title=session.shown_title, deleted_at__isnull=True).exists():
        session.title = f"{session.shown_title[: TITLE_LENGTH - len(IMPORTED)]}{IMPORTED}"  # not two of one name
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
