"""The websocket of a chat page: ``/ws/sessions/<id>/``. It checks who is asking, answers a tab's hello
with what it lacks, hands actions (send, stop, undo, rewind, regenerate, edit, flip, compact) to a job and
relays what the session's group is sent; the reply itself never depends on this connection."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from importlib import import_module
from typing import Any, Generic, TypedDict, TypeVar

from channels.auth import get_user
from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer
from django.conf import settings
from django.contrib.sessions.backends.base import SessionBase

from cachet.pg_layer import LAYER_BACK
from chat import wire
from chat.actions import Action, Compact, Edit, Flip, Regenerate, Rewind, Send, Undo
from chat.agent.budget import switch_refusal
from chat.web import delivery, fragments, queueing, tabs
from chat.web.forms import model_for, parse_model_choice
from chat.web.messages import Message, Op, pack
from chat.web.publish import ask_live, publish
from chat.web.socket_store import store_call
from chat.web.sync import PageState, catch_up
from sessions_app.errors import ReplyInProgress, StoreError
from sessions_app.models import ChatSession, Mode
from sessions_app.selectors.sessions import endpoint_refusal, session_get, workspace_refusal
from sessions_app.services.delivery import layer_delivery_save
from sessions_app.services.locks import reply_running
from sessions_app.services.sessions import session_model_switch, session_set_mode

logger = logging.getLogger(__name__)

NOT_FOUND = 4404
LOGGED_OUT = 4401
STOP_UNSENT = "Cachet could not reach the reply to stop it (the channel layer is away); try again in a moment."
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


Frame = Mapping[str, object]
"""A tab's message as it came: a JSON object, ``type`` naming the request."""


@dataclass(frozen=True)
class Notice:
    """What a tab is told instead of acting on a request it sent wrong."""

    text: str
    level: str = "error"


class Nothing(TypedDict):
    """A request that carries nothing but its type (live, stop, compact)."""


class Hello(TypedDict):
    """What the tab shows: the session revision, the oldest turn on it, the last bar of its chart (0: none)."""

    rev: int
    first: int
    bar: int


class Said(TypedDict):
    """The person's words, not blank, as they were typed."""

    text: str


class RestoreChoice(TypedDict):
    """Whether taking turns back restores the files they changed."""

    restore: bool


class RewindChoice(TypedDict):
    turn: int
    restore: bool


class Edited(TypedDict):
    turn: int
    text: str
    restore: bool


class FlipChoice(TypedDict):
    turn: int


class ModeChoice(TypedDict):
    mode: str


class ModelChoice(TypedDict):
    """The model menu's choice as sent (``ID`` or ``ID:MODEL``, checked when it is used), a model typed, and
    whether the last reply is then asked again on it (Retry with…)."""

    endpoint: object
    model: str
    retry: bool


def _nothing(frame: Frame) -> Nothing:
    return Nothing()


def _hello(frame: Frame) -> Hello:
    return Hello(
        rev=_number(frame.get("rev")) or 0, first=_number(frame.get("first")) or 0, bar=_number(frame.get("bar")) or 0
    )


def _said(frame: Frame) -> Said | Notice:
    text = frame.get("text")
    if not isinstance(text, str) or not text.strip():
        return Notice("Write a message first.", level="info")
    return Said(text=text)


def _restore(frame: Frame) -> RestoreChoice:
    return RestoreChoice(restore=_flag(frame.get("restore")))


def _rewind(frame: Frame) -> RewindChoice | Notice:
    number = _number(frame.get("turn"))
    if number is None:
        return Notice("Rewind needs the number of a turn.")
    return RewindChoice(turn=number, restore=_flag(frame.get("restore")))


def _edited(frame: Frame) -> Edited | Notice:
    number = _number(frame.get("turn"))
    if number is None:
        return Notice("Editing needs the number of a turn.")
    said = _said(frame)
    if isinstance(said, Notice):
        return said
    return Edited(turn=number, text=said["text"], restore=_flag(frame.get("restore")))


def _flip(frame: Frame) -> FlipChoice | Notice:
    number = _number(frame.get("turn"))
    if number is None:
        return Notice("Switching branches needs the number of a turn.")
    return FlipChoice(turn=number)


def _commands_allowed(session: ChatSession) -> bool:
    return bool(session.workspace.allow_commands)


def _mode_choice(frame: Frame) -> ModeChoice:
    return ModeChoice(mode=str(frame.get("mode")))


def _model_choice(frame: Frame) -> ModelChoice:
    model = frame.get("model")
    retry = frame.get("retry") in (True, "1", "on")
    return ModelChoice(endpoint=frame.get("endpoint"), model=model if isinstance(model, str) else "", retry=retry)


P = TypeVar("P")


@dataclass(frozen=True)
class _Request(Generic[P]):
    """A request a tab may send: how its frame is read, what the consumer does with it, whether it acts (starts a
    job or changes the model: it needs to know whether a reply runs), whether it changes the session (refused
    where its owner may no longer use its workspace; every acting request does) and whether it asks the session's
    model (refused where its owner may no longer use its endpoint)."""

    read: Callable[[Frame], P | Notice]
    act: Callable[[SessionConsumer, P, ChatSession], Awaitable[None]]
    acting: bool = False
    changing: bool = False
    asking: bool = False


@dataclass(frozen=True)
class _Asker:
    """Who sent a message, read afresh, with their session (``None``: not theirs or gone), whether a reply
    runs in it (asked only for messages that act), and why the session is read-only (asked only for messages
    that change it; ``None``: it is not)."""

    user: Any
    session: ChatSession | None
    running: bool
    refused: StoreError | None = None


def _asker(scope: dict[str, Any], session_id: int, *, acting: bool, changing: bool, asking: bool) -> _Asker:
    """Everything a request needs from the store, on one connection."""
    user = get_user.func({**scope, "session": _fresh_session(scope)})
    if not user.is_authenticated:
        return _Asker(user, None, False)
    session = session_get(owner=user, session_id=session_id)
    if session is None:
        return _Asker(user, None, False)
    refused: StoreError | None = workspace_refusal(session=session) if changing or acting else None
    if refused is None and asking:
        refused = endpoint_refusal(session=session)
    return _Asker(user, session, refused is None and acting and _running(session_id), refused)


def _model_change(session: ChatSession, endpoint: object, model: str) -> ChatSession | None:
    """Change the session's model as the message asks; the session changed, or ``None`` when it already is on that
    one."""
    choice = parse_model_choice(endpoint, user=session.owner)
    model_name = model_for(choice, model)
    if (choice.endpoint.pk, model_name) == (session.endpoint_id, session.model_name):
        return None
    refusal = switch_refusal(session, endpoint=choice.endpoint, model_name=model_name)
    if refusal:
        raise ValueError(refusal)
    return session_model_switch(session=session, endpoint=choice.endpoint, model_name=model_name)


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
        await self.channel_layer.group_add(wire.session_group(session_id), self.channel_name)
        self.joined = True
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.joined:
            await self.channel_layer.group_discard(wire.session_group(self.session_id), self.channel_name)

    async def dispatch(self, message: dict[str, Any]) -> None:
        # An event is shown here without the thread hop Channels makes before every handler to close stale
        # connections (once per streamed piece per tab); what is read from the store goes through store_call.
        if message.get("type") == wire.EVENT:
            await self.show_event(message)
            return
        if message.get("type") == LAYER_BACK:  # events may have been lost meanwhile: the tab says what it shows
            await self.send(text_data=Message(hello=True).encode())
            return
        await super().dispatch(message)

    async def show_event(self, message: Mapping[str, Any]) -> None:
        """Bring the page up to date with a typed event of its session."""
        try:
            event = wire.checked(message)
        except wire.WireError as error:
            logger.warning("session %s: an event not of its schema was dropped: %s", self.session_id, error)
            return
        if event["session"] != self.session_id:
            return
        due = delivery.TALLY.observe(event)
        for text in await tabs.page_messages(event):
            await self.send(text_data=text)
        if due:
            try:
                await store_call(layer_delivery_save)(**delivery.TALLY.taken())
            except Exception as error:  # the store away a moment: the counts are written with a later event
                logger.info("could not write the channel layer's delivery times: %r", error)

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
        request = REQUESTS.get(kind) if isinstance(kind, str) else None
        acting, changing, asking = (
            (request.acting, request.changing, request.asking) if request is not None else (False, False, False)
        )
        asker = await store_call(_asker)(self.scope, self.session_id, acting=acting, changing=changing, asking=asking)
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
        if request is None:
            await self.notice(self.unknown(kind))
            return
        await self.perform(request, content, session)

    async def perform(self, request: _Request[P], frame: Frame, session: ChatSession) -> None:
        """Read the frame as ``request`` says, then act on it; a frame it cannot take gets its notice."""
        payload = request.read(frame)
        if isinstance(payload, Notice):
            await self.notice(payload.text, level=payload.level)
            return
        await request.act(self, payload, session)

    @staticmethod
    def unknown(kind: object) -> str:
        if not isinstance(kind, str):
            return "Cachet could not read that message (its type is not the name of a request)."
        return f"Cachet does not know the request {kind[:40]!r}."

    async def refuse(self, content: dict[str, Any], refused: StoreError) -> None:
        """Say why the session is read-only, or its model may not be asked; the words of a refused send or edit go
        back into the box."""
        text = content.get("text")
        ops = [fragments.notice_put(str(refused), level="error")]
        if content.get("type") in ("send", "edit") and isinstance(text, str) and text.strip():
            ops.insert(0, fragments.composer_put(text))
        await self.show(*ops)

    async def hello(self, hello: Hello, session: ChatSession) -> None:
        """Bring the tab from what it shows to what is stored, then ask the running reply for its live text."""
        state = PageState(revision=hello["rev"], first_turn=hello["first"], last_bar=hello["bar"])
        caught = await store_call(catch_up)(self.session_id, state)
        for text in caught.messages:
            await self.send(text_data=text)
        if caught.running:
            await ask_live(self.session_id, self.channel_name)

    async def live(self, nothing: Nothing, session: ChatSession) -> None:
        await ask_live(self.session_id, self.channel_name)

    async def send_message(self, said: Said, session: ChatSession) -> None:
        if not await self.start(Send(words=said["text"].strip())):
            await self.show(fragments.composer_put(said["text"]))

    async def stop(self, nothing: Nothing, session: ChatSession) -> None:
        if not await queueing.stop(self.session_id):
            await self.notice(STOP_UNSENT)

    async def undo(self, restore: RestoreChoice, session: ChatSession) -> None:
        await self.start(Undo(restore=restore["restore"]))

    async def rewind(self, rewind: RewindChoice, session: ChatSession) -> None:
        await self.start(Rewind(turn=rewind["turn"], restore=rewind["restore"]))

    async def regenerate(self, restore: RestoreChoice, session: ChatSession) -> None:
        await self.start(Regenerate(restore=restore["restore"]))

    async def edit(self, edited: Edited, session: ChatSession) -> None:
        await self.start(Edit(turn=edited["turn"], words=edited["text"].strip(), restore=edited["restore"]))

    async def flip(self, flip: FlipChoice, session: ChatSession) -> None:
        await self.start(Flip(turn=flip["turn"]))

    async def compact(self, nothing: Nothing, session: ChatSession) -> None:
        await self.start(Compact())

    async def start(self, action: Action) -> bool:
        """Queue ``action`` for a worker; every tab of the session shows it running from now on."""
        queued = None if self.running else await queueing.start(self.session_id, action, reply_to=self.channel_name)
        if queued is None:
            await self.notice(str(ReplyInProgress()))
            return False
        if queued.told:
            await self.show(fragments.notice_put(""))
        else:  # the channel layer is away: this tab, at least, shows its job queued
            await self.show(fragments.notice_put(""), fragments.controls_put(running=True, label=queueing.QUEUED))
        return True

    async def set_mode(self, choice: ModeChoice, session: ChatSession) -> None:
        try:
            session = await store_call(session_set_mode)(session=session, mode=choice["mode"])
        except ValueError as error:
            await self.notice(str(error))
            return
        await publish(wire.mode_set_message(self.session_id, mode=session.mode))
        text = f"Mode {session.mode}: it takes effect as a note on your next message."
        if session.mode == Mode.FULL and not await store_call(_commands_allowed)(session):
            text += (
                " Commands are off in this workspace, so the model reads and edits files but runs nothing; staff allow "
                "commands per workspace in the admin."
            )
        await self.notice(text, level="info")

    async def change_model(self, choice: ModelChoice, session: ChatSession) -> None:
        """Move the session to another endpoint or model, between replies; every tab of it shows the change."""
        if self.running:
            await self.notice(MODEL_REFUSED_RUNNING)
            return
        try:
            change = await store_call(_model_change)(session, choice["endpoint"], choice["model"])
        except ReplyInProgress:
            await self.notice(MODEL_REFUSED_RUNNING)
            return
        except ValueError as error:
            await self.notice(str(error))
            return
        if change is None and not choice["retry"]:
            await self.notice(f"The model is already {session.model_name}.", level="info")
            return
        if change is not None:
            await publish(wire.model_changed_message(self.session_id, revision=change.revision))
        if choice["retry"]:  # Retry with…: the last reply asked again, on the model just chosen
            await self.start(Regenerate(restore=False))


# Every request a tab may send, by its type. Stop changes nothing of the session: a removed member may still stop.
REQUESTS: dict[str, _Request[Any]] = {
    "hello": _Request(_hello, SessionConsumer.hello),
    "live": _Request(_nothing, SessionConsumer.live),
    "send": _Request(_said, SessionConsumer.send_message, acting=True, asking=True),
    "stop": _Request(_nothing, SessionConsumer.stop),
    "undo": _Request(_restore, SessionConsumer.undo, acting=True),
    "rewind": _Request(_rewind, SessionConsumer.rewind, acting=True),
    "regenerate": _Request(_restore, SessionConsumer.regenerate, acting=True, asking=True),
    "edit": _Request(_edited, SessionConsumer.edit, acting=True, asking=True),
    "flip": _Request(_flip, SessionConsumer.flip, acting=True),
    "compact": _Request(_nothing, SessionConsumer.compact, acting=True, asking=True),
    "mode": _Request(_mode_choice, SessionConsumer.set_mode, changing=True),
    "model": _Request(_model_choice, SessionConsumer.change_model, acting=True),
}
