"""Records of the requests sent to models: how much each shares with the one before, and why it breaks."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from sessions_app.models import BreakCause, ChatSession, LastRequest, ModelRequest, RequestStatus, Turn
from sessions_app.selectors.requests import BuiltRequest, PreviousRequest, image_spans
from sessions_app.services.durability import WITHOUT_WAITING, commit_without_waiting_for_disk
from sessions_app.services.rows import row_insert, row_stored, row_update_sql, row_values
from sessions_app.services.usage import usage_added_sql
from sessions_app.text import storable, storable_json
from sessions_app.types import PendingBreak

logger = logging.getLogger(__name__)


def shared_prefix_bytes(previous: bytes, current: bytes) -> int:
    """How many bytes, from the first, ``current`` has in common with ``previous``."""
    limit = min(len(previous), len(current))
    low, high = 0, limit
    while low < high:  # the first ``low`` bytes are known to match
        middle = (low + high + 1) // 2
        if previous[low:middle] == current[low:middle]:
            low = middle
        else:
            high = middle - 1
    return low


@dataclass(frozen=True)
class PrefixVerdict:
    shared_prefix_bytes: int
    expected_shared_bytes: int
    cause: str


def _break_boundary(pending: PendingBreak, built: BuiltRequest) -> int:
    """The byte offset up to which a request must still match the one before, given what happened."""
    cause = pending["cause"]
    if cause == BreakCause.MODEL_CHANGE:
        return 0
    if cause == BreakCause.COMPACTION or pending.get("generation_changed"):
        return built.message_offsets[0]
    first_taken_back = int(pending["turn"])
    earlier = [index for number, index in built.turn_user_index.items() if number < first_taken_back]
    if not earlier:
        return built.message_end(0)
    return built.message_end(max(earlier) + 1) if max(earlier) + 1 < len(built.messages) else len(built.body) - 2


def prefix_verdict(
    *,
    previous: bytes,
    built: BuiltRequest,
    previous_turn: int | None,
    pending: list[PendingBreak],
    previous_known: bool = True,
) -> PrefixVerdict:
    """Say whether ``built`` continues ``previous`` and, where it does not, whether the break is allowed."""
    shared = shared_prefix_bytes(previous, built.body)
    if not previous_known:
        return PrefixVerdict(shared, 0, BreakCause.RESTART)  # what was sent last is not known
    if not previous:
        return PrefixVerdict(shared, 0, BreakCause.FIRST)
    if any(item["cause"] == BreakCause.MODEL_CHANGE for item in pending):
        return PrefixVerdict(shared, 0, BreakCause.MODEL_CHANGE)  # the new model reads it all again
    if built.body.startswith(previous[:-2]):
        return PrefixVerdict(shared, len(previous) - 2, "")
    candidates: list[tuple[int, str]] = []
    for item in pending:
        candidates.append((_break_boundary(item, built), str(item["cause"])))
    if previous_turn is not None and previous_turn in built.turn_user_index:
        candidates.append((built.message_end(built.turn_user_index[previous_turn]), BreakCause.NEW_TURN))
    if not candidates:
        return PrefixVerdict(shared, len(previous) - 2, BreakCause.UNEXPECTED)
    boundary, cause = min(candidates)
    if shared < boundary:
        return PrefixVerdict(shared, boundary, BreakCause.UNEXPECTED)
    return PrefixVerdict(shared, boundary, cause)


def request_record_start(
    *,
    session: ChatSession,
    turn: Turn | None,
    step_number: int,
    kind: str,
    built: BuiltRequest,
    endpoint_url: str,
    model_name: str,
    previous: PreviousRequest,
    slot: int | None = None,
    moved: str = "",
    bytes_sent: int | None = None,
) -> tuple[ModelRequest, PreviousRequest]:
    """Write the request's row before it is sent, with its prefix verdict against ``previous``; the
    request becomes what the next one is compared with (its bytes are kept by :func:`request_last_keep`).
    ``bytes_sent`` is every byte of the body as sent (sampling settings and ``id_slot`` after the conversation),
    ``built.body`` where they are none. Its commit does not wait for the disk: the record of the answer before it,
    once it is sent, does. One
    statement, atomic by itself (``sessions_app.services.rows``), which also clears the session's pending breaks."""
    verdict = prefix_verdict(
        previous=previous.body,
        built=built,
        previous_turn=previous.turn_number,
        pending=list(previous.pending),
        previous_known=previous.known,
    )
    if verdict.cause == BreakCause.UNEXPECTED:
        log = logger.error if settings.DEBUG else logger.warning
        log(
            "session %s: request shares %d bytes with the one before, expected at least %d",
            session.pk,
            verdict.shared_prefix_bytes,
            verdict.expected_shared_bytes,
        )
    images = image_spans(built.body)
    request = ModelRequest(
        session=session,
        turn=turn,
        step_number=step_number,
        kind=kind,
        endpoint_url=storable(endpoint_url),
        slot=slot,
        moved=moved,
        model_name=storable(model_name),
        body_sha256=hashlib.sha256(built.body).hexdigest(),
        bytes_sent=len(built.body) if bytes_sent is None else bytes_sent,
        images=len(images),
        image_bytes=sum(end - start for start, end in images),
        shared_prefix_bytes=verdict.shared_prefix_bytes,
        expected_shared_bytes=verdict.expected_shared_bytes,
        break_cause=verdict.cause,
    )
    cleared = ""
    params: list[Any] = []
    if previous.pending:
        sessions = connection.ops.quote_name(ChatSession._meta.db_table)
        cleared = f"WITH cleared AS (UPDATE {sessions} SET pending_breaks = '[]' WHERE id = %s) "
        params.append(session.pk)
    with connection.cursor() as cursor:
        cursor.execute(
            f"{cleared}{row_insert(ModelRequest).sql} RETURNING id, {WITHOUT_WAITING}",
            [*params, *row_values(request)],
        )
        row = cursor.fetchone()
    assert row is not None, "an insert returns its row"
    row_stored(request, int(row[0]))
    if previous.pending:
        session.pending_breaks = []
    turn_number = turn.number if turn is not None else None
    return request, PreviousRequest(body=built.body, turn_number=turn_number, pending=())


@transaction.atomic
def request_last_keep(*, session: ChatSession, last: PreviousRequest) -> None:
    """Keep the bytes of the session's last request for the next action to compare with: once as an action
    ends, not at every request (at 1,000 turns they are 300 KB, 10 ms to write)."""
    commit_without_waiting_for_disk()
    LastRequest.objects.bulk_create(
        [LastRequest(session=session, body=last.body, turn_number=last.turn_number)],
        update_conflicts=True,
        unique_fields=["session"],
        update_fields=["body", "turn_number"],
    )


def request_record_finish(
    *,
    request: ModelRequest,
    prompt_tokens: int | None,
    cached_tokens: int | None,
    completion_tokens: int | None,
    time_to_first_token: float | None,
    total_time: float | None,
    usage: dict[str, Any] | None,
    timings: dict[str, Any] | None,
    error: str = "",
    wait_for_disk: bool = False,
) -> ModelRequest:
    """Complete the row with what the server reported; an ``error`` marks it failed; the request is added to its
    person's usage of the day (``UsageDay``). With ``wait_for_disk`` its commit brings to the disk everything
    committed before it without waiting. One statement."""
    request.prompt_tokens = prompt_tokens
    request.cached_tokens = cached_tokens
    request.completion_tokens = completion_tokens
    request.time_to_first_token = time_to_first_token
    request.total_time = total_time
    request.usage = None if usage is None else storable_json(usage)
    request.timings = None if timings is None else storable_json(timings)
    request.error = storable(error)
    request.status = RequestStatus.FAILED if error else RequestStatus.DONE
    request.finished_at = timezone.now()
    fields = [
        "prompt_tokens",
        "cached_tokens",
        "completion_tokens",
        "time_to_first_token",
        "total_time",
        "usage",
        "timings",
        "error",
        "status",
        "finished_at",
    ]
    statement, values = usage_added_sql(*row_update_sql(request, fields), request)
    with connection.cursor() as cursor:
        cursor.execute(statement if wait_for_disk else f"{statement} RETURNING {WITHOUT_WAITING}", values)
    return request


@transaction.atomic
def request_record_cache_check(
    *,
    request: ModelRequest,
    expected_cached_tokens: int,
    miss: str,
    tokens_lost: int,
    message: int | None = None,
    before: str = "",
    after: str = "",
) -> ModelRequest:
    """Add the cache check to ``request``'s row: the tokens Cachet expected cached and, where the server
    reused fewer, the miss's class (harness, template or server), the tokens lost and, for a template, the
    first message rendered differently with both renderings."""
    request.expected_cached_tokens = expected_cached_tokens
    request.cache_miss = miss
    request.cache_miss_tokens = tokens_lost if miss else None
    request.cache_miss_message = message if miss else None
    request.cache_miss_before = storable(before) if miss else ""
    request.cache_miss_after = storable(after) if miss else ""
    request.save(
        update_fields=[
            "expected_cached_tokens",
            "cache_miss",
            "cache_miss_tokens",
            "cache_miss_message",
            "cache_miss_before",
            "cache_miss_after",
        ]
    )
    return request
