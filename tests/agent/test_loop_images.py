"""Images attached to a message, as the reply loop sends them to a scripted server that reads images (as llama.cpp
with a vision projector says at /props) and to one that does not."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from PIL import Image

from chat.agent.budget import endpoint_window
from chat.agent.loop import ReplyLoop
from chat.agent.model import Timeouts
from chat.tools import tool_list
from chat.web.attachments import attach_files
from sessions_app.models import BreakCause, ChatSession, Generation, ModelEndpoint, ModelRequest, TurnStatus, Workspace
from sessions_app.selectors.requests import image_spans
from sessions_app.services.sessions import session_change_model, session_start
from testing.scripted_server import NO_VISION, ScriptedServer, Step
from tests.agent.loop_helpers import run

pytestmark = pytest.mark.django_db(transaction=True)

FAST = Timeouts(connect=2.0, first_token=2.0, between_chunks=1.0)
WITHHELD = "[shot.png, an image that went with this message: this model is not shown images.]"


def _png(colour: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (24, 16), colour).save(out, format="PNG")
    return out.getvalue()


def _url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _messages(body: bytes) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = json.loads(body)["messages"]
    return messages


def _endpoint(server: ScriptedServer, name: str, *, reads_images: bool = False) -> ModelEndpoint:
    endpoint = ModelEndpoint.objects.create(
        name=name, base_url=server.base_url, model="scripted", context_window=100_000, reads_images=reads_images
    )
    endpoint_window(endpoint, refresh=True)  # as serve does at its start, and the loop before a session's first use
    return endpoint


def _session(user: Any, workspace: Workspace, endpoint: ModelEndpoint) -> ChatSession:
    return session_start(
        owner=user, workspace=workspace, endpoint=endpoint, model_name="scripted", tools=tool_list(allow_commands=False)
    )


def _loop(session: ChatSession) -> ReplyLoop:
    return ReplyLoop(ChatSession.objects.get(pk=session.pk), client_timeouts=FAST)


def _attach(session: ChatSession, name: str, data: bytes) -> list[str]:
    written, problems = attach_files(session, [SimpleUploadedFile(name, data)])
    assert [done.path for done in written] == [name]
    return problems


@pytest.fixture
def vision() -> Any:
    with ScriptedServer(
        n_ctx=100_000, vision=True, when_empty=Step(fault="http500", text="script exhausted")
    ) as server:
        yield server


@pytest.fixture
def blind() -> Any:
    with ScriptedServer(n_ctx=100_000, when_empty=Step(fault="http500", text="script exhausted")) as server:
        yield server


def test_an_image_goes_with_its_message_and_every_later_request_sends_the_same_bytes(
    vision: ScriptedServer, user: Any, workspace: Workspace, workspace_dir: Path
) -> None:
    endpoint = _endpoint(vision, "vision")
    assert endpoint.server_reads_images is True and endpoint.images_read
    session = _session(user, workspace, endpoint)
    assert Generation.objects.get(session=session).reads_images
    picture = _png()
    assert _attach(session, "shot.png", picture) == []
    vision.push(Step(text="A red rectangle."), Step(text="Still red."))
    turn = run(_loop(session).send("What is in the picture?", date="2026-12-08")).turn
    assert turn.status == TurnStatus.DONE, turn.error
    assert f"Uploaded: shot.png, {len(picture)} bytes, an image, shown with this message." in turn.message
    first = _messages(vision.requests[0])[1]
    assert first == {
        "role": "user",
        "content": [{"type": "text", "text": turn.message}, {"type": "image_url", "image_url": {"url": _url(picture)}}],
    }
    (workspace_dir / "shot.png").write_bytes(_png((0, 0, 255)))  # the file changes: what was sent does not
    again = run(_loop(session).send("And now?", date="2026-12-08")).turn
    assert again.status == TurnStatus.DONE, again.error
    second = vision.requests[1]
    assert second.startswith(vision.requests[0][: vision.requests[0].index(b',"stream_options"')])
    assert _messages(second)[1] == first
    requests = list(ModelRequest.objects.filter(session=session).order_by("id"))
    assert [request.images for request in requests] == [1, 1]
    assert requests[0].image_bytes == len(f'"url":"{_url(picture)}"')
    assert requests[1].break_cause == ""
    assert image_spans(second) == image_spans(vision.requests[0])
    assert requests[1].shared_prefix_bytes > image_spans(second)[0][1]  # the image's bytes were sent alike


def test_a_model_that_does_not_read_images_is_told_the_image_went_with_the_message(
    vision: ScriptedServer, blind: ScriptedServer, user: Any, workspace: Workspace
) -> None:
    """Moving to a model that does not read images re-reads everything anyway (§10.1): its requests carry, in the
    image's place, a line that says it went with the message, and the server is never sent an image it refuses."""
    session = _session(user, workspace, _endpoint(vision, "vision"))
    _attach(session, "shot.png", _png())
    vision.push(Step(text="A red rectangle."))
    assert run(_loop(session).send("Look.", date="2026-12-08")).turn.status == TurnStatus.DONE
    other = _endpoint(blind, "blind")
    assert other.server_reads_images is False and not other.images_read
    session_change_model(session=session, endpoint=other, model_name="scripted")
    assert not Generation.objects.get(session=session, number=2).reads_images
    blind.push(Step(text="I cannot see it."))
    turn = run(_loop(session).send("What was it?", date="2026-12-08")).turn
    assert turn.status == TurnStatus.DONE, turn.error
    carried = _messages(blind.requests[0])[1]
    assert carried["content"][1] == {"type": "text", "text": WITHHELD}
    assert not image_spans(blind.requests[0])
    assert ModelRequest.objects.filter(session=session).order_by("-id")[0].break_cause == BreakCause.MODEL_CHANGE


def test_on_a_model_that_does_not_read_images_the_note_says_so_and_no_part_is_sent(
    blind: ScriptedServer, user: Any, workspace: Workspace
) -> None:
    session = _session(user, workspace, _endpoint(blind, "blind"))
    picture = _png()
    _attach(session, "shot.png", picture)
    blind.push(Step(text="ok"))
    turn = run(_loop(session).send("Look.", date="2026-12-08")).turn
    assert turn.status == TurnStatus.DONE, turn.error
    note = f"shot.png, {len(picture)} bytes, an image (the model is not shown images; read cannot open one)"
    assert note in turn.message
    assert _messages(blind.requests[0])[1] == {"role": "user", "content": turn.message}


def test_an_image_that_cannot_be_shown_is_said_and_kept_out(
    vision: ScriptedServer, user: Any, workspace: Workspace
) -> None:
    session = _session(user, workspace, _endpoint(vision, "vision"))
    problems = _attach(session, "broken.png", b"\x89PNG\r\n\x1a\nnot an image")
    assert problems == ["broken.png: the model cannot be shown it: it could not be read as an image."]
    vision.push(Step(text="ok"))
    turn = run(_loop(session).send("Look.", date="2026-12-08")).turn
    assert "broken.png, 20 bytes, an image that cannot be shown: it could not be read as an image" in turn.message
    assert _messages(vision.requests[0])[1] == {"role": "user", "content": turn.message}


def test_a_server_that_refuses_images_fails_the_reply_says_what_to_do_and_is_sent_none_again(
    user: Any, workspace: Workspace
) -> None:
    """Staff said the model reads images where the server does not say (no /props); the server refuses: the
    person's message and picture stay stored, the reply's error is the server's own and says how to go on, and
    the endpoint is known not to read images from then on, a later window check that says nothing included."""
    with ScriptedServer(server_api=False, when_empty=Step(fault="http500", text="script exhausted")) as silent:
        endpoint = ModelEndpoint.objects.create(
            name="said", base_url=silent.base_url, model="scripted", context_window=100_000, reads_images=True
        )
        assert endpoint.images_read
        session = _session(user, workspace, endpoint)
        _attach(session, "shot.png", _png())
        turn = run(_loop(session).send("Look.", date="2026-12-08")).turn
        assert turn.status == TurnStatus.FAILED
        assert NO_VISION in turn.error
        assert turn.error.endswith("compact the session, or retry with another model, to go on without them.")
        assert "shown with this message" in turn.message
        assert turn.uploads.get().image is not None
        endpoint.refresh_from_db()
        assert endpoint.server_reads_images is False and not endpoint.images_read and endpoint.reads_images
        endpoint_window(endpoint, refresh=True)
        endpoint.refresh_from_db()
        assert not endpoint.images_read, "a server that says nothing keeps what it showed"
        later = _session(user, workspace, endpoint)
        assert not Generation.objects.get(session=later).reads_images
