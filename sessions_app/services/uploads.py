"""Files a person attached to a session: recorded once written into its workspace, said by the next message."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.db import transaction

from sessions_app.models import ChatSession, Turn, Upload
from sessions_app.text import storable


@dataclass(frozen=True)
class UploadImage:
    """An attached image as it is sent to a model that reads images (``data`` empty: it cannot be, ``problem``
    says why)."""

    data: bytes = b""
    media_type: str = ""
    width: int | None = None
    height: int | None = None
    problem: str = ""


@transaction.atomic
def upload_record(
    *, session: ChatSession, path: str, size: int, sha256: str, image: UploadImage | None = None
) -> Upload:
    """Record a file written into the session's workspace; the next message's note says it arrived. The same path
    attached again before that message is said once, with its latest size. ``image``: the file is an image, as it
    is sent to a model that reads images."""
    Upload.objects.filter(session=session, turn__isnull=True, path=path).delete()
    shown = image or UploadImage()
    return Upload.objects.create(
        session=session,
        path=storable(path),
        size=size,
        sha256=sha256,
        image=shown.data or None,
        image_type=shown.media_type,
        image_width=shown.width,
        image_height=shown.height,
        image_problem=storable(shown.problem)[:300],
    )


@transaction.atomic
def upload_forget(*, upload: Upload) -> None:
    """The next message no longer says ``upload`` arrived (a waiting one only)."""
    Upload.objects.filter(pk=upload.pk, turn__isnull=True).delete()


@transaction.atomic
def uploads_unsay(*, session: ChatSession, turns: Sequence[Turn]) -> None:
    """``turns`` are taken back: the files their messages said arrived wait again, and the next message says them
    (a file attached again since is said once, as attached last)."""
    returning = Upload.objects.filter(session=session, turn__in=turns)
    waiting = set(Upload.objects.filter(session=session, turn__isnull=True).values_list("path", flat=True))
    returning.filter(path__in=waiting).delete()
    returning.update(turn=None)
