"""A session's requests added up: in one query, as the page adds them one by one, and per session for a list."""

from __future__ import annotations

from functools import reduce

import pytest

from chat.agent.loop import ReplyLoop
from chat.web.chart import headline_text, summary_text
from sessions_app.models import ChatSession, ModelRequest
from sessions_app.selectors.totals import RequestTotals, session_totals, with_totals
from testing.scripted_server import ScriptedServer, Step
from tests.agent.loop_helpers import run

pytestmark = pytest.mark.django_db


def test_one_query_adds_up_what_the_page_adds_one_by_one(live_session: ChatSession, model: ScriptedServer) -> None:
    assert session_totals(live_session) == RequestTotals()
    assert summary_text(RequestTotals()) == "No requests yet."
    model.push(Step(text="Reading.", tool_calls=[("read", {"path": "notes.md"})]), Step(text="30 lines."))
    run(ReplyLoop(live_session).send("How long are the notes?"))
    model.push(Step(text="Still 30."))
    run(ReplyLoop(ChatSession.objects.get(pk=live_session.pk)).send("And now?"))
    requests = list(ModelRequest.objects.filter(session=live_session).order_by("id"))
    one_by_one = reduce(RequestTotals.plus, requests, RequestTotals())
    totals = session_totals(live_session)
    assert totals.requests == 3 and totals.prompt_tokens == sum(r.prompt_tokens or 0 for r in requests)
    assert totals.cached_tokens == sum(r.cached_tokens or 0 for r in requests) > 0
    assert (totals.requests, totals.prompt_tokens, totals.cached_tokens, totals.timed_tokens) == (
        one_by_one.requests,
        one_by_one.prompt_tokens,
        one_by_one.cached_tokens,
        one_by_one.timed_tokens,
    )
    assert totals.prompt_seconds == pytest.approx(one_by_one.prompt_seconds)
    assert totals.timed_tokens > 0 and totals.saved_seconds is not None, "the scripted server times its prompts"
    line = summary_text(totals)
    assert line.startswith(f"3 requests · {totals.prompt_tokens:,} prompt tokens, ")
    assert f"the cache saved {totals.cached_tokens:,} tokens, about " in line
    listed = with_totals(ChatSession.objects.filter(pk=live_session.pk)).get()
    figures = tuple(getattr(listed, name) for name in ("request_count", "prompt_sum", "cached_sum"))
    assert figures == (3, totals.prompt_tokens, totals.cached_tokens)


def test_without_the_servers_own_timing_no_speed_is_claimed() -> None:
    totals = RequestTotals(requests=2, prompt_tokens=1000, cached_tokens=800, prompt_seconds=1.5)
    assert totals.saved_seconds is None and totals.processed_tokens == 200
    assert summary_text(totals) == "2 requests · 1,000 prompt tokens, 80 % cached · 200 processed in 1.5 s · " + (
        "the cache saved 800 tokens"
    )


def test_the_headline_says_the_requests_and_the_share_cached_in_a_few_words() -> None:
    assert headline_text(RequestTotals()) == "No requests yet"
    assert headline_text(RequestTotals(requests=1)) == "1 request"
    assert headline_text(RequestTotals(requests=1234, prompt_tokens=1000, cached_tokens=805)) == (
        "1,234 requests · 80 % cached"
    )
