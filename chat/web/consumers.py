"""The websocket of a chat page: ``/ws/sessions/<id>/``. It checks who is asking, hands the request to the
runner and relays what the runner broadcasts; the reply itself never depends on this connection."""

from __future__ import annotations

import asyncio
import json
from importlib import import_module
from typing import Any

from asgiref.sync import sync_to_async
from channels.auth import get_user
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer
from django.conf import settings
from django.contrib.sessions.backends.base import SessionBase

from chat.web import fragments, runner
from sessions_app.errors import StoreError
from sessions_app.models import ChatSession
from sessions_app.selectors.sessions import session_get
from sessions_app.services.sessions import session_set_mode

NOT_FOUND = 4404
LOGGED_OUT = 4401


def _flag(value: object) -> bool:
    return value is True or (isinstance(value, str) and value.lower() in ("1", "true", "on", "yes"))


def _number(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def _fresh_session(scope: dict[str, Any]) -> SessionBase:
    """The connection's session read again from the store, so a logout elsewhere counts at once."""
    engine = import_module(settings.SESSION_ENGINE)
    store: SessionBase = engine.SessionStore(scope["session"].session_key)
    return store


def _sync_html(session_id: int) -> tuple[str, runner.Snapshot | None]:
    session = ChatSession.objects.select_related("workspace", "endpoint").get(pk=session_id)
    state = runner.page_state(session)
    html = fragments.sync(session, live=state.live, running=state.running, label=state.label)
    return html, state.snapshot


class NotFoundConsumer(AsyncWebsocketConsumer):  # type: ignore[misc]
    """Any websocket path but a session's: accepted, then closed with 4404 as a missing session is."""

    async def connect(self) -> None:
        await self.accept()
        await self.close(code=NOT_FOUND)


class SessionConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    session_id: int = 0
    joined: bool = False
    seen: tuple[str, int] = ("", 0)

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close()  # refuses the handshake
            return
        session_id = int(self.scope["url_route"]["kwargs"]["session_id"])
        session = await database_sync_to_async(session_get)(owner=user, session_id=session_id)
        if session is None:
            await self.accept()
            await self.close(code=NOT_FOUND)
            return
        self.session_id = session_id
        await self.channel_layer.group_add(runner.group_name(session_id), self.channel_name)
        self.joined = True
        await self.accept()
        await self.resync()

    async def resync(self) -> None:
        """Send the page's whole changing part; drop the queued events the snapshot already covers."""
        html, snapshot = await database_sync_to_async(_sync_html)(self.session_id)
        self.seen = (snapshot.job_id, snapshot.seq) if snapshot is not None else ("", 0)
        await self.send(text_data=html)

    async def disconnect(self, code: int) -> None:
        if self.joined:
            await self.channel_layer.group_discard(runner.group_name(self.session_id), self.channel_name)

    async def cachet_html(self, event: dict[str, Any]) -> None:
        job, seq = event.get("job", ""), int(event.get("seq", 0))
        if job and job == self.seen[0] and seq <= self.seen[1]:
            return
        await self.send(text_data=event["html"])

    async def notice(self, text: str, *, level: str = "error") -> None:
        await self.send(text_data=fragments.notice(text, level=level))

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        size = len(text_data.encode()) if text_data is not None else len(bytes_data or b"")
        limit = settings.CACHET_MAX_MESSAGE_BYTES
        if size > limit:
            await self.notice(f"That message is {size} bytes; the most Cachet takes is {limit} bytes.")
            return
        if text_data is None:
            await self.notice("Cachet only understands text messages.")
            return
        try:
            content = json.loads(text_data)
        except ValueError:
            await self.notice("Cachet could not read that message (not JSON).")
            return
        if not isinstance(content, dict):
            await self.notice("Cachet could not read that message (not an object).")
            return
        await self.receive_json(content)

    async def receive_json(self, content: dict[str, Any], **kwargs: Any) -> None:
        user = await get_user({**self.scope, "session": _fresh_session(self.scope)})
        if not user.is_authenticated:
            await self.close(code=LOGGED_OUT)
            return
        session = await database_sync_to_async(session_get)(owner=user, session_id=self.session_id)
        if session is None:
            await self.close(code=NOT_FOUND)
            return
        kind = content.get("type")
        restore = _flag(content.get("restore"))
        if kind == "send":
            await self.send_message(content.get("text"))
        elif kind == "stop":
            await database_sync_to_async(runner.stop)(self.session_id)
        elif kind == "undo":
            await self.start(runner.Undo(restore=restore))
        elif kind == "rewind":
            number = _number(content.get("turn"))
            if number is None:
                await self.notice("Rewind needs the number of a turn.")
                return
            await self.start(runner.Rewind(turn=number, restore=restore))
        elif kind == "regenerate":
            await self.start(runner.Regenerate(restore=restore))
        elif kind == "compact":
            await self.start(runner.Compact())
        elif kind == "mode":
            await self.set_mode(session, content.get("mode"))
        else:
            await self.notice(f"Cachet does not know the request {str(kind)[:40]!r}.")

    async def send_message(self, text: object) -> None:
        if not isinstance(text, str) or not text.strip():
            await self.notice("Write a message first.", level="info")
            return
        if not await self.start(runner.Send(words=text.strip())):
            await self.send(text_data=fragments.composer(text))

    async def start(self, action: runner.Action) -> bool:
        loop = asyncio.get_running_loop()
        try:
            await sync_to_async(runner.start, thread_sensitive=False)(
                self.session_id, action, reply_to=self.channel_name, event_loop=loop
            )
        except StoreError as error:
            await self.notice(str(error))
            return False
        await self.send(text_data=fragments.notice(""))
        return True

    async def set_mode(self, session: ChatSession, mode: object) -> None:
        try:
            session = await database_sync_to_async(session_set_mode)(session=session, mode=str(mode))
        except ValueError as error:
            await self.notice(str(error))
            return
        html = await database_sync_to_async(fragments.mode_control)(session)
        message = {"type": runner.MESSAGE_TYPE, "html": html, "job": "", "seq": 0}
        await self.channel_layer.group_send(runner.group_name(self.session_id), message)
        await self.notice(f"Mode {session.mode}: it takes effect as a note on your next message.", level="info")
