"""The websocket routes: a session's socket, and every other path closed as not found, never a server error."""

from __future__ import annotations

from typing import Any

import pytest
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from cachet.asgi import application
from cachet.converters import MAX_ID
from sessions_app.models import ChatSession

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


def login_cookie(client: Client) -> str:
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


async def handshake(path: str, cookie: str, *, hello: bool = False) -> list[dict[str, Any]]:
    """The first two things the application answers a connect (and, with ``hello``, the page's hello)."""
    communicator = WebsocketCommunicator(
        application,
        path,
        headers=[(b"origin", b"http://127.0.0.1:8000"), (b"host", b"127.0.0.1:8000"), (b"cookie", cookie.encode())],
    )
    await communicator.send_input({"type": "websocket.connect"})
    messages = [await communicator.receive_output(timeout=5)]
    if hello:
        await communicator.send_input({"type": "websocket.receive", "text": '{"type": "hello", "rev": 0}'})
    messages.append(await communicator.receive_output(timeout=5))
    await communicator.send_input({"type": "websocket.disconnect", "code": 1000})
    await communicator.wait(timeout=5)
    return messages


@pytest.mark.parametrize(
    "path",
    [
        "/ws/sessions/-1/",
        "/ws/sessions/0/",
        "/ws/sessions/abc/",
        "/ws/sessions/007/",
        f"/ws/sessions/{MAX_ID + 1}/",
        "/ws/sessions/99999999999999999999/",
        f"/ws/sessions/{MAX_ID}/",
        "/ws/sessions/1",
        "/ws/nope/",
        "/ws/",
        "/",
        "/elsewhere/entirely",
    ],
)
async def test_any_other_path_is_accepted_then_closed_with_4404(path: str, user: Any) -> None:
    client = Client()
    await client.aforce_login(user)
    messages = await handshake(path, login_cookie(client))
    assert messages[0]["type"] == "websocket.accept"
    assert messages[1] == {"type": "websocket.close", "code": 4404}


async def test_the_session_route_still_connects(chat_session: ChatSession, user: Any) -> None:
    client = Client()
    await client.aforce_login(user)
    accept, first = await handshake(f"/ws/sessions/{chat_session.pk}/", login_cookie(client), hello=True)
    assert accept["type"] == "websocket.accept"
    assert '"id":"controls"' in first["text"]
