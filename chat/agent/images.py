"""An attached image as a model that reads images is sent it: made once, when it is attached, and stored.

The image is decoded with Pillow, only from the formats listed here and never past ``loop.image_max_pixels``
(checked from its header, before any pixel is decoded). A PNG or JPEG that is upright, within
``loop.image_max_side`` and ``loop.image_sent_max_bytes`` is kept byte for byte; any other is turned upright (its
EXIF orientation), scaled down to fit the side, and written as PNG where it has transparency, else as JPEG — the
two formats every server that reads images accepts (llama.cpp reads neither WebP nor AVIF).
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

from sessions_app import prompts
from sessions_app.hygiene.notes import is_image, size_text
from sessions_app.services.uploads import UploadImage

OPENED_FORMATS = ("PNG", "JPEG", "GIF", "WEBP", "BMP", "TIFF")
KEPT_FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg"}
JPEG_QUALITY = 85
_ORIENTATION = 0x0112
_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"BM", b"II*\x00", b"MM\x00*")


@dataclass(frozen=True)
class PreparedImage:
    """An image as it is sent: its bytes, media type and size in pixels."""

    data: bytes
    media_type: str
    width: int
    height: int


@dataclass(frozen=True)
class ImageRefused:
    """An image that cannot be shown, and why, as a note says it."""

    problem: str


def looks_like_image(name: str, head: bytes) -> bool:
    """Whether an attached file is an image: by its first bytes, or by its name."""
    webp = head[:4] == b"RIFF" and head[8:12] == b"WEBP"
    return webp or head.startswith(_MAGIC) or is_image(name)


def attached_image(path: str, data: bytes) -> UploadImage | None:
    """An attached file as a model that reads images is sent it; ``None`` where it is not an image."""
    if not looks_like_image(path, data[:16]):
        return None
    prepared = image_prepare(data)
    if isinstance(prepared, ImageRefused):
        return UploadImage(problem=prepared.problem)
    return UploadImage(prepared.data, prepared.media_type, prepared.width, prepared.height)


def image_prepare(data: bytes) -> PreparedImage | ImageRefused:
    """``data`` as it is sent to a model that reads images, or why it cannot be."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    loop = prompts.loop_settings()
    if len(data) > loop.image_max_bytes:
        limit = size_text(loop.image_max_bytes)
        return ImageRefused(loop.image_bytes_text.format(size=size_text(len(data)), limit=limit))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=OPENED_FORMATS)
    except UnidentifiedImageError:
        return ImageRefused(_unopened(data, loop.image_format_text, loop.image_unreadable_text))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        return ImageRefused(loop.image_pixels_text.format(limit=f"{loop.image_max_pixels:,}"))
    except Exception:  # Pillow raises many kinds for a broken file
        return ImageRefused(loop.image_unreadable_text)
    with image:
        width, height = image.size
        if width * height > loop.image_max_pixels:
            return ImageRefused(loop.image_pixels_text.format(limit=f"{loop.image_max_pixels:,}"))
        try:
            image.load()  # every pixel decoded once: a truncated or broken file is refused here, not by the server
            fmt = image.format or ""
            upright = image.getexif().get(_ORIENTATION, 1) == 1
            fits = max(width, height) <= loop.image_max_side and len(data) <= loop.image_sent_max_bytes
            if fmt in KEPT_FORMATS and upright and fits and not getattr(image, "is_animated", False):
                return PreparedImage(data, KEPT_FORMATS[fmt], width, height)
            turned = ImageOps.exif_transpose(image)
            turned.thumbnail((loop.image_max_side, loop.image_max_side), Image.Resampling.LANCZOS)
            return _encoded(turned, loop.image_sent_max_bytes)
        except Exception:
            return ImageRefused(loop.image_unreadable_text)


def _unopened(data: bytes, format_text: str, unreadable_text: str) -> str:
    from PIL import Image

    try:
        fmt = Image.open(io.BytesIO(data)).format  # a format Pillow knows but Cachet does not show
    except Exception:
        return unreadable_text
    return format_text.format(format=fmt or "This") if fmt else unreadable_text


def _encoded(image: object, max_bytes: int) -> PreparedImage:
    from PIL import Image

    assert isinstance(image, Image.Image)
    transparent = image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info
    if transparent:
        png = io.BytesIO()
        image.convert("RGBA").save(png, format="PNG", optimize=True)
        if png.tell() <= max_bytes:
            return PreparedImage(png.getvalue(), "image/png", *image.size)
        flat = Image.new("RGB", image.size, "white")
        flat.paste(image.convert("RGBA"), mask=image.convert("RGBA").getchannel("A"))
        image = flat
    jpeg = io.BytesIO()
    image.convert("RGB").save(jpeg, format="JPEG", quality=JPEG_QUALITY, optimize=True)
    return PreparedImage(jpeg.getvalue(), "image/jpeg", *image.size)
