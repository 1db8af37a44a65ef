"""Attached images as a model that reads images is sent them: real files of each format, made by Pillow."""

from __future__ import annotations

import io
import struct
import zlib

import pytest
from PIL import Image

from chat.agent.images import ImageRefused, PreparedImage, attached_image, image_prepare, looks_like_image
from sessions_app import prompts


def _made(fmt: str, size: tuple[int, int] = (40, 30), mode: str = "RGB", **save: object) -> bytes:
    image = Image.new(mode, size, (200, 30, 30, 128) if mode == "RGBA" else (200, 30, 30))
    out = io.BytesIO()
    image.save(out, format=fmt, **save)
    return out.getvalue()


def _prepared(data: bytes) -> PreparedImage:
    prepared = image_prepare(data)
    assert isinstance(prepared, PreparedImage), prepared
    return prepared


def _decoded(prepared: PreparedImage) -> Image.Image:
    image = Image.open(io.BytesIO(prepared.data))
    image.load()
    return image


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_a_png_or_jpeg_that_fits_is_kept_byte_for_byte(fmt: str) -> None:
    data = _made(fmt)
    prepared = _prepared(data)
    assert prepared.data == data
    assert prepared.media_type == f"image/{fmt.lower()}"
    assert (prepared.width, prepared.height) == (40, 30)


@pytest.mark.parametrize(
    ("fmt", "mode", "sent"),
    [
        ("WEBP", "RGB", "JPEG"),
        ("BMP", "RGB", "JPEG"),
        ("GIF", "P", "JPEG"),
        ("TIFF", "RGB", "JPEG"),
        ("WEBP", "RGBA", "PNG"),
    ],
)
def test_other_formats_are_written_as_png_or_jpeg(fmt: str, mode: str, sent: str) -> None:
    """llama.cpp reads neither WebP nor AVIF (measured: HTTP 400, failed to load image): every image goes as PNG
    (where it has transparency) or JPEG."""
    prepared = _prepared(_made(fmt, mode=mode))
    assert prepared.media_type == f"image/{sent.lower()}"
    image = _decoded(prepared)
    assert image.format == sent
    assert image.size == (40, 30)


def test_a_large_image_is_scaled_to_the_longest_side() -> None:
    side = prompts.loop_settings().image_max_side
    prepared = _prepared(_made("PNG", size=(side * 2, side)))
    assert (prepared.width, prepared.height) == (side, side // 2)
    assert _decoded(prepared).size == (side, side // 2)


def test_a_photo_turned_by_its_exif_is_sent_upright() -> None:
    """A phone's photo is stored sideways with an orientation tag; a model's server decodes the pixels as stored."""
    image = Image.new("RGB", (60, 20), (10, 200, 10))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to show
    out = io.BytesIO()
    image.save(out, format="JPEG", exif=exif.tobytes())
    prepared = _prepared(out.getvalue())
    assert (prepared.width, prepared.height) == (20, 60)
    assert _decoded(prepared).getexif().get(0x0112) in (None, 1)


def test_a_decompression_bomb_is_refused_from_its_header() -> None:
    """A PNG whose header claims 30,000 x 30,000 pixels is refused before any pixel is decoded."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 30_000, 30_000, 8, 2, 0, 0, 0)
    bomb = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\x00" * 1000))
        + chunk(b"IEND", b"")
    )
    refused = image_prepare(bomb)
    assert isinstance(refused, ImageRefused)
    assert refused.problem == "it has more than the 50,000,000 pixels an image may have"


def test_a_broken_or_unknown_file_is_refused_with_a_reason() -> None:
    loop = prompts.loop_settings()
    truncated = _made("PNG")[:60]
    assert image_prepare(truncated) == ImageRefused(loop.image_unreadable_text)
    assert image_prepare(b"not an image at all") == ImageRefused(loop.image_unreadable_text)
    ico = _made("ICO", size=(32, 32))
    assert image_prepare(ico) == ImageRefused("ICO is not a format Cachet shows (PNG, JPEG, GIF, WebP, BMP, TIFF)")


def test_an_image_over_the_byte_limit_is_refused_unread(monkeypatch: pytest.MonkeyPatch) -> None:
    data = _made("PNG")
    lowered = _with(prompts.loop_settings(), image_max_bytes=len(data) - 1)
    monkeypatch.setattr(prompts, "loop_settings", lambda: lowered)
    refused = image_prepare(data)
    assert isinstance(refused, ImageRefused)
    assert refused.problem.endswith(f"over the {len(data) - 1} bytes an image may be")


def _with(settings: prompts.LoopSettings, **changed: object) -> prompts.LoopSettings:
    from dataclasses import replace

    return replace(settings, **changed)  # type: ignore[arg-type]


def test_what_counts_as_an_image() -> None:
    png = _made("PNG")
    assert looks_like_image("shot.png", png[:16])
    assert looks_like_image("no-suffix", png[:16])
    assert looks_like_image("photo.webp", _made("WEBP")[:16])
    assert not looks_like_image("notes.txt", b"hello there")
    assert attached_image("notes.txt", b"hello there") is None
    shown = attached_image("shot.png", png)
    assert shown is not None and shown.data == png and shown.media_type == "image/png" and not shown.problem
    broken = attached_image("broken.png", b"\x89PNG\r\n\x1a\nnot really")
    assert broken is not None and broken.data == b"" and broken.problem == prompts.loop_settings().image_unreadable_text
