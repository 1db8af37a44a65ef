"""An attached image through the reply loop to a real llama.cpp server started with a vision projector (a
generated model and projector): the server says it reads images, reads the image, and finds it cached after."""

from __future__ import annotations

import io
import random
from collections.abc import Iterator
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
from sessions_app.models import BreakCause, ChatSession, ModelEndpoint, ModelRequest, TurnStatus, Workspace
from sessions_app.services.sessions import session_start
from testing.tiny_gguf import ModelShape, ProjectorShape, write_model, write_projector
from tests.agent.loop_helpers import run

pytest.importorskip("xllamacpp")

from testing.llama import LlamaServer

pytestmark = [pytest.mark.llama, pytest.mark.django_db(transaction=True)]

SHAPE = ModelShape(ctx=8192)
PROJECTOR = ProjectorShape(text_dim=SHAPE.dim)
TIMEOUTS = Timeouts(connect=5, first_token=60, between_chunks=30)


@pytest.fixture(scope="module")
def llama_vision(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    folder = tmp_path_factory.mktemp("vision")
    model = write_model(folder / "tiny.gguf", SHAPE)
    projector = write_projector(folder / "tiny.mmproj.gguf", PROJECTOR)
    with LlamaServer(model, ctx_size=SHAPE.ctx, n_predict=8, alias="tiny", projector=projector) as server:
        yield server


def _photo() -> bytes:
    out = io.BytesIO()
    noise = random.Random(7).randbytes(320 * 240 * 3)  # a photo's worth of detail: tens of kilobytes
    Image.frombytes("RGB", (320, 240), noise).save(out, format="JPEG", quality=90)
    return out.getvalue()


def test_llama_cpp_reads_an_attached_image_and_finds_it_cached_on_the_next_turn(
    llama_vision: LlamaServer, user: Any, workspace: Workspace, workspace_dir: Path
) -> None:
    endpoint = ModelEndpoint.objects.create(name="llama", base_url=llama_vision.base_url, model="tiny")
    endpoint_window(endpoint, refresh=True)
    assert endpoint.server_reads_images is True
    session = session_start(
        owner=user, workspace=workspace, endpoint=endpoint, model_name="tiny", tools=tool_list(allow_commands=False)
    )
    loop = ReplyLoop(ChatSession.objects.get(pk=session.pk), client_timeouts=TIMEOUTS)
    text_only = run(loop.send("Describe nothing yet.", date="2026-12-08")).turn
    assert text_only.status == TurnStatus.DONE, text_only.error
    written, problems = attach_files(session, [SimpleUploadedFile("photo.jpg", _photo())])
    assert problems == [] and [done.path for done in written] == ["photo.jpg"]
    with_image = run(loop.send("What is in this photo?", date="2026-12-08")).turn
    assert with_image.status == TurnStatus.DONE, with_image.error
    assert "photo.jpg" in with_image.message and "shown with this message" in with_image.message
    after = run(loop.send("And again?", date="2026-12-08")).turn
    assert after.status == TurnStatus.DONE, after.error

    requests = list(ModelRequest.objects.filter(session=session).order_by("id"))
    assert [request.images for request in requests] == [0, 1, 1]
    assert all(request.break_cause in (BreakCause.FIRST, "") for request in requests)
    first, second, third = requests
    assert first.prompt_tokens and second.prompt_tokens and third.prompt_tokens
    # the image costs the projector's tokens, not its bytes: far fewer tokens than base64 characters
    assert second.image_bytes > 10_000
    assert second.prompt_tokens - first.prompt_tokens < second.image_bytes // 20
    # the next turn re-sends the same image bytes, and the server reuses what it read of them
    assert third.cached_tokens is not None and third.cached_tokens >= second.prompt_tokens - 1
