"""The websocket of a chat page: ``/ws/sessions/<id>/``. It checks who is asking, answers a tab's hello
with what it lacks, hands actions (send, stop, undo, rewind, regenerate, edit, flip, compact) to a job and
relays what the session's group is sent; the reply itself never depends on this connection."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from channels.auth import get_user
from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer
from django.conf import settings
from django.contrib.sessions.backends.base import SessionBase

from chat.web import fragments, jobs
from chat.web.forms import model_for, parse_model_choice
from chat.web.messages import Op, pack
from chat.web.publisher import MESSAGE_TYPE, session_group
from chat.web.socket_store import store_call
from chat.web.sync import PageState, catch_up, chart_page_put
from sessions_app.errors import ReplyInProgress, WorkspaceRefused
from sessions_app.models import ChatSession
from sessions_app.selectors.sessions import session_get, workspace_refusal
from sessions_app.services.locks import reply_running
from sessions_app.services.sessions import session_model_switch, session_set_mode

NOT_FOUND = 4404
LOGGED_OUT = 4401
MODEL_REFUSED_RUNNING = "A reply is running in this session; change the model once it has finished or been stopped."


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


def _running(session_id: int) -> bool:
    return reply_running(ChatSession(pk=session_id))


def too_large_notice(size: int, limit: int) -> str:
    """What a message over the limit is answered (``static/cachet/chat.js`` says the same before sending one)."""
    return f"That message is {size} bytes; the most Cachet takes is {limit} bytes."


def _too_large(text_data: str | None, *, size: int, limit: int) -> list[Op]:
    """The notice for a message over ``limit``; the words of a send or edit that still reads go back in the box."""
    ops: list[Op] = [fragments.notice_put(too_large_notice(size, limit), level="error")]
    try:
        content = json.loads(text_data) if text_data is not None else None
    except (ValueError, RecursionError):
        return ops
    words = content.get("text") if isinstance(content, dict) and content.get("type") in ("send", "edit") else None
    if isinstance(words, str) and words.strip():
        ops.insert(0, fragments.composer_put(words))
    return ops


# Messages that start a job or change the model: they need to know whether a reply runs.
_ACTING = frozenset({"send", "undo", "rewind", "regenerate", "edit", "flip", "compact", "model"})
# Messages that change the session: refused where its owner may no longer use its workspace. Stop is not one.
_CHANGING = _ACTING | {"mode"}


@dataclass(frozen=True)
class _Asker:
    """Who sent a message, read afresh, with their session (``None``: not theirs or gone), whether a reply
    runs in it (asked only for messages that act), and why the session is read-only (asked only for messages
    that change it; ``None``: it is not)."""

    user: Any
    session: ChatSession | None
    running: bool
    refused: WorkspaceRefused | None = None


def _asker(scope: dict[str, Any], session_id: int, *, kind: object) -> _Asker:
    """Everything a message of ``kind`` needs from the store, on one connection."""
    user = get_user.func({**scope, "session": _fresh_session(scope)})
    if not user.is_authenticated:
        return _Asker(user, None, False)
    session = session_get(owner=user, session_id=session_id)
    if session is None:
        return _Asker(user, None, False)
    refused = workspace_refusal(session=session) if kind in _CHANGING else None
    return _Asker(user, session, refused is None and kind in _ACTING and _running(session_id), refused)


@dataclass(frozen=True)
class _ModelChanged:
    ops: list[Op]
    revision: int


def _model_change(session: ChatSession, endpoint: object, model: object) -> _ModelChanged | None:
    """Change the session's model as the message asks; ``None`` when it already is that one."""
    choice = parse_model_choice(endpoint)
    model_name = model_for(choice, model if isinstance(model, str) else "")
    if (choice.endpoint.pk, model_name) == (session.endpoint_id, session.model_name):
        return None
    window = fragments.chart_window(session)
    changed = session_model_switch(session=session, endpoint=choice.endpoint, model_name=model_name)
    text = f"The model is now {changed.model_name}: the next request reads the conversation again."
    ops: list[Op] = [fragments.model_put(changed), fragments.notice_put(text)]
    if fragments.chart_window(changed) != window:
        ops.append(chart_page_put(changed))
    return _ModelChanged(ops, changed.revision)


class NotFoundConsumer(AsyncWebsocketConsumer):  # type: ignore[misc]
    """Any websocket path but a session's: accepted, then closed with 4404 as a missing session is."""

    async def connect(self) -> None:
        await self.accept()
        await self.close(code=NOT_FOUND)


class SessionConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    session_id: int = 0
    joined: bool = False
    running: bool = False  # whether a reply ran in the session when the message being handled came

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close()  # refuses the handshake
            return
        session_id = int(self.scope["url_route"]["kwargs"]["session_id"])
        session = await store_call(session_get)(owner=user, session_id=session_id)
        if session is None:
            await self.accept()
            await self.close(code=NOT_FOUND)
            return
        self.session_id = session_id
        await self.channel_layer.group_add(session_group(session_id), self.channel_name)
        self.joined = True
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.joined:
            await self.channel_layer.group_discard(session_group(self.session_id), self.channel_name)

    async def dispatch(self, message: dict[str, Any]) -> None:
        # What a reply sends its tabs is relayed as it is: no database, so not the thread hop Channels makes
        # before every handler to close stale connections (once per streamed message per tab).
        if message.get("type") == MESSAGE_TYPE:
            await self.send(text_data=message["text"])
            return
        await super().dispatch(message)

    async def show(self, *ops: Op) -> None:
        for text in pack(list(ops)):
            await self.send(text_data=text)

    async def notice(self, text: str, *, level: str = "error") -> None:
        await self.show(fragments.notice_put(text, level=level))

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        size = len(text_data.encode("utf-8", "surrogatepass")) if text_data is not None else len(bytes_data or b"")
        limit = settings.CACHET_MAX_MESSAGE_BYTES
        if size > limit:
            await self.show(*_too_large(text_data, size=size, limit=limit))
            return
        if text_data is None:
            await self.notice("Cachet only understands text messages.")
            return
        try:
            content = json.loads(text_data)
        except (ValueError, RecursionError):
            await self.notice("Cachet could not read that message (not JSON).")
            return
        if not isinstance(content, dict):
            await self.notice("Cachet could not read that message (not an object).")
            return
        await self.receive_json(content)

    async def receive_json(self, content: dict[str, Any], **kwargs: Any) -> None:
        kind = content.get("type")
        asker = await store_call(_asker)(self.scope, self.session_id, kind=kind)
        if not asker.user.is_authenticated:
            await self.close(code=LOGGED_OUT)
            return
        session = asker.session
        if session is None:
            await self.close(code=NOT_FOUND)
            return
        self.running = asker.running
        if asker.refused is not None:
            await self.refuse(content, asker.refused)
            return
        restore = _flag(content.get("restore"))
        if kind == "hello":
            await self.hello(content)
        elif kind == "live":
            await jobs.ask_live(self.session_id, self.channel_name)
        elif kind == "send":
            await self.send_message(content.get("text"))
        elif kind == "stop":
            await jobs.stop(self.session_id)
        elif kind == "undo":
            await self.start(jobs.Undo(restore=restore))
        elif kind == "rewind":
            number = _number(content.get("turn"))
            if number is None:
                await self.notice("Rewind needs the number of a turn.")
                return
            await self.start(jobs.Rewind(turn=number, restore=restore))
        elif kind == "regenerate":
            await self.start(jobs.Regenerate(restore=restore))
        elif kind == "edit":
            await self.edit(_number(content.get("turn")), content.get("text"), restore=restore)
        elif kind == "flip":
            number = _number(content.get("turn"))
            if number is None:
                await self.notice("Switching branches needs the number of a turn.")
                return
            await self.start(jobs.Flip(turn=number))
        elif kind == "compact":
            await self.start(jobs.Compact())
        elif kind == "mode":
            await self.set_mode(session, content.get("mode"))
        elif kind == "model":
            await self.change_model(session, content.get("endpoint"), content.get("model"))
        else:
            await self.notice(f"Cachet does not know the request {str(kind)[:40]!r}.")

    async def refuse(self, content: dict[str, Any], refused: WorkspaceRefused) -> None:
        """Say why the session is read-only; the words of a refused send or edit go back into the box."""
        text = content.get("text")
        ops = [fragments.notice_put(str(refused), level="error")]
        if content.get("type") in ("send", "edit") and isinstance(text, str) and text.strip():
            ops.insert(0, fragments.composer_put(text))
        await self.show(*ops)

    async def hello(self, content: dict[str, Any]) -> None:
        """Bring the tab from what it shows to what is stored, then ask the running reply for its live text."""
        state = PageState(
            revision=_number(content.get("rev")) or 0,
            first_turn=_number(content.get("first")) or 0,
            last_bar=_number(content.get("bar")) or 0,
        )
        caught = await store_call(catch_up)(self.session_id, state)
        for text in caught.messages:
            await self.send(text_data=text)
        if caught.running or jobs.busy(self.session_id):
            await jobs.ask_live(self.session_id, self.channel_name)

    async def send_message(self, text: object) -> None:
        if not isinstance(text, str) or not text.strip():
            await self.notice("Write a message first.", level="info")
            return
        if not await self.start(jobs.Send(words=text.strip())):
            await self.show(fragments.composer_put(text))

    async def edit(self, number: int | None, text: object, *, restore: bool) -> None:
        if number is None:
            await self.notice("Editing needs the number of a turn.")
            return
        if not isinstance(text, str) or not text.strip():
            await self.notice("Write a message first.", level="info")
            return
        await self.start(jobs.Edit(turn=number, words=text.strip(), restore=restore))

    async def start(self, action: jobs.Action) -> bool:
        if jobs.busy(self.session_id) or self.running:
            await self.notice("A reply is already running in this session; wait for it or stop it first.")
            return False
        await jobs.start(self.session_id, action, reply_to=self.channel_name)
        await self.show(fragments.notice_put(""))
        return True

    async def set_mode(self, session: ChatSession, mode: object) -> None:
        try:
            session = await store_call(session_set_mode)(session=session, mode=str(mode))
        except ValueError as error:
            await self.notice(str(error))
            return
        put = await store_call(fragments.mode_put)(session)
        for text in pack([put]):
            await self.channel_layer.group_send(session_group(self.session_id), {"type": MESSAGE_TYPE, "text": text})
        await self.notice(f"Mode {session.mode}: it takes effect as a note on your next message.", level="info")

    async def change_model(self, session: ChatSession, endpoint: object, model: object) -> None:
        """Move the session to another endpoint or model, between replies; every tab of it shows the change."""
        if self.running:
            await self.notice(MODEL_REFUSED_RUNNING)
            return
        try:
            change = await store_call(_model_change)(session, endpoint, model)
        except ReplyInProgress:
            await self.notice(MODEL_REFUSED_RUNNING)
            return
        except ValueError as error:
            await self.notice(str(error))
            return
        if change is None:
            await self.notice(f"The model is already {session.model_name}.", level="info")
            return
        group = session_group(self.session_id)
        for text in pack(change.ops, rev=change.revision):
            await self.channel_layer.group_send(group, {"type": MESSAGE_TYPE, "text": text})
