"""What a web process shows its tabs of each typed event (``chat.wire``): the page messages (``chat.web.messages``)
that bring a chat page up to date.

Streamed text goes on as it came, with its offset (the page appends it and renders its markdown itself); stored
things travel as ids and are rendered here from the store, once per process and event however many tabs of the
session the process serves (the last few renderings are kept for the tabs that get the same event after).
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from django.core.exceptions import ObjectDoesNotExist

from chat.web import chart, fragments, queueing
from chat.web.display import CompactionView, row_for_result, single_turn, started_turn, step_view, transcript_page
from chat.web.messages import Op, live_messages, pack
from chat.web.socket_store import store_call
from chat.web.sync import chart_page_put
from sessions_app.models import ChatSession, Generation, ModelRequest, RequestKind, Result, Step, Turn
from sessions_app.selectors.sessions import session_by_id
from sessions_app.selectors.totals import RequestTotals

logger = logging.getLogger(__name__)

COMPACTING = "Compacting…"
TITLING = "Writing a title…"
KEPT_RENDERINGS = 64

Event = Mapping[str, Any]


def _model_text(session: ChatSession) -> str:
    return f"The model is now {session.model_name}: the next request reads the conversation again."


# --- events shown without the store -------------------------------------------------------------------------


def _text(event: Event) -> list[str]:
    return list(live_messages(turn=event["turn"], step=event["step"], text=event["text"], text_at=event["at"]))


def _reasoning(event: Event) -> list[str]:
    return list(
        live_messages(turn=event["turn"], step=event["step"], reasoning=event["text"], reasoning_at=event["at"])
    )


def _tool_called(event: Event) -> list[str]:
    return list(live_messages(turn=event["turn"], step=event["step"], calls=[event["name"]]))


def _live(event: Event) -> list[str]:
    return list(
        live_messages(
            turn=event["turn"],
            step=event["step"],
            text=event["text"],
            reasoning=event["reasoning"],
            calls=event["calls"],
            reset=True,
        )
    )


def _request_started(event: Event) -> list[str]:
    label = {RequestKind.COMPACTION: COMPACTING, RequestKind.TITLE: TITLING}.get(event["kind"])
    if label is None:
        return []
    return pack([fragments.controls_put(running=True, label=label)])


def _job(event: Event) -> list[str]:
    # "queued" comes from the web process that queued the job, "running" and "idle" from the worker: where the
    # worker ran a short reply before the queueing process's message went out, "queued" came last and the page
    # stayed queued after the reply had ended.
    job = event["job"]
    if event["state"] == "queued" and queueing.job_begun(job):
        return []
    if event["state"] != "queued" and job:
        queueing.job_heard(job, event["state"])
    return pack([fragments.controls_put(running=event["state"] != "idle", label=event["label"])])


def _notice(event: Event) -> list[str]:
    return pack([fragments.notice_put(event["text"], level=event["level"], lines=event["lines"])])


def _words_back(event: Event) -> list[str]:
    return pack([fragments.composer_put(event["words"])])


def _taken_back(event: Event) -> list[str]:
    ops: list[Op] = [fragments.turn_remove(number) for number in event["numbers"]]
    ops.extend(fragments.compaction_remove(number) for number in event["compactions"])
    return pack(ops, rev=event["revision"])


def _nothing(event: Event) -> list[str]:
    return []


# --- events rendered from the store --------------------------------------------------------------------------


def _turn_started(event: Event) -> list[str]:
    turn = Turn.objects.select_related("session").get(pk=event["turn"])
    session = turn.session
    ops: list[Op] = [
        fragments.turn_put(started_turn(turn)),
        fragments.title_put(session),
        fragments.sidebar_title_put(session),
        fragments.attachments_put(session),
    ]
    return pack(ops, rev=event["revision"])


def _bar_put(event: Event) -> list[Op]:
    """The bar of the event's request, where the event says it stands, and the axis titles with the window it was
    drawn against (one query)."""
    request = ModelRequest.objects.select_related("session__endpoint", "turn").get(pk=event["request"])
    bar = chart.Bar(event["bar"], request, event["previous_ttft"])
    window = fragments.chart_window(request.session)
    return [fragments.bar_put(bar, window=window), fragments.axis_put(window)]


def _request_finished(event: Event) -> list[str]:
    totals = RequestTotals(
        requests=event["totals_requests"],
        prompt_tokens=event["totals_prompt_tokens"],
        cached_tokens=event["totals_cached_tokens"],
        prompt_seconds=event["totals_prompt_seconds"],
        timed_tokens=event["totals_timed_tokens"],
        timed_seconds=event["totals_timed_seconds"],
    )
    return pack([*_bar_put(event), fragments.summary_put(totals), fragments.headline_put(totals)])


def _cache_checked(event: Event) -> list[str]:
    return pack(_bar_put(event))


def _step_stored(event: Event) -> list[str]:
    step = Step.objects.select_related("turn").get(pk=event["step"])
    turn = step.turn
    put = fragments.step_put(step_view(step, []), session_id=turn.session_id, turn_number=turn.number, open=True)
    # the live area moves on to the next step: what it showed of this one is stored now
    return [*pack([put], rev=event["revision"]), *live_messages(turn=turn.number, step=step.number + 1)]


def _result_stored(event: Event) -> list[str]:
    result = Result.objects.get(pk=event["result"])
    row = row_for_result(result)
    if row is None:
        return []
    return pack([fragments.row_put(row, session_id=result.session_id)], rev=event["revision"])


def _turn_ended(event: Event) -> list[str]:
    turn = Turn.objects.get(pk=event["turn"])
    return pack([fragments.turn_put(single_turn(turn, running=False))], rev=event["revision"])


def _branch_flipped(event: Event) -> list[str]:
    session = session_by_id(session_id=event["session"])
    page = transcript_page(session, running=False)
    return pack([fragments.transcript_put(page, session_id=session.pk)], rev=event["revision"])


def _compacted(event: Event) -> list[str]:
    generation = Generation.objects.get(pk=event["generation"])
    return pack([fragments.compaction_put(CompactionView(generation))], rev=event["revision"])


def _titled(event: Event) -> list[str]:
    session = session_by_id(session_id=event["session"])
    return pack([fragments.title_put(session), fragments.sidebar_title_put(session)])


def _mode_set(event: Event) -> list[str]:
    return pack([fragments.mode_put(session_by_id(session_id=event["session"]))])


def _model_changed(event: Event) -> list[str]:
    session = session_by_id(session_id=event["session"])
    ops = [fragments.model_put(session), fragments.notice_put(_model_text(session)), chart_page_put(session)]
    return pack(ops, rev=event["revision"])


Shown = Callable[[Event], list[str]]

AT_ONCE: dict[str, Shown] = {
    "text": _text,
    "reasoning": _reasoning,
    "tool_called": _tool_called,
    "live": _live,
    "request_started": _request_started,
    "job": _job,
    "notice": _notice,
    "words_back": _words_back,
    "turns_taken_back": _taken_back,
    "job_ended": _nothing,
}
FROM_STORE: dict[str, Shown] = {
    "turn_started": _turn_started,
    "request_finished": _request_finished,
    "cache_checked": _cache_checked,
    "step_stored": _step_stored,
    "result_stored": _result_stored,
    "turn_ended": _turn_ended,
    "branch_flipped": _branch_flipped,
    "compacted": _compacted,
    "titled": _titled,
    "mode_set": _mode_set,
    "model_changed": _model_changed,
}
_kept: OrderedDict[str, list[str]] = OrderedDict()  # the last renderings of events from the store, by event


def _from_store(name: str, event: Event) -> list[str]:
    key = json.dumps(event, sort_keys=True)
    kept = _kept.get(key)
    if kept is not None:
        _kept.move_to_end(key)
        return kept
    try:
        messages = FROM_STORE[name](event)
    except ObjectDoesNotExist:
        return []  # gone meanwhile (the session deleted): nothing to show
    _kept[key] = messages
    while len(_kept) > KEPT_RENDERINGS:
        _kept.popitem(last=False)
    return messages


async def page_messages(event: Event) -> list[str]:
    """The messages that show ``event`` (a checked event) on a tab of its session."""
    name = event["event"]
    at_once = AT_ONCE.get(name)
    if at_once is not None:
        return at_once(event)
    if name in FROM_STORE:
        return await store_call(_from_store)(name, event)
    logger.warning("no page messages for the event %r", name)
    return []
