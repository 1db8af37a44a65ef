"""The llama.cpp server's own API, asked for real: its window, its tokenizer, its chat template."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from chat.agent import server_api
from testing.llama import LlamaServer
from testing.tiny_gguf import ModelShape, write_model


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    model = write_model(tmp_path_factory.mktemp("model") / "tiny.gguf", ModelShape(ctx=4096))
    with LlamaServer(model, ctx_size=3072, n_predict=4, alias="tiny") as server:
        yield server


pytestmark = pytest.mark.llama


def test_props_reads_the_slot_window(llama: LlamaServer) -> None:
    props = server_api.props(llama.base_url)
    assert props is not None
    assert props.context_window == 3072
    assert props.total_slots == 1


def test_tokenize_and_apply_template_agree_with_the_server(llama: LlamaServer) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    prompt = server_api.apply_template(llama.base_url, messages)
    assert prompt is not None
    assert "Hello there" in prompt
    assert prompt.index("Be brief.") < prompt.index("Hello there")
    with_bos = server_api.tokenize(llama.base_url, prompt)
    without = server_api.tokenize(llama.base_url, prompt, add_special=False)
    assert with_bos is not None and without is not None
    assert 0 < len(without) <= len(with_bos) <= len(without) + 1
    assert server_api.prompt_tokens(llama.base_url, messages) == tuple(with_bos)
    assert server_api.prompt_tokens(llama.base_url, messages) == tuple(with_bos)


def test_a_chat_request_s_own_bytes_render_as_its_messages_and_tools_do(llama: LlamaServer) -> None:
    """The cache check sends the request's bytes as they are (no encoding of a long conversation again): the
    server reads the same messages and tools from them, beside the chat fields it ignores here."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    tools = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object", "properties": {}}}}]
    body = json.dumps(
        {
            "model": "tiny",
            "stream": True,
            "stream_options": {"include_usage": True},
            "tools": tools,
            "messages": messages,
        }
    ).encode()
    from_body = server_api.apply_template(llama.base_url, messages, tools=tools, body=body)
    assert from_body is not None
    assert from_body == server_api.apply_template(llama.base_url, messages, tools=tools)


class _Plain(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(404)
        self.end_headers()

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        pass


def _serving(handler: type[http.server.BaseHTTPRequestHandler]) -> tuple[http.server.ThreadingHTTPServer, str]:
    """A server of ``handler`` on a new port, and its base URL, of which nothing learnt earlier is remembered (a
    server of an earlier test may have had the port and offered less)."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    server_api.forget(base)
    return httpd, base


def test_a_slot_handed_over_holds_no_conversation_and_its_prompt_leaves_for_the_host_memory_cache(
    llama: LlamaServer,
) -> None:
    conversation = "A conversation that the next request does not continue. " * 20
    first = httpx.post(llama.address + "/completion", json={"prompt": conversation, "n_predict": 0}, timeout=30)
    assert first.status_code == 200
    computed = server_api.slot_handover(llama.base_url, 0)
    assert computed is not None and 0 < computed < 40, "a few tokens of its own"
    again = httpx.post(llama.address + "/completion", json={"prompt": conversation, "n_predict": 0}, timeout=30)
    assert again.json()["timings"]["prompt_n"] <= 2, "the conversation came back from the host-memory cache"


def test_the_template_head_begins_every_chat_request(llama: LlamaServer) -> None:
    head = server_api.template_head(llama.base_url)
    assert head is not None and len(head) >= 2
    messages = [{"role": "system", "content": "You are a coding assistant."}, {"role": "user", "content": "hi"}]
    tokens = server_api.prompt_tokens(llama.base_url, messages)
    assert tokens is not None and tokens[: len(head)] == head


def test_a_server_without_them_answers_none_and_is_not_asked_again() -> None:
    httpd, base = _serving(_Plain)
    try:
        assert server_api.props(base) is None
        assert server_api.tokenize(base, "x") is None
        assert server_api.apply_template(base, [{"role": "user", "content": "x"}]) is None
        assert server_api.slot_handover(base, 0) is None
        assert server_api.template_head(base) is None
        httpd.shutdown()
        assert server_api.props(base) is None  # remembered: not asked again
        server_api.forget(base)
        with pytest.raises(server_api.ServerAPIError):
            server_api.props(base, timeout=1.0)
    finally:
        httpd.server_close()


class _SlowlyPlain(_Plain):
    posts: list[tuple[str, int]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.posts.append((self.path, length))
        self.rfile.read(length)
        time.sleep(0.2)  # the callers that come meanwhile wait for this answer instead of asking too
        self.send_response(404)
        self.end_headers()


def test_callers_that_come_together_ask_a_server_that_renders_nothing_once_and_briefly() -> None:
    httpd, base = _serving(_SlowlyPlain)
    messages = [{"role": "user", "content": "x" * 100_000}]
    answers: list[object] = []
    try:
        callers = [
            threading.Thread(target=lambda: answers.append(server_api.rendered_prompt(base, messages)))
            for _ in range(6)
        ]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join(10)
        assert answers == [None] * 6
        assert [path for path, _ in _SlowlyPlain.posts] == ["/apply-template"]
        assert _SlowlyPlain.posts[0][1] < 200  # a one-message question, not the 100 KB request
    finally:
        httpd.shutdown()
        httpd.server_close()
        server_api.forget(base)


class _SlowlyRendering(_Plain):
    posts: list[tuple[str, int]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.posts.append((self.path, length))
        self.rfile.read(length)
        answer: dict[str, object]
        if self.path == "/apply-template":
            if length > 200:
                time.sleep(0.2)  # the callers that come meanwhile for the same request wait for this answer
            answer = {"prompt": "<rendered>"}
        else:
            answer = {"tokens": [1, 2, 3]}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_callers_that_come_together_for_one_request_have_it_rendered_once() -> None:
    httpd, base = _serving(_SlowlyRendering)
    messages = [{"role": "user", "content": "x" * 1_000}]
    body = json.dumps({"messages": messages}).encode()
    answers: list[object] = []
    try:
        callers = [
            threading.Thread(target=lambda: answers.append(server_api.rendered_prompt(base, messages, body=body)))
            for _ in range(4)
        ]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join(10)
        assert answers == [server_api.RenderedPrompt(text="<rendered>", tokens=(1, 2, 3))] * 4
        large = [path for path, length in _SlowlyRendering.posts if length > 200]
        assert large == ["/apply-template"]
    finally:
        httpd.shutdown()
        httpd.server_close()
        server_api.forget(base)


def test_server_root_strips_the_openai_suffix() -> None:
    assert server_api.server_root("http://h:8080/v1/") == "http://h:8080"
    assert server_api.server_root("http://h:8080") == "http://h:8080"


@pytest.mark.asyncio
async def test_the_real_server_refuses_a_request_past_its_window_as_the_scripted_one_does(
    llama: LlamaServer,
) -> None:
    from chat.agent.model import ModelContextExceeded, Timeouts, stream_chat
    from testing.scripted_server import exceeds_context

    body = {"model": "tiny", "stream": True, "messages": [{"role": "user", "content": "word, " * 1000}]}
    with pytest.raises(ModelContextExceeded) as raised:
        await stream_chat(
            base_url=llama.base_url,
            api_key=None,
            body=json.dumps(body).encode(),
            timeouts=Timeouts(connect=5.0, first_token=60.0, between_chunks=60.0),
        ).complete()
    error = raised.value
    assert error.n_ctx == 3072 and error.n_prompt_tokens is not None and error.n_prompt_tokens >= 3072
    assert error.status == 400
    assert error.excerpt == exceeds_context(error.n_prompt_tokens, 3072)["error"]["message"]
