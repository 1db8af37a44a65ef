"""Cachet under Daphne against pages and clients that are not Cachet's: a page served from another port of the
same host, a TLS proxy's forwarded scheme, websocket paths that match no session; and Cachet's own pages
(login, admin, errors, the session) under the content security policy, with no violation in Chromium."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, BinaryIO
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.test import Client, override_settings
from playwright.sync_api import expect

from chat.agent.loop import ReplyLoop
from chat.tools import tool_list
from sessions_app.models import ChatSession, Result, Turn
from sessions_app.services.sessions import session_start
from testing.scripted_server import Step
from tests.agent.loop_helpers import run
from tests.browser.browser_kit import REPORT_VIOLATIONS, Browser, World, in_thread, login, screenshot, watch_errors
from tests.raw_websocket import HELLO, client_frame

pytestmark = [pytest.mark.django_db(transaction=True)]
expect.set_options(timeout=15_000)

PROXY = ("HTTP_X_FORWARDED_PROTO", "https")
WEBSOCKET_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
ATTACKER_PAGE = """<!doctype html>
<title>Not Cachet</title>
<script>
  window.seen = [];
  const socket = new WebSocket(%(socket_url)s);
  socket.onopen = () => {
    window.seen.push("open");
    socket.send(JSON.stringify({type: "hello", rev: 0, first: 0, bar: 0}));
    socket.send(JSON.stringify({type: "mode", mode: "plan"}));
    socket.send(JSON.stringify({type: "send", text: "Cross-port hello"}));
  };
  socket.onmessage = (event) => window.seen.push("message: " + event.data.slice(0, 80));
  socket.onerror = () => window.seen.push("error");
  socket.onclose = (event) => { window.seen.push("close " + event.code); window.finished = true; };
</script>
"""
VIOLATIONS = """
  window.cspViolations = [];
  document.addEventListener("securitypolicyviolation", (event) => {
    window.cspViolations.push(event.violatedDirective + " " + event.blockedURI);
  });
"""


@pytest.fixture
def ada_session(world: World) -> ChatSession:
    """Ada's session, with one reply that read a file (a stored result), and Ada as staff; made before
    Playwright starts."""
    ada = world.users["ada"]
    ada.is_staff = ada.is_superuser = True
    ada.save()
    session = session_start(
        owner=ada,
        workspace=world.workspace,
        endpoint=world.endpoint,
        model_name="scripted",
        tools=tool_list(allow_commands=world.workspace.allow_commands),
    )
    world.model.push(Step(text="Reading.", tool_calls=[("read", {"path": "notes.md"})]), Step(text="Forty lines."))
    run(ReplyLoop(session).send("How long are the notes?"))
    return session


@dataclass
class Attacker:
    url: str
    session_url: str


@contextlib.contextmanager
def attacker_page(cachet_url: str, session_id: int) -> Iterator[Attacker]:
    """A page on another loopback port that opens Cachet's websocket for ``session_id``."""
    cachet = urlsplit(cachet_url)
    socket_url = f"ws://{cachet.netloc}/ws/sessions/{session_id}/"
    body = (ATTACKER_PAGE % {"socket_url": f'"{socket_url}"'}).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="attacker", daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        assert port != cachet.port
        yield Attacker(f"http://127.0.0.1:{port}/", socket_url)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def attacker_sees(context: Any, url: str) -> list[str]:
    page = context.new_page()
    page.goto(url)
    page.wait_for_function("window.finished === true || window.seen.some(s => s.startsWith('message'))")
    page.wait_for_timeout(300)  # anything more the socket would have delivered
    seen: list[str] = page.evaluate("window.seen")
    page.close()
    return seen


@pytest.mark.browser
def test_a_page_on_another_port_cannot_open_a_session_socket(
    ada_session: ChatSession, browser: Browser, world: World
) -> None:
    context = browser.browser.new_context()
    context.add_init_script(REPORT_VIOLATIONS)
    try:
        own = context.new_page()
        watch_errors(own, browser.errors)
        login(own, world.url, "ada")  # the context now holds Ada's login cookie for 127.0.0.1, every port
        with attacker_page(world.url, ada_session.pk) as attacker:
            assert attacker_sees(context, attacker.url) == ["error", "close 1006"]
            # Cachet's own page in the same browser still connects
            own.goto(f"{world.url}/sessions/{ada_session.pk}/")
            expect(own.locator("#ws-status")).to_have_attribute("data-state", "open")
            expect(own.locator("#ws-status")).to_have_text("live")
            unchanged = in_thread(lambda: (ChatSession.objects.get(pk=ada_session.pk).mode, Turn.objects.count()))
            assert unchanged == ("edit", 1)

            # the same page from an origin Cachet is told to trust: the cookie was there all along
            world.model.push(Step(text="Hello from the trusted page."))
            with override_settings(CSRF_TRUSTED_ORIGINS=[attacker.url.rstrip("/")]):
                seen = attacker_sees(context, attacker.url)
            assert seen[0] == "open" and seen[1].startswith("message: ") and "close 1006" not in seen, seen
            expect(own.locator("#turn-2 .words")).to_contain_text("Cross-port hello")
            expect(own.locator("#controls")).to_have_attribute("data-state", "idle")
            changed = in_thread(lambda: (ChatSession.objects.get(pk=ada_session.pk).mode, Turn.objects.count()))
            assert changed == ("plan", 2)
    finally:
        context.close()


@dataclass
class Handshake:
    status: int
    headers: dict[str, str]
    first_frame: tuple[int, bytes] | None


def _read_frame(stream: BinaryIO) -> tuple[int, bytes]:
    def exactly(size: int) -> bytes:
        data = stream.read(size)
        if len(data) != size:
            raise ConnectionError("the server closed the connection mid-frame")
        return data

    head = exactly(2)
    length = head[1] & 0x7F
    if length == 126:
        length = int.from_bytes(exactly(2), "big")
    elif length == 127:
        length = int.from_bytes(exactly(8), "big")
    return head[0] & 0x0F, exactly(length)


def raw_handshake(cachet_url: str, path: str, *, origin: str | None, cookie: str, extra: dict[str, str]) -> Handshake:
    """A websocket upgrade over a plain socket, as a proxy would forward it; the first frame when accepted."""
    address = urlsplit(cachet_url)
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: {address.netloc}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
        f"Cookie: {settings.SESSION_COOKIE_NAME}={cookie}",
        *([f"Origin: {origin}"] if origin is not None else []),
        *(f"{name}: {value}" for name, value in extra.items()),
    ]
    with socket.create_connection((address.hostname, address.port), timeout=10) as connection:
        connection.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        stream = connection.makefile("rb")
        status = int(stream.readline().split()[1])
        headers: dict[str, str] = {}
        while (line := stream.readline().decode("latin1").strip()) != "":
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        frame = None
        if status == 101:
            expected = base64.b64encode(hashlib.sha1((key + WEBSOCKET_GUID).encode()).digest()).decode()
            assert headers["sec-websocket-accept"] == expected
            if not path.startswith("/ws/sessions/") or not path.removeprefix("/ws/sessions/").rstrip("/").isdigit():
                frame = _read_frame(stream)
            else:
                connection.sendall(client_frame(HELLO))
                frame = _read_frame(stream)
        return Handshake(status, headers, frame)


@pytest.fixture
def ada_cookie(ada_session: ChatSession) -> str:
    client = Client()
    client.force_login(ada_session.owner)
    return client.cookies[settings.SESSION_COOKIE_NAME].value


def test_behind_a_tls_proxy_the_forwarded_scheme_counts_only_with_the_proxy_setting(
    ada_session: ChatSession, ada_cookie: str, cachet_url: str
) -> None:
    host = urlsplit(cachet_url).netloc
    path = f"/ws/sessions/{ada_session.pk}/"
    forwarded = {"X-Forwarded-Proto": "https"}

    def status(origin: str | None, extra: dict[str, str]) -> int:
        return raw_handshake(cachet_url, path, origin=origin, cookie=ada_cookie, extra=extra).status

    with override_settings(SECURE_PROXY_SSL_HEADER=PROXY):
        accepted = raw_handshake(cachet_url, path, origin=f"https://{host}", cookie=ada_cookie, extra=forwarded)
        assert accepted.status == 101
        assert accepted.first_frame is not None
        opcode, payload = accepted.first_frame
        assert opcode == 0x1 and b'"id":"controls"' in payload, "the hello is answered: the socket is open"
        assert status(f"http://{host}", forwarded) == 403
        assert status(f"http://{host}", {}) == 101
        assert status(f"https://{host}", {}) == 403
    assert status(f"https://{host}", forwarded) == 403  # without the setting the header means nothing
    assert status(f"http://{host}", {}) == 101
    assert status(None, {}) == 403
    other_port = f"http://127.0.0.1:{urlsplit(cachet_url).port + 1}"  # type: ignore[operator]
    assert status(other_port, {}) == 403


@pytest.mark.parametrize(
    "path", ["/ws/sessions/-1/", "/ws/sessions/abc/", "/ws/nope/", "/ws/sessions/" + "9" * 20 + "/"]
)
def test_websocket_paths_that_match_no_session_close_4404_under_daphne(
    ada_cookie: str, cachet_url: str, path: str
) -> None:
    done = raw_handshake(cachet_url, path, origin=cachet_url, cookie=ada_cookie, extra={})
    assert done.status == 101
    assert done.first_frame is not None
    opcode, payload = done.first_frame
    assert opcode == 0x8 and int.from_bytes(payload[:2], "big") == 4404


def _no_violations(page: Any) -> list[str]:
    page.wait_for_load_state("networkidle")
    violations: list[str] = page.evaluate("window.cspViolations")
    return violations


@pytest.mark.browser
def test_cachets_pages_and_the_admin_load_without_a_policy_violation(
    ada_session: ChatSession, browser: Browser, world: World
) -> None:
    result_pk = in_thread(lambda: Result.objects.get(session=ada_session).pk)
    page = browser.page(user=None)
    page.context.add_init_script(VIOLATIONS)
    responses: list[Any] = []
    page.on(
        "response", lambda response: responses.append(response) if response.request.is_navigation_request() else None
    )

    page.goto(world.url + "/login/")
    expect(page.locator("h1")).to_have_text("Log in to Cachet")
    assert _no_violations(page) == []
    login(page, world.url, "ada")

    page.goto(f"{world.url}/sessions/{ada_session.pk}/")
    expect(page.locator("#ws-status")).to_have_text("live")
    expect(page.locator("#turn-1 .tool summary")).to_contain_text("notes.md")
    assert _no_violations(page) == []

    admin = [
        "/admin/",
        "/admin/sessions_app/chatsession/",
        f"/admin/sessions_app/chatsession/{ada_session.pk}/change/",
        "/admin/sessions_app/result/",
        f"/admin/sessions_app/result/{result_pk}/change/",
        f"/admin/sessions_app/workspace/{world.workspace.pk}/change/",
        "/admin/sessions_app/modelendpoint/add/",
    ]
    for path in admin:
        page.goto(world.url + path)
        expect(page.locator("#site-name")).to_be_visible()
        assert _no_violations(page) == [], path
    page.goto(f"{world.url}/admin/sessions_app/result/{result_pk}/change/")
    lines = page.locator(".cachet-texts .cachet-lines td.number").first
    expect(lines).to_have_css("text-align", "right")  # the admin stylesheet, not inline styles, lays it out

    page.goto(world.url + "/no/such/page/")
    expect(page.locator("h1")).to_have_text("Not found")
    expect(page.locator(".error-page a.button")).to_have_attribute("href", "/")
    expect(page.locator("header.top")).to_have_css("display", "flex")  # Cachet's stylesheet applies
    screenshot(page, "not_found")
    assert _no_violations(page) == []
    assert responses[-1].status == 404
    assert all(response.headers.get("content-security-policy") for response in responses)
    # Chromium reports the 404 document itself as a failed resource; nothing else may be logged
    not_found = [error for error in browser.errors if "status of 404" in error]
    assert len(not_found) == 1, browser.errors
    browser.errors[:] = [error for error in browser.errors if error not in not_found]
