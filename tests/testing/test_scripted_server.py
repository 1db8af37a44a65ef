"""The scripted server itself: wire format, bookkeeping, faults and shutdown."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from chat.agent import server_api
from testing.scripted_server import ScriptedServer, Step, load_script, render_prompt, tokenize
from tests.agent.mc_helpers import chat_body, first_turn

ROOT = Path(__file__).resolve().parents[2]


def events(server: ScriptedServer, body: bytes) -> list[str]:
    with httpx.stream(
        "POST",
        server.base_url + "/chat/completions",
        content=body,
        headers={"Content-Type": "application/json"},
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
        return [line.removeprefix("data: ") for line in response.iter_lines() if line]


def streamed_text(lines: list[str]) -> str:
    chunks = [json.loads(line) for line in lines if line != "[DONE]"]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def test_stream_looks_like_llama_server(server: ScriptedServer) -> None:
    server.push(Step(text="Hello!", reasoning="Hm.", tool_calls=[("read", {"path": "a.txt"}), ("list", "{}")]))
    lines = events(server, chat_body(first_turn()))
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "scripted" for c in chunks)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Hm."
    assert "".join(d.get("content") or "" for d in deltas) == "Hello!"
    calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
    heads = [tc for tc in calls if "id" in tc]
    assert [(h["index"], h["function"]["name"]) for h in heads] == [(0, "read"), (1, "list")]
    read_args = [tc["function"]["arguments"] for tc in calls if tc["index"] == 0]
    assert len([a for a in read_args if a]) > 1
    assert "".join(read_args) == '{"path": "a.txt"}'
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    final = chunks[-1]
    assert final["choices"] == []
    assert set(final["usage"]) == {
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "prompt_tokens_details",
    }
    assert final["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert {"cache_n", "prompt_n", "prompt_ms", "predicted_n", "predicted_ms"} <= set(final["timings"])


def test_non_streamed_answer(server: ScriptedServer) -> None:
    server.push(Step(text="Whole.", tool_calls=[("read", {"path": "x"})]))
    body = json.dumps({"messages": first_turn(), "stream": False}).encode()
    answer = httpx.post(server.base_url + "/chat/completions", content=body).json()
    assert answer["object"] == "chat.completion"
    message = answer["choices"][0]["message"]
    assert message["content"] == "Whole."
    assert message["tool_calls"][0]["function"] == {"name": "read", "arguments": '{"path": "x"}'}
    assert answer["choices"][0]["finish_reason"] == "tool_calls"
    assert answer["usage"]["prompt_tokens"] > 0


def test_models_and_unknown_paths(server: ScriptedServer) -> None:
    models = httpx.get(server.base_url + "/models").json()
    assert [m["id"] for m in models["data"]] == ["scripted"]
    missing = httpx.post(server.base_url + "/embeddings", content=b"{}")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == 404


def test_bad_json_request_is_400_and_keeps_the_step(server: ScriptedServer) -> None:
    server.push(Step(text="kept"))
    response = httpx.post(server.base_url + "/chat/completions", content=b"{nope")
    assert response.status_code == 400
    assert server.remaining == 1
    assert server.requests == [b"{nope"]


def test_requests_push_and_empty_script() -> None:
    with ScriptedServer([Step(text="first")], model="m1") as server:
        body1 = chat_body(first_turn("one"))
        body2 = chat_body(first_turn("two"))
        assert streamed_text(events(server, body1)) == "first"
        server.push(Step(text="second"))
        assert streamed_text(events(server, body2)) == "second"
        assert streamed_text(events(server, body1)) == "(script empty)"
        assert server.requests == [body1, body2, body1]
        assert server.remaining == 0


def test_when_empty_can_be_strict() -> None:
    with ScriptedServer(when_empty=Step(fault="http500", text="script exhausted")) as server:
        response = httpx.post(server.base_url + "/chat/completions", content=chat_body(first_turn()))
    assert response.status_code == 500
    assert response.json() == {"error": {"code": 500, "message": "script exhausted", "type": "server_error"}}


def test_push_is_thread_safe(server: ScriptedServer) -> None:
    def push_many() -> None:
        for _ in range(100):
            server.push(Step(text="x"))

    threads = [threading.Thread(target=push_many) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert server.remaining == 800


def test_a_paused_answer_waits_for_resume_then_streams_the_rest(server: ScriptedServer) -> None:
    server.push(Step(text="abcdefghij", chunk_size=2, pause_at=(2,)))
    texts: list[str] = []
    done = threading.Event()

    def read() -> None:
        body = json.loads(chat_body(first_turn()))
        with httpx.stream("POST", server.base_url + "/chat/completions", json=body, timeout=30) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    texts.extend(choice["delta"].get("content") or "" for choice in json.loads(line[6:])["choices"])
        done.set()

    reader = threading.Thread(target=read)
    reader.start()
    assert server.wait_paused(1)
    assert not done.is_set()
    server.resume()
    reader.join(30)
    assert done.is_set() and "".join(texts) == "abcdefghij"
    assert texts.index("ef") > texts.index("cd")


def test_close_is_prompt_with_stalled_connections() -> None:
    server = ScriptedServer([Step(fault="stall"), Step(fault="keepalive")]).start()
    results: list[str] = []

    def hang() -> None:
        try:
            with httpx.stream("POST", server.base_url + "/chat/completions", content=chat_body(first_turn())) as r:
                for _ in r.iter_lines():
                    pass
            results.append("ended")
        except httpx.HTTPError as error:
            results.append(type(error).__name__)

    clients = [threading.Thread(target=hang) for _ in range(2)]
    for thread in clients:
        thread.start()
    deadline = time.monotonic() + 30
    while len(server.requests) < 2:  # both stalled: each stall lasts STALL_SECONDS (60 s) unless cut
        assert time.monotonic() < deadline, "the two requests did not arrive"
        time.sleep(0.01)
    server.close()
    for thread in clients:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in clients), "close cut both stalled answers"
    assert len(results) == 2


def test_prompt_rendering_and_tokens() -> None:
    request = {
        "messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "r",
                "tool_calls": [{"id": "1", "type": "function", "function": {"name": "read", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "1", "content": "data"},
        ],
        "tools": [{"type": "function", "function": {"name": "read"}}],
    }
    prompt = render_prompt(request)
    assert prompt.startswith("<|im_start|>system\nS\n\n# Tools\n")
    assert "<think>\nr\n</think>" in prompt
    assert '<tool_call>\n{"name": "read", "arguments": "{}"}\n</tool_call>' in prompt
    assert "<|im_start|>user\n<tool_response>\ndata\n</tool_response><|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    assert "".join(tokenize(prompt)) == prompt
    assert tokenize("<|im_start|>user hello,  world") == [
        "<|im_start|>",
        "user",
        " hello",
        ",",
        "  ",
        "world",
    ]


def test_step_validation_and_json_script(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown fault"):
        Step(fault="explode")
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            [
                {"text": "hi", "chunk_size": 2, "delay": 0.01},
                {
                    "tool_calls": [["read", {"path": "a"}], {"name": "grep", "arguments": "{}"}],
                    "fault": "cut",
                },
            ]
        )
    )
    steps = load_script(script)
    assert steps[0] == Step(text="hi", chunk_size=2, delay=0.01)
    assert steps[1].tool_calls == [("read", {"path": "a"}), ("grep", "{}")]
    assert steps[1].fault == "cut"


def test_command_line(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"text": "from the file"}]))
    process = subprocess.Popen(
        [sys.executable, "-m", "testing.scripted_server", "--port", "0", "--script", str(script)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert "serving 1 step(s) at http://127.0.0.1:" in line
        base_url = line.split(" at ")[1].split()[0]
        body = json.dumps({"messages": first_turn(), "stream": False}).encode()
        answer = httpx.post(base_url + "/chat/completions", content=body, timeout=5).json()
        assert answer["choices"][0]["message"]["content"] == "from the file"
    finally:
        process.terminate()
        process.wait(timeout=5)
        if process.stdout is not None:
            process.stdout.close()


def test_utf8_as_is_and_a_lone_surrogate_as_a_json_escape(server: ScriptedServer) -> None:
    server.push(Step(text="café", chunk_size=100), Step(text="half \ud83d", chunk_size=100))
    plain = events(server, chat_body(first_turn()))
    assert any('"café"' in line for line in plain)
    split = events(server, chat_body(first_turn()))
    assert any('"half \\ud83d"' in line for line in split)
    assert streamed_text(split) == "half \ud83d"


def test_a_small_context_answers_props_template_and_tokens_as_llama_cpp_does() -> None:
    body = json.loads(chat_body(first_turn()))
    with ScriptedServer(n_ctx=4096) as small:
        root = small.base_url.removesuffix("/v1")
        props = httpx.get(root + "/props").json()
        assert props["default_generation_settings"]["n_ctx"] == 4096
        prompt = httpx.post(root + "/apply-template", json={"messages": body["messages"]}).json()["prompt"]
        assert prompt == render_prompt({"messages": body["messages"]})
        tokens = httpx.post(root + "/tokenize", json={"content": prompt, "add_special": True}).json()["tokens"]
        assert len(tokens) == len(tokenize(prompt))
        assert all(isinstance(token, int) for token in tokens)
        assert httpx.post(root + "/tokenize", json={"content": prompt}).json()["tokens"] == tokens, "stable"


def test_a_request_past_the_context_is_refused_as_llama_cpp_refuses_it() -> None:
    body = chat_body(first_turn())
    size = len(tokenize(render_prompt(json.loads(body))))
    with ScriptedServer([Step(text="fits")], n_ctx=size) as small:
        response = httpx.post(small.base_url + "/chat/completions", content=body)
        assert response.status_code == 400
        assert response.json() == {
            "error": {
                "code": 400,
                "message": f"request ({size} tokens) exceeds the available context size ({size} tokens), "
                "try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": size,
                "n_ctx": size,
            }
        }
        assert small.remaining == 1, "a refused request takes no step of the script"
    with ScriptedServer([Step(text="fits")], n_ctx=size + 1) as roomy:
        assert events(roomy, body)[-1] == "[DONE]"


def test_a_server_that_says_nothing_about_itself_still_has_its_context() -> None:
    body = chat_body(first_turn())
    with ScriptedServer(n_ctx=10, server_api=False) as quiet:
        root = quiet.base_url.removesuffix("/v1")
        assert httpx.get(root + "/props").status_code == 404
        assert httpx.post(root + "/tokenize", json={"content": "a"}).status_code == 404
        assert httpx.post(root + "/apply-template", json={"messages": []}).status_code == 404
        assert httpx.post(quiet.base_url + "/chat/completions", content=body).status_code == 400


def test_a_server_started_where_another_was_is_asked_afresh_about_its_endpoints() -> None:
    first = ScriptedServer()
    port = first.port
    first.close()
    root = server_api.server_root(first.base_url)
    server_api._mark_unoffered(root, "/tokenize")  # what the server before said, as the cache keeps it
    assert not server_api.may_render(first.base_url)
    with ScriptedServer(port=port) as second:
        assert second.base_url == first.base_url
        assert server_api.may_render(second.base_url)
