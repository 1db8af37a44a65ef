"""Taking a session out and bringing one in: Export as Markdown or JSON, and Import of that JSON.

An export is written to a spooled file (kept in memory up to :data:`SPOOL_BYTES`, on disk beyond) as the rows are
read, then sent a block at a time, so a large session is never held whole.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import AsyncIterator, Iterable, Iterator
from datetime import datetime
from typing import IO

from django.contrib.auth.decorators import login_required
from django.core.handlers.asgi import ASGIRequest
from django.http import Http404, HttpRequest, StreamingHttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET

from chat.web.display import call_target, result_id, result_status, rows_queryset
from sessions_app.models import ChatSession, Result, Step, Turn, TurnStatus
from sessions_app.selectors.exports import session_export
from sessions_app.selectors.sessions import session_get

SPOOL_BYTES = 4 * 1024 * 1024
BLOCK_BYTES = 64 * 1024
MARKDOWN_TURNS = 50


def export_filename(session: ChatSession, extension: str) -> str:
    """``cachet-12-the-title.md``: the session's id and its title in plain letters."""
    slug = re.sub(r"[^a-z0-9]+", "-", (session.title or "session").lower()).strip("-")[:60].strip("-")
    return f"cachet-{session.pk}-{slug or 'session'}.{extension}"


def _tool_line(step: Step, call: dict[str, str], result: Result | None) -> str:
    tool = str(call.get("name", ""))
    target = call_target(tool, str(call.get("arguments", "")))
    if result is None:
        return f"- `… {tool} {target} — not run`".replace("  ", " ")
    return f"- `{result_id(result.number)} {tool} {target} — {result_status(result)}`".replace("  ", " ")


def _turn_markdown(turn: Turn, steps: list[Step], results: list[Result]) -> Iterator[str]:
    yield f"\n## Turn {turn.position}\n\n**You:**\n\n{turn.words}\n\n**Reply:**\n"
    by_call = {result.call_id: result for result in results}
    stepped: list[str] = []
    for step in steps:
        if step.text:
            stepped.append(step.text)
            yield f"\n{step.text}\n"
        lines = [_tool_line(step, dict(call), by_call.get(str(call.get("id", "")))) for call in step.tool_calls]
        if lines:
            yield "\n" + "\n".join(lines) + "\n"
    stepped_text = "\n\n".join(stepped)
    if turn.reply_text and turn.reply_text != stepped_text and turn.reply_text.startswith(stepped_text):
        yield "\n" + turn.reply_text[len(stepped_text) :].lstrip("\n") + "\n"
    if turn.status in (TurnStatus.FAILED, TurnStatus.INTERRUPTED) and turn.error:
        yield f"\n*The reply did not finish: {turn.error}*\n"


def markdown_chunks(session: ChatSession, *, exported_at: datetime) -> Iterator[str]:
    """The conversation as a person reads it: the live branch, each message and reply, and each tool call as its
    one line (``#0003 read src/app.py — lines 1-200 of 340``). Turns are read a few at a time."""
    title = " ".join((session.title or "Session").split())
    yield f"# {title}\n\nWorkspace {session.workspace.name} · model {session.model_name} · "
    yield f"exported {exported_at:%Y-%m-%d %H:%M} UTC\n"
    after = 0
    while True:
        turns = list(
            Turn.objects.filter(session=session, number__gt=after)
            .exclude(status=TurnStatus.TAKEN_BACK)
            .order_by("number")[:MARKDOWN_TURNS]
        )
        if not turns:
            return
        ids = [turn.pk for turn in turns]
        steps: dict[int, list[Step]] = {}
        for step in Step.objects.filter(turn_id__in=ids).order_by("turn_id", "number"):
            steps.setdefault(step.turn_id, []).append(step)
        results: dict[int, list[Result]] = {}
        for result in rows_queryset(Result.objects.filter(turn_id__in=ids)).order_by("number"):
            results.setdefault(result.turn_id, []).append(result)
        for turn in turns:
            yield from _turn_markdown(turn, steps.get(turn.pk, []), results.get(turn.pk, []))
        after = turns[-1].number


def _spooled(chunks: Iterable[str]) -> IO[bytes]:
    spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)  # noqa: SIM115 - the response closes it
    for chunk in chunks:
        spool.write(chunk.encode())
    spool.seek(0)
    return spool


def _blocks(spool: IO[bytes]) -> Iterator[bytes]:
    try:
        while block := spool.read(BLOCK_BYTES):
            yield block
    finally:
        spool.close()


async def _async_blocks(spool: IO[bytes]) -> AsyncIterator[bytes]:
    for block in _blocks(spool):
        yield block


def download(request: HttpRequest, chunks: Iterable[str], *, filename: str, content_type: str) -> StreamingHttpResponse:
    """``chunks`` as a file to save, sent a block at a time (asynchronously under ASGI)."""
    spool = _spooled(chunks)
    size = spool.seek(0, 2)
    spool.seek(0)
    content = _async_blocks(spool) if isinstance(request, ASGIRequest) else _blocks(spool)
    response = StreamingHttpResponse(content, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    response["Content-Length"] = str(size)
    return response


def _owned(request: HttpRequest, session_id: int) -> ChatSession:
    session = session_get(owner=request.user, session_id=session_id)
    if session is None:
        raise Http404("No such session.")
    return session


@login_required
@require_GET
def export_markdown(request: HttpRequest, session_id: int) -> StreamingHttpResponse:
    session = _owned(request, session_id)
    chunks = markdown_chunks(session, exported_at=timezone.now())
    return download(
        request, chunks, filename=export_filename(session, "md"), content_type="text/markdown; charset=utf-8"
    )


@login_required
@require_GET
def export_json(request: HttpRequest, session_id: int) -> StreamingHttpResponse:
    session = _owned(request, session_id)
    chunks = session_export(owner=request.user, session_id=session.pk, exported_at=timezone.now())
    if chunks is None:
        raise Http404("No such session.")
    return download(request, chunks, filename=export_filename(session, "json"), content_type="application/json")
