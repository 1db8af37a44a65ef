"""The context window as the server says it, and a request's size in tokens before it is sent."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from chat.agent import server_api
from chat.agent.budget import CountedSize, RequestCounter, RequestTooLarge, endpoint_window, window_of
from sessions_app.models import ChatSession, ModelEndpoint
from sessions_app.selectors.requests import build_request
from testing.scripted_server import ScriptedServer, render_prompt, tokenize

pytestmark = pytest.mark.django_db


def _endpoint(server: ScriptedServer, *, configured: int = 8192) -> ModelEndpoint:
    return ModelEndpoint.objects.create(name="small", base_url=server.base_url, context_window=configured)


def test_the_window_is_read_from_props_and_kept_a_while() -> None:
    with ScriptedServer(n_ctx=4096) as small:
        endpoint = _endpoint(small)
        window = endpoint_window(endpoint)
        assert (window.tokens, window.configured, window.read) == (4096, 8192, 4096)
        assert ModelEndpoint.objects.get(pk=endpoint.pk).window == 4096, "kept with the endpoint"
        small.n_ctx = 2048
        assert endpoint_window(endpoint).tokens == 4096, "not asked again on every request"
        ModelEndpoint.objects.filter(pk=endpoint.pk).update(server_window_read_at=timezone.now() - timedelta(hours=1))
        assert endpoint_window(ModelEndpoint.objects.get(pk=endpoint.pk)).tokens == 2048, "asked again after a while"
        assert endpoint_window(endpoint, refresh=True).tokens == 2048


def test_a_changed_url_is_asked_again_and_a_server_that_does_not_say_leaves_the_configured_window() -> None:
    with ScriptedServer(n_ctx=4096) as small, ScriptedServer(n_ctx=2048, server_api=False) as quiet:
        endpoint = _endpoint(small, configured=3000)
        assert endpoint_window(endpoint).tokens == 4096
        endpoint.base_url = quiet.base_url
        endpoint.save()
        assert window_of(endpoint).tokens == 3000, "what another URL said does not count"
        window = endpoint_window(endpoint)
        assert (window.tokens, window.read, window.source) == (3000, None, "configured")


def test_an_unreachable_server_keeps_what_was_read() -> None:
    with ScriptedServer(n_ctx=4096) as small:
        endpoint = _endpoint(small)
        endpoint_window(endpoint)
    server_api.forget(small.base_url)
    assert endpoint_window(endpoint, refresh=True, timeout=1.0).tokens == 4096


def test_a_request_is_counted_with_the_servers_tokenizer(chat_session: ChatSession) -> None:
    with ScriptedServer(n_ctx=50_000) as small:
        ModelEndpoint.objects.filter(pk=chat_session.endpoint_id).update(base_url=small.base_url)
        session = ChatSession.objects.select_related("endpoint").get(pk=chat_session.pk)
        counter = RequestCounter(session, window=endpoint_window(session.endpoint))
        built = build_request(session, current=None, model_name="scripted", extra_user="hello there")
        size = counter.count(built)
    assert size == CountedSize(len(tokenize(render_prompt(json.loads(built.body)))), "tokenizer")


def test_without_a_tokenizer_the_size_is_estimated_from_the_last_usage(chat_session: ChatSession) -> None:
    with ScriptedServer(n_ctx=50_000, server_api=False) as quiet:
        ModelEndpoint.objects.filter(pk=chat_session.endpoint_id).update(base_url=quiet.base_url)
        session = ChatSession.objects.select_related("endpoint").get(pk=chat_session.pk)
        counter = RequestCounter(session, window=endpoint_window(session.endpoint))
        first = build_request(session, current=None, model_name="scripted", extra_user="hello")
        before = counter.count(first)
        assert before.how == "guess"
        assert before.tokens == -(-len(first.body) // 3), "the default ratio before any usage"
        actual = len(tokenize(render_prompt(json.loads(first.body))))
        counter.learned(first.body, actual)
        longer = build_request(session, current=None, model_name="scripted", extra_user="hello " + "word " * 300)
        counted = counter.count(longer)
        assert counted.how == "estimate"
        estimate = counted.tokens
    real = len(tokenize(render_prompt(json.loads(longer.body))))
    assert abs(estimate - real) / real < 0.15, (estimate, real)


def test_room_for_the_answer_and_the_message_when_nothing_fits(chat_session: ChatSession, settings: Any) -> None:
    with ScriptedServer(n_ctx=2000) as small:
        ModelEndpoint.objects.filter(pk=chat_session.endpoint_id).update(base_url=small.base_url)
        session = ChatSession.objects.select_related("endpoint").get(pk=chat_session.pk)
        counter = RequestCounter(session, window=endpoint_window(session.endpoint))
    assert counter.answer_room == 400, "at most the share above the compaction threshold"
    assert counter.fits(CountedSize(1600, "tokenizer")) and not counter.fits(CountedSize(1601, "tokenizer"))
    assert counter.past_threshold(CountedSize(1601, "estimate")) and not counter.past_threshold(
        CountedSize(1600, "estimate")
    )
    read = session.endpoint.server_window_read_at
    assert read is not None
    assert str(counter.too_large(CountedSize(5000, "tokenizer"))) == (
        "This request needs 5,000 tokens and room for the answer; the model's context window is 2,000 tokens, read "
        f"from the server (llama.cpp /props n_ctx) at {read:%H:%M} UTC on {read:%Y-%m-%d}. Compact now, start a new "
        "session, or use a model with a larger window."
    )
    assert str(RequestTooLarge(5000, 2000)) == (
        "This request needs 5,000 tokens and room for the answer; the model's context window is 2,000 tokens, as "
        "configured. Compact now, start a new session, or use a model with a larger window."
    )


def test_well_below_the_window_a_measured_estimate_is_not_checked_with_the_server(chat_session: ChatSession) -> None:
    with ScriptedServer(n_ctx=3000) as small:
        ModelEndpoint.objects.filter(pk=chat_session.endpoint_id).update(base_url=small.base_url)
        session = ChatSession.objects.select_related("endpoint").get(pk=chat_session.pk)
        counter = RequestCounter(session, window=endpoint_window(session.endpoint))
        first = build_request(session, current=None, model_name="scripted", extra_user="hello")
        assert counter.count(first).how == "tokenizer", "nothing measured yet"
        counter.learned(first.body, len(tokenize(render_prompt(json.loads(first.body)))))
        assert counter.count(first).how == "estimate", "well below 70 % of the window"
        near = build_request(session, current=None, model_name="scripted", extra_user="word, " * 400)
        assert counter.count(near).how == "tokenizer", "near the threshold the server's count decides"


def _with_image(text: str, data: str) -> bytes:
    part = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}
    message = {"role": "user", "content": [{"type": "text", "text": text}, part]}
    return json.dumps({"messages": [message]}, separators=(",", ":")).encode()


def test_an_image_counts_its_estimate_in_tokens_not_its_bytes() -> None:
    """A megabyte of base64 is a model's few hundred or thousand tokens, not a third of a million."""
    from chat.agent.budget import estimate_tokens

    body = _with_image("x" * 300, "A" * 1_000_000)
    plain = _with_image("x" * 300, "")
    alone = estimate_tokens(body, last_body=b"", last_tokens=0, bytes_per_token=3.0, image_tokens=1500)
    assert alone == estimate_tokens(plain, last_body=b"", last_tokens=0, bytes_per_token=3.0) + 1500
    # the next request shares the image with the last: its tokens are the usage's, the new text at the ratio
    longer = body[:-3] + b',{"role":"assistant","content":"' + b"y" * 300 + b'"}]}'
    measured = estimate_tokens(longer, last_body=body, last_tokens=1700, bytes_per_token=3.0, image_tokens=1500)
    assert 1700 <= measured <= 1700 + 120


def test_the_ratio_of_bytes_to_tokens_leaves_images_out(chat_session: ChatSession) -> None:
    counter = RequestCounter(chat_session, window=window_of(chat_session.endpoint))
    counter.learned(_with_image("x" * 3000, "A" * 600_000), 2500)
    assert 2.5 < counter.bytes_per_token < 4.0  # 3,000 bytes of text for the 1,000 tokens left after the image's
