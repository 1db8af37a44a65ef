"""Event stream decoding and chunk assembly, without a server."""

from __future__ import annotations

import json

import httpx
import pytest

from chat.agent.model import (
    ModelHTTPError,
    ModelProtocolError,
    ModelStreamCut,
    ReasoningPiece,
    SSEDecoder,
    SSEEvent,
    StreamAssembler,
    TextPiece,
    Timeouts,
    ToolCall,
    ToolCallPiece,
    stream_chat,
)
from chat.agent.model.assembly import joined
from tests.agent.mc_helpers import bytewise, delta_chunk, mock_client, sse

FAST = Timeouts(connect=2.0, first_token=5.0, between_chunks=5.0)


def decode(parts: list[bytes]) -> list[SSEEvent]:
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    for part in parts:
        events.extend(decoder.feed(part))
    return events + decoder.close()


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_line_ends(newline: str) -> None:
    body = f': ping{newline}data: {{"a": 1}}{newline}{newline}data: [DONE]{newline}{newline}'.encode()
    assert decode([body]) == [SSEEvent("message", '{"a": 1}'), SSEEvent("message", "[DONE]")]
    assert decode(bytewise(body)) == decode([body])


def test_events_split_anywhere_including_inside_utf8() -> None:
    body = sse({"text": "héllo ✓ 𝄞"}, "[DONE]", newline="\r\n")
    whole = decode([body])
    assert json.loads(whole[0].data) == {"text": "héllo ✓ 𝄞"}
    for cut in range(1, len(body)):
        assert decode([body[:cut], body[cut:]]) == whole


def test_comments_fields_and_multiline_data() -> None:
    body = b": keep-alive\n\nevent: error\nid: 7\nretry: 100\ndata: line one\ndata:line two\n\n"
    assert decode([body]) == [SSEEvent("error", "line one\nline two")]


def test_missing_blank_line_between_complete_events() -> None:
    body = b'data: {"a": 1}\ndata: {"b": 2}\ndata: [DONE]\n'
    assert [e.data for e in decode([body])] == ['{"a": 1}', '{"b": 2}', "[DONE]"]


def test_last_event_without_terminator_is_kept() -> None:
    assert decode([b"data: [DONE]"]) == [SSEEvent("message", "[DONE]")]


def test_invalid_utf8_raises() -> None:
    with pytest.raises(UnicodeDecodeError):
        decode([b"data: \xff\xfe\n\n"])


def test_ollama_whole_calls_without_index() -> None:
    assembler = StreamAssembler()
    calls = [
        {"id": "call_a", "function": {"name": "read", "arguments": {"path": "a.py"}}},
        {"id": "call_b", "function": {"name": "grep", "arguments": '{"pattern": "x"}'}},
    ]
    assert assembler.add(delta_chunk({"role": "assistant", "content": "", "tool_calls": calls}))
    assembler.add(delta_chunk({"tool_calls": [{"id": "call_c", "function": {"name": "list", "arguments": {}}}]}))
    assembler.add(delta_chunk({}, finish_reason="tool_calls"))
    done = assembler.completion(time_to_first_token=None, total_time=0.0)
    assert done.tool_calls == [
        ToolCall(0, "call_a", "read", '{"path": "a.py"}'),
        ToolCall(1, "call_b", "grep", '{"pattern": "x"}'),
        ToolCall(2, "call_c", "list", "{}"),
    ]
    assert [piece.name for piece in assembler.take_pieces() if isinstance(piece, ToolCallPiece)] == [
        "read",
        "grep",
        "list",
    ]
    assert done.finish_reason == "tool_calls"


def test_fragments_by_index_with_repeated_id() -> None:
    assembler = StreamAssembler()
    assembler.add(delta_chunk({"tool_calls": [{"index": 1, "id": "c1", "function": {"name": "b", "arguments": ""}}]}))
    assembler.add(delta_chunk({"tool_calls": [{"index": 0, "id": "c0", "function": {"name": "a", "arguments": "{"}}]}))
    assembler.add(delta_chunk({"tool_calls": [{"index": 1, "id": "c1", "function": {"arguments": '{"x"'}}]}))
    assembler.add(delta_chunk({"tool_calls": [{"index": 1, "function": {"arguments": ": 1}"}}]}))
    assembler.add(delta_chunk({"tool_calls": [{"index": 0, "id": "c0", "function": {"arguments": "}"}}]}))
    done = assembler.completion(time_to_first_token=None, total_time=0.0)
    assert done.tool_calls == [ToolCall(0, "c0", "a", "{}"), ToolCall(1, "c1", "b", '{"x": 1}')]


def test_index_less_fragments_continue_the_last_call() -> None:
    assembler = StreamAssembler()
    assembler.add(delta_chunk({"tool_calls": [{"id": "c", "function": {"name": "read", "arguments": '{"pa'}}]}))
    assembler.add(delta_chunk({"tool_calls": [{"function": {"arguments": 'th": 1}'}}]}))
    assembler.add(delta_chunk({"tool_calls": [{"id": "c", "function": {"arguments": ""}}]}))
    done = assembler.completion(time_to_first_token=None, total_time=0.0)
    assert done.tool_calls == [ToolCall(0, "c", "read", '{"path": 1}')]


def test_reasoning_field_names_are_not_doubled() -> None:
    assembler = StreamAssembler()
    assembler.add(delta_chunk({"reasoning_content": "a", "reasoning": "a"}))
    assembler.add(delta_chunk({"reasoning": "b"}))
    assembler.add(delta_chunk({"reasoning_content": None, "reasoning": "c", "content": None}))
    done = assembler.completion(time_to_first_token=None, total_time=0.0)
    assert done.reasoning == "abc"
    assert done.text == ""


def test_role_delta_is_no_token() -> None:
    assembler = StreamAssembler()
    assert not assembler.add(delta_chunk({"role": "assistant", "content": None}))
    assert not assembler.add(delta_chunk({"content": ""}))
    assert assembler.add(delta_chunk({"content": "x"}))


def finish(usage_chunk: dict[str, object]) -> StreamAssembler:
    assembler = StreamAssembler()
    assembler.add(delta_chunk({"content": "hi"}, usage=None))
    assembler.add(delta_chunk({}, finish_reason="stop"))
    assembler.add({"choices": [], **usage_chunk})
    return assembler


def test_cached_tokens_from_usage_details_first() -> None:
    assembler = finish(
        {
            "usage": {
                "prompt_tokens": 100,
                "completion_tokens": 3,
                "prompt_tokens_details": {"cached_tokens": 64},
            },
            "timings": {"cache_n": 90, "prompt_n": 10},
        }
    )
    done = assembler.completion(time_to_first_token=0.1, total_time=0.2)
    assert (done.prompt_tokens, done.cached_tokens, done.completion_tokens) == (100, 64, 3)


def test_cached_tokens_from_llama_timings() -> None:
    assembler = finish({"timings": {"cache_n": 90, "prompt_n": 10, "predicted_n": 4, "prompt_ms": 3.5}})
    done = assembler.completion(time_to_first_token=0.1, total_time=0.2)
    assert (done.prompt_tokens, done.cached_tokens, done.completion_tokens) == (100, 90, 4)
    assert done.usage is None
    assert done.timings == {"cache_n": 90, "prompt_n": 10, "predicted_n": 4, "prompt_ms": 3.5}


def test_cached_tokens_from_usage_with_null_details_falls_back_to_timings() -> None:
    assembler = finish({"usage": {"prompt_tokens": 100, "prompt_tokens_details": None}, "timings": {"cache_n": 7}})
    assert assembler.completion(time_to_first_token=None, total_time=0.0).cached_tokens == 7


def test_ollama_prompt_eval_cached_count_at_top_level() -> None:
    assembler = finish({"usage": {"prompt_tokens": 50, "completion_tokens": 2}, "prompt_eval_cached_count": 40})
    done = assembler.completion(time_to_first_token=None, total_time=0.0)
    assert (done.prompt_tokens, done.cached_tokens) == (50, 40)


def test_ollama_prompt_eval_cached_count_in_usage() -> None:
    assembler = finish({"usage": {"prompt_tokens": 50, "prompt_eval_cached_count": 12}})
    assert assembler.completion(time_to_first_token=None, total_time=0.0).cached_tokens == 12


def test_no_cache_report_is_none() -> None:
    assembler = finish({"usage": {"prompt_tokens": 50, "completion_tokens": 2, "total_tokens": 52}})
    done = assembler.completion(time_to_first_token=None, total_time=0.0)
    assert done.cached_tokens is None
    assert done.prompt_tokens == 50


LLAMA_STREAM = sse(
    delta_chunk({"role": "assistant", "content": None}, model="tiny"),
    delta_chunk({"reasoning_content": "hm"}),
    delta_chunk({"content": "Hel"}),
    delta_chunk({"content": "lo ✓"}),
    delta_chunk({"tool_calls": [{"index": 0, "id": "c", "type": "function", "function": {"name": "read"}}]}),
    delta_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"path":'}}]}),
    delta_chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "x"}'}}]}),
    delta_chunk({}, finish_reason="tool_calls"),
    {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 5}, "timings": {"cache_n": 4}},
    "[DONE]",
    newline="\r\n",
)


@pytest.mark.asyncio
async def test_stream_fed_byte_by_byte() -> None:
    client = mock_client([b": hello\r\n\r\n", *bytewise(LLAMA_STREAM)])
    done = await stream_chat(base_url="http://m/v1", api_key=None, body=b"{}", timeouts=FAST, client=client).complete()
    assert done.text == "Hello ✓"
    assert done.reasoning == "hm"
    assert done.tool_calls == [ToolCall(0, "c", "read", '{"path": "x"}')]
    assert done.finish_reason == "tool_calls"
    assert (done.prompt_tokens, done.cached_tokens, done.completion_tokens) == (9, 4, 5)
    assert done.model == "tiny"


@pytest.mark.asyncio
async def test_request_headers_and_exact_body() -> None:
    seen: list[httpx.Request] = []
    client = mock_client([LLAMA_STREAM], seen=seen)
    body = b'{"b": 1,   "a": [2]}'
    await stream_chat(base_url="http://m:1/v1/", api_key="sk-1", body=body, timeouts=FAST, client=client).complete()
    (request,) = seen
    assert str(request.url) == "http://m:1/v1/chat/completions"
    assert request.method == "POST"
    assert request.content == body
    assert request.headers["content-type"] == "application/json"
    assert request.headers["authorization"] == "Bearer sk-1"


@pytest.mark.asyncio
async def test_no_authorization_without_key() -> None:
    seen: list[httpx.Request] = []
    await stream_chat(
        base_url="http://m/v1",
        api_key=None,
        body=b"{}",
        timeouts=FAST,
        client=mock_client([LLAMA_STREAM], seen=seen),
    ).complete()
    assert "authorization" not in seen[0].headers


@pytest.mark.asyncio
async def test_end_after_finish_without_done_is_complete() -> None:
    body = sse(delta_chunk({"content": "ok"}), delta_chunk({}, finish_reason="stop"))
    done = await stream_chat(
        base_url="http://m/v1", api_key=None, body=b"{}", timeouts=FAST, client=mock_client([body])
    ).complete()
    assert (done.text, done.finish_reason) == ("ok", "stop")


@pytest.mark.asyncio
async def test_end_before_finish_is_a_cut() -> None:
    body = sse(delta_chunk({"content": "par"}), delta_chunk({"content": "tial"}))
    with pytest.raises(ModelStreamCut) as caught:
        await stream_chat(
            base_url="http://m/v1", api_key=None, body=b"{}", timeouts=FAST, client=mock_client([body])
        ).complete()
    assert caught.value.partial is not None and caught.value.partial.text == "partial"


@pytest.mark.asyncio
async def test_error_object_mid_stream() -> None:
    body = sse(delta_chunk({"content": "a"}), {"error": {"code": 500, "message": "context overflow", "type": "x"}})
    with pytest.raises(ModelHTTPError) as caught:
        await stream_chat(
            base_url="http://m/v1", api_key=None, body=b"{}", timeouts=FAST, client=mock_client([body])
        ).complete()
    assert caught.value.status == 500
    assert "reported an error mid-stream: context overflow" in str(caught.value)
    assert caught.value.partial is not None and caught.value.partial.text == "a"


@pytest.mark.asyncio
async def test_non_object_data_is_a_protocol_error() -> None:
    with pytest.raises(ModelProtocolError, match="not a JSON object"):
        await stream_chat(
            base_url="http://m/v1",
            api_key=None,
            body=b"{}",
            timeouts=FAST,
            client=mock_client([b"data: [1, 2]\n\n"]),
        ).complete()


@pytest.mark.asyncio
async def test_invalid_utf8_is_a_protocol_error() -> None:
    with pytest.raises(ModelProtocolError, match="UTF-8"):
        await stream_chat(
            base_url="http://m/v1",
            api_key=None,
            body=b"{}",
            timeouts=FAST,
            client=mock_client([b"data: \xff\n\n"]),
        ).complete()


@pytest.mark.asyncio
async def test_json_answer_to_a_stream_request_is_a_protocol_error() -> None:
    client = mock_client([b'{"choices": []}'], content_type="application/json")
    with pytest.raises(ModelProtocolError, match="application/json instead of an event stream"):
        await stream_chat(base_url="http://m/v1", api_key=None, body=b"{}", timeouts=FAST, client=client).complete()


@pytest.mark.asyncio
async def test_the_pieces_of_one_read_go_on_as_one() -> None:
    """What one network read brought is yielded as one piece per run of text (or reasoning); a tool call
    begun between two runs keeps them apart."""
    text = sse(
        delta_chunk({"reasoning_content": "h"}),
        delta_chunk({"reasoning_content": "m"}),
        delta_chunk({"content": "Hel"}),
        delta_chunk({"content": "lo"}),
        delta_chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "read", "arguments": "{}"}}]}),
        delta_chunk({"content": " again"}),
    )
    end = sse(delta_chunk({"content": "!"}), delta_chunk({}, finish_reason="stop"), "[DONE]")
    stream = stream_chat(
        base_url="http://m/v1", api_key=None, body=b"{}", timeouts=FAST, client=mock_client([text, end])
    )
    pieces = [piece async for piece in stream]
    assert pieces == [
        ReasoningPiece("hm"),
        TextPiece("Hello"),
        ToolCallPiece(0, "read"),
        TextPiece(" again"),
        TextPiece("!"),
    ]
    assert stream.completion is not None and stream.completion.text == "Hello again!"


def test_joined_keeps_the_order_and_joins_only_neighbours_of_one_kind() -> None:
    assert joined([]) == []
    assert joined([TextPiece("a"), ReasoningPiece("b"), ReasoningPiece("c"), TextPiece("d"), TextPiece("e")]) == [
        TextPiece("a"),
        ReasoningPiece("bc"),
        TextPiece("de"),
    ]
