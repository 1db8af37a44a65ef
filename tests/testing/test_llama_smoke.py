"""One real llama.cpp server (xllamacpp, in-process) on a generated model: streaming and prompt caching."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chat.agent.model import Completion, ModelClient, Timeouts, list_models, stream_chat
from testing.tiny_gguf import ModelShape, write_model
from tests.agent.mc_helpers import SYSTEM

pytest.importorskip("xllamacpp")

from testing.llama import LlamaServer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read",
            "description": "Read a text file of the workspace.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]


def body(messages: list[dict[str, Any]]) -> bytes:
    request = {
        "model": "tiny",
        "messages": messages,
        "tools": TOOLS,
        "max_tokens": 8,
        "temperature": 0,
        "seed": 1,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return json.dumps(request).encode()


@pytest.mark.llama
@pytest.mark.asyncio
async def test_real_llama_server_streams_and_caches_the_shared_prefix(tmp_path: Path) -> None:
    model = write_model(tmp_path / "tiny.gguf", ModelShape(layers=4, dim=256, heads=4, ff=512, ctx=4096))
    timeouts = Timeouts(connect=5.0, first_token=60.0, between_chunks=30.0)
    first_turn: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM * 2},
        {"role": "user", "content": "Read a.txt, please."},
    ]
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "read", "arguments": '{"path": "a.txt"}'},
    }
    second_turn: list[dict[str, Any]] = [
        *first_turn,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "1: hello\n2: world"},
    ]
    with LlamaServer(model, ctx_size=4096, threads=2) as server:
        assert server.base_url.startswith("http://127.0.0.1:")
        assert list_models(base_url=server.base_url, api_key=None) == ["tiny"]
        client = ModelClient()  # the two requests of one action, on its one kept connection
        try:
            cold = await stream_chat(
                base_url=server.base_url, api_key=None, body=body(first_turn), timeouts=timeouts, client=client
            ).complete()
            warm = await stream_chat(
                base_url=server.base_url, api_key=None, body=body(second_turn), timeouts=timeouts, client=client
            ).complete()
        finally:
            await client.aclose()

    for done in (cold, warm):
        assert isinstance(done, Completion)
        assert done.finish_reason in ("stop", "length", "tool_calls")
        assert done.completion_tokens is not None and 1 <= done.completion_tokens <= 8
        assert done.timings is not None and done.usage is not None
        assert done.model
        assert done.total_time > 0
    assert cold.prompt_tokens is not None and cold.prompt_tokens > 1000
    assert cold.cached_tokens == 0
    assert warm.prompt_tokens is not None and warm.prompt_tokens > cold.prompt_tokens
    assert warm.cached_tokens is not None and warm.cached_tokens > 0.9 * cold.prompt_tokens
    assert warm.timings is not None and cold.timings is not None
    assert warm.timings["cache_n"] == warm.cached_tokens
    assert warm.timings["prompt_ms"] < cold.timings["prompt_ms"]
    print(
        f"\nllama smoke: cold {cold.prompt_tokens} prompt tokens in {cold.timings['prompt_ms']:.1f} ms; "
        f"warm {warm.prompt_tokens} prompt tokens, {warm.cached_tokens} cached, "
        f"{warm.timings['prompt_n']} evaluated in {warm.timings['prompt_ms']:.1f} ms"
    )


def test_prompt_cache_options_reach_the_server_params(tmp_path: Path) -> None:
    defaults = LlamaServer(tmp_path / "m.gguf").params()
    tuned = LlamaServer(
        tmp_path / "m.gguf", cache_ram_mib=0, slot_prompt_similarity=0.5, chat_template="{{ messages }}"
    ).params()
    assert (tuned.cache_ram_mib, round(tuned.slot_prompt_similarity, 3)) == (0, 0.5)
    assert tuned.chat_template == "{{ messages }}"
    assert defaults.chat_template == ""
    assert defaults.cache_ram_mib == 8192
    assert round(defaults.slot_prompt_similarity, 3) == 0.1
