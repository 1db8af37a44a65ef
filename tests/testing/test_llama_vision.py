"""A real llama.cpp server (xllamacpp, in-process) that reads images: a generated model and vision projector."""

from __future__ import annotations

import base64
import json
import struct
import zlib
from pathlib import Path
from typing import Any

import httpx
import pytest

from chat.agent.model import Completion, ModelHTTPError, Timeouts, stream_chat
from testing.tiny_gguf import ModelShape, ProjectorShape, write_model, write_projector

pytest.importorskip("xllamacpp")

from testing.llama import LlamaServer

SHAPE = ModelShape(layers=2, dim=256, heads=4, ff=512, ctx=2048)
TIMEOUTS = Timeouts(connect=5.0, first_token=60.0, between_chunks=30.0)


def png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A PNG of one colour, made with the standard library."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def content(*images: bytes) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "What is this?"}]
    for image in images:
        url = "data:image/png;base64," + base64.b64encode(image).decode()
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts


def body(parts: list[dict[str, Any]]) -> bytes:
    request = {
        "model": "tiny",
        "messages": [{"role": "user", "content": parts}],
        "max_tokens": 4,
        "temperature": 0,
        "seed": 1,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return json.dumps(request).encode()


async def ask(server: LlamaServer, parts: list[dict[str, Any]]) -> Completion:
    return await stream_chat(base_url=server.base_url, api_key=None, body=body(parts), timeouts=TIMEOUTS).complete()


def modalities(server: LlamaServer) -> dict[str, bool]:
    response = httpx.get(server.address + "/props", timeout=5.0)
    assert response.status_code == 200
    found: dict[str, bool] = response.json()["modalities"]
    return found


@pytest.mark.llama
@pytest.mark.asyncio
async def test_a_server_with_the_projector_reads_images(tmp_path: Path) -> None:
    model = write_model(tmp_path / "tiny.gguf", SHAPE)
    shape = ProjectorShape(text_dim=SHAPE.dim)
    projector = write_projector(tmp_path / "tiny.mmproj.gguf", shape)
    with LlamaServer(model, ctx_size=SHAPE.ctx, threads=2, projector=projector) as server:
        assert modalities(server) == {"vision": True, "video": True, "audio": False}
        text = await ask(server, content())
        small = await ask(server, content(png(16, 16, (200, 30, 30))))
        large = await ask(server, content(png(300, 200, (30, 30, 200))))
        two = await ask(server, content(png(16, 16, (200, 30, 30)), png(300, 200, (30, 30, 200))))

    for done in (text, small, large, two):
        assert isinstance(done, Completion)
        assert done.usage is not None and done.prompt_tokens is not None
        assert done.completion_tokens is not None and 1 <= done.completion_tokens <= 4
    assert text.prompt_tokens is not None
    # every image is resized to the projector's size: one patch, one token, whatever the image's own size
    assert shape.image_tokens == (64 // 16) ** 2
    assert small.prompt_tokens == text.prompt_tokens + shape.image_tokens
    assert large.prompt_tokens == small.prompt_tokens
    assert two.prompt_tokens == text.prompt_tokens + 2 * shape.image_tokens


@pytest.mark.llama
@pytest.mark.asyncio
async def test_a_server_without_a_projector_refuses_images(tmp_path: Path) -> None:
    model = write_model(tmp_path / "tiny.gguf", SHAPE)
    with LlamaServer(model, ctx_size=SHAPE.ctx, threads=2) as server:
        assert modalities(server) == {"vision": False, "video": False, "audio": False}
        with pytest.raises(ModelHTTPError) as refused:
            await ask(server, content(png(16, 16, (200, 30, 30))))
        answered = await ask(server, content())

    assert refused.value.status == 500
    assert "image input is not supported" in refused.value.excerpt
    assert "mmproj" in refused.value.excerpt
    assert isinstance(answered, Completion)


def test_the_projector_reaches_the_server_params(tmp_path: Path) -> None:
    assert LlamaServer(tmp_path / "m.gguf").params().mmproj.path == ""
    params = LlamaServer(tmp_path / "m.gguf", projector=tmp_path / "m.mmproj.gguf").params()
    assert params.mmproj.path == str(tmp_path / "m.mmproj.gguf")


def test_the_projector_is_the_same_for_the_same_shape(tmp_path: Path) -> None:
    first = write_projector(tmp_path / "a.gguf", ProjectorShape(image=112, patch=14)).read_bytes()
    assert write_projector(tmp_path / "b.gguf", ProjectorShape(image=112, patch=14)).read_bytes() == first
    assert ProjectorShape(image=112, patch=14).image_tokens == 64
    with pytest.raises(ValueError, match="multiple of patch"):
        write_projector(tmp_path / "c.gguf", ProjectorShape(image=100, patch=16))
