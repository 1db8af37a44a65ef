"""What the model endpoints list: asked all at once, failures said in a few words, kept a little while."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from chat.agent import endpoints
from chat.agent.endpoints import Listing, endpoints_models
from sessions_app.models import ModelEndpoint
from testing.scripted_server import ScriptedServer


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def endpoint(name: str, base_url: str, model: str = "") -> ModelEndpoint:
    return ModelEndpoint(pk=abs(hash(name)) % 10_000, name=name, base_url=base_url, model=model)


@pytest.fixture
def together() -> Iterator[tuple[str, str]]:
    """Two endpoints of one server that answers only once both have asked: asked one after the other, the
    first waits in vain and is answered HTTP 503."""
    barrier = threading.Barrier(2, timeout=3)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body: dict[str, Any]
            try:
                barrier.wait()
                status, body = 200, {"data": [{"id": self.path.split("/")[1]}]}
            except threading.BrokenBarrierError:
                status, body = 503, {"error": {"message": "asked alone"}}
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    yield f"http://127.0.0.1:{port}/one", f"http://127.0.0.1:{port}/two"
    server.shutdown()
    server.server_close()


def test_the_servers_are_asked_all_at_once(together: tuple[str, str]) -> None:
    one, two = together
    found = endpoints_models([endpoint("one", one), endpoint("two", two)], timeout=10)
    assert [item.listing for item in found] == [Listing(("one",)), Listing(("two",))]


def test_what_each_server_says_in_a_few_words() -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    with ScriptedServer(model="alpha", listed=["alpha", "beta"]) as model:
        found = endpoints_models(
            [
                endpoint("listed", model.base_url),
                endpoint("own-model", model.base_url, model="gamma"),
                endpoint("dead", dead, model="qwen"),
                endpoint("wrong-path", f"http://127.0.0.1:{model.port}/nothing"),
            ]
        )
    listed, own, gone, wrong = found
    assert listed.listing == Listing(("alpha", "beta")) and listed.names == ("alpha", "beta")
    assert listed.preferred == "alpha"
    assert own.names == ("gamma", "alpha", "beta") and own.preferred == "gamma"
    assert gone.listing == Listing((), problem="connection refused", answered=False)
    assert gone.names == ("qwen",) and gone.preferred == "qwen"
    assert wrong.listing == Listing((), problem="HTTP 404: File Not Found: /nothing/models", answered=True)
    assert wrong.preferred == ""


def test_a_server_that_never_answers_is_given_up_after_the_timeout() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # the handshake completes; nothing ever answers
        found = endpoints_models([endpoint("silent", f"http://127.0.0.1:{silent.getsockname()[1]}/v1")], timeout=0.3)
    assert found[0].listing == Listing((), problem="no answer within 0.3 s", answered=False)


def test_a_listing_is_kept_a_while_and_a_failure_only_briefly(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    first = endpoints_models([endpoint("later", url)])[0]
    assert not first.listing.answered
    clock = [time.monotonic()]
    monkeypatch.setattr("chat.agent.endpoints.monotonic", lambda: clock[0])
    with ScriptedServer(model="late", port=port) as model:
        assert model.port == port
        assert endpoints_models([endpoint("later", url)])[0].listing == first.listing, "a failure is kept 5 s"
        clock[0] += endpoints.FAILURE_KEPT_SECONDS + 1
        listed = endpoints_models([endpoint("later", url)])[0]
        assert listed.listing == Listing(("late",))
    clock[0] += endpoints.KEPT_SECONDS - 1
    assert endpoints_models([endpoint("later", url)])[0].listing == Listing(("late",)), "a listing is kept 30 s"
    assert endpoints_models([endpoint("later", url)], kept=0)[0].listing.answered is False
