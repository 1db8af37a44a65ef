"""The context window as each common server states it, asked over HTTP of a scripted server that answers as
llama.cpp, vLLM, SGLang, Ollama and LM Studio do; a server that states none, or only a trained length, is not
read."""

from __future__ import annotations

import socket

import pytest

from chat.agent import server_api
from chat.agent.windows import ReadWindow, ServerAPIError, read_window
from testing.scripted_server import ScriptedServer


@pytest.fixture(autouse=True)
def _nothing_remembered() -> None:
    server_api._unoffered.clear()  # each test's server is new: what an earlier one did not offer says nothing


@pytest.mark.parametrize(
    ("like", "how"),
    [
        ("llama.cpp", "llama.cpp /props n_ctx"),
        ("vllm", "/v1/models max_model_len"),
        ("sglang", "/v1/models max_model_len"),
        ("ollama", "Ollama /api/ps context_length"),
        ("ollama-idle", "Ollama /api/show num_ctx"),
        ("lmstudio", "LM Studio /api/v1/models loaded_instances context_length"),
        ("lmstudio-0.3", "LM Studio /api/v0/models loaded_context_length"),
    ],
)
def test_each_server_s_window_is_read_where_it_states_it(like: str, how: str) -> None:
    with ScriptedServer(model="qwen3:8b", n_ctx=24_576, like=like) as server:
        found = read_window(server.base_url, model="qwen3:8b", api_key=None, timeout=5)
    assert found == ReadWindow(24_576, how, vision=False if like == "llama.cpp" else None)


def test_llama_cpp_says_whether_its_model_reads_images() -> None:
    with ScriptedServer(n_ctx=4096, vision=True) as server:
        found = read_window(server.base_url, model="scripted", api_key=None, timeout=5)
    assert found == ReadWindow(4096, "llama.cpp /props n_ctx", vision=True)


def test_the_model_asked_about_is_the_one_read_where_the_server_lists_several() -> None:
    with ScriptedServer(model="a", listed=["a", "b"], n_ctx=4096, like="vllm") as server:
        assert read_window(server.base_url, model="b", api_key=None, timeout=5) == ReadWindow(
            4096, "/v1/models max_model_len"
        )
        assert read_window(server.base_url, model="c", api_key=None, timeout=5) is None  # not listed: not guessed


def test_an_ollama_model_named_without_its_tag_is_found_by_latest() -> None:
    with ScriptedServer(model="qwen3:latest", n_ctx=8192, like="ollama") as server:
        found = read_window(server.base_url, model="qwen3", api_key=None, timeout=5)
    assert found == ReadWindow(8192, "Ollama /api/ps context_length")


def test_a_server_that_states_only_a_trained_length_is_not_read() -> None:
    with ScriptedServer(n_ctx=4096, like="openai") as server:
        assert read_window(server.base_url, model="scripted", api_key=None, timeout=5) is None


def test_a_server_out_of_reach_raises() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(ServerAPIError):
        read_window(f"http://127.0.0.1:{port}/v1", model="m", api_key=None, timeout=2)
