"""The REST API, ``/api/v1/``: a person's sessions as their pages and tabs see them, under a personal access token.

Every route reads the session through the selectors that take its owner (another person's session is a 404, as
on the pages), refuses what the websocket refuses (a workspace or endpoint no longer theirs, a reply running),
and queues actions for the workers exactly as a tab does. Actions answer 202 with the job queued; asked with
``Accept: text/event-stream``, they answer the job's typed events instead, to its end (``chat.api.stream``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

from django.conf import settings
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from ninja import NinjaAPI, Query, Router, Status
from ninja.errors import ValidationError

from chat import wire
from chat.actions import Action, Regenerate, Rewind, Send, Undo
from chat.api import schemas, stream
from chat.api.auth import ApiRefused, TokenAuth
from chat.web import queueing
from chat.web.display import result_id, result_status
from chat.web.forms import NewSessionForm
from chat.web.socket_store import store_call
from chat.web.transfer import download, export_filename, markdown_chunks
from chat.web.views import new_chat
from sessions_app.errors import ReplyInProgress, StoreError
from sessions_app.models import ChatSession, Result, Step, Turn, TurnStatus
from sessions_app.selectors.exports import session_export
from sessions_app.selectors.sessions import (
    endpoint_list,
    endpoint_refusal,
    endpoints_for,
    result_get,
    session_get,
    session_list,
    workspace_refusal,
    workspaces_for,
)
from sessions_app.selectors.totals import listed_totals, with_totals
from sessions_app.services.locks import reply_running, sessions_running
from sessions_app.services.sessions import session_archive, session_delete, session_pin, session_rename
from sessions_app.services.workspaces import workspace_private

api = NinjaAPI(
    title="Cachet API",
    version="1",
    description="A person's chat sessions with the team's model, under a personal access token.",
    urls_namespace="api-v1",
    auth=TokenAuth(),
    openapi_url="/openapi.json",
    docs_url=None,
)
router = Router(tags=["sessions"])

NOT_FOUND = "No such session."
LIST_LIMIT = 200
EVENT_STREAM = "text/event-stream"
ERRORS: dict[int, Any] = {
    401: schemas.Problem,
    403: schemas.Problem,
    404: schemas.Problem,
    422: schemas.Invalid,
    429: schemas.Problem,
}
ACTION_ERRORS: dict[int, Any] = {**ERRORS, 409: schemas.Problem, 413: schemas.Problem}
STREAM_DOC = {"responses": {202: {"content": {EVENT_STREAM: {"schema": {"type": "string"}}}}}}


def _field(where: Sequence[object]) -> str:
    """The field pydantic's ``loc`` names: without where it came (``body``) and the body's own name."""
    parts = [str(part) for part in where]
    return ".".join(parts[2:] if parts[:1] == ["body"] and len(parts) > 2 else parts[1:] or parts)


@api.exception_handler(ValidationError)
def _invalid(request: HttpRequest, error: ValidationError) -> HttpResponse:
    said = [f"{_field(item.get('loc', ()))}: {item.get('msg', '')}" for item in error.errors]
    detail = "The request is not as the schema says. " + " ".join(said)
    return api.create_response(request, {"detail": detail, "errors": error.errors}, status=422)


@api.exception_handler(ApiRefused)
def _refused(request: HttpRequest, error: ApiRefused) -> HttpResponse:
    answer = api.create_response(request, {"detail": error.detail}, status=error.status)
    for name, value in error.headers.items():
        answer[name] = value
    return answer


def _user(request: HttpRequest) -> User:
    user = request.user
    assert isinstance(user, User), "TokenAuth sets the token's owner"
    return user


def _owned(request: HttpRequest, session_id: int) -> ChatSession:
    session = session_get(owner=request.user, session_id=session_id)
    if session is None:
        raise ApiRefused(404, NOT_FOUND)
    return session


def _session_out(request: HttpRequest, session: ChatSession, *, running: bool) -> dict[str, Any]:
    totals = listed_totals(session)
    refused = workspace_refusal(session=session)
    return {
        "id": session.pk,
        "title": session.title,
        "workspace": session.workspace.name,
        "endpoint": session.endpoint.name,
        "model": session.model_name,
        "mode": session.mode,
        "pinned": session.pinned,
        "archived": session.archived,
        "revision": session.revision,
        "running": running,
        "read_only": str(refused) if refused is not None else "",
        "created_at": session.created_at,
        "updated_at": session.updated_at,
        "url": request.build_absolute_uri(reverse("session", args=[session.pk])),
        "totals": {
            "requests": totals.requests,
            "prompt_tokens": totals.prompt_tokens,
            "cached_tokens": totals.cached_tokens,
            "processed_tokens": totals.processed_tokens,
            "prompt_seconds": totals.prompt_seconds,
            "saved_seconds": totals.saved_seconds,
        },
    }


def _one_session(request: HttpRequest, session_id: int) -> dict[str, Any]:
    session = with_totals(session_list(owner=request.user)).filter(pk=session_id).first()
    if session is None:
        raise ApiRefused(404, NOT_FOUND)
    return _session_out(request, session, running=reply_running(session))


def _events_url(request: HttpRequest, session_id: int, job_id: int) -> str:
    return request.build_absolute_uri(reverse("api-v1:session_events", args=[session_id]) + f"?job={job_id}")


def _wants_stream(request: HttpRequest) -> bool:
    return EVENT_STREAM in request.headers.get("Accept", "")


@api.get("/me", response={200: schemas.Me, **ERRORS}, tags=["account"], summary="Who the token belongs to")
def me(request: HttpRequest) -> dict[str, Any]:
    token = request.auth  # type: ignore[attr-defined]
    user = _user(request)
    return {
        "username": user.get_username(),
        "staff": user.is_staff,
        "token": {"name": token.name, "access": token.access},
    }


@router.get("", response={200: schemas.SessionList, **ERRORS}, summary="List sessions")
def sessions_list(
    request: HttpRequest, archived: bool = False, limit: Query[int] = 50, offset: Query[int] = 0
) -> dict[str, Any]:
    """The person's sessions, pinned first, then the last changed; the archived ones alone with ``archived``."""
    limit, offset = max(1, min(limit, LIST_LIMIT)), max(0, offset)
    listed = session_list(owner=request.user).filter(archived=archived)
    page = list(with_totals(listed).order_by("-pinned", "-updated_at", "-pk")[offset : offset + limit])
    running = sessions_running([session.pk for session in page])
    return {
        "count": listed.count(),
        "items": [_session_out(request, session, running=session.pk in running) for session in page],
    }


@router.get(
    "/{int:session_id}", response={200: schemas.SessionOut, **ERRORS}, url_name="session", summary="Read a session"
)
def session_read(request: HttpRequest, session_id: int) -> dict[str, Any]:
    return _one_session(request, session_id)


@router.patch(
    "/{int:session_id}", response={200: schemas.SessionOut, **ERRORS}, summary="Rename, pin or archive a session"
)
def session_change(request: HttpRequest, session_id: int, change: schemas.SessionChange) -> dict[str, Any]:
    session = _owned(request, session_id)
    if change.title is not None:
        session_rename(session=session, title=change.title)
    if change.archived is not None:
        session = session_archive(session=session, archived=change.archived)
    if change.pinned is not None:
        session_pin(session=session, pinned=change.pinned and not session.archived)
    return _one_session(request, session_id)


@router.delete("/{int:session_id}", response={204: None, **ERRORS}, summary="Delete a session")
def session_remove(request: HttpRequest, session_id: int) -> Status[None]:
    """The session leaves everything its owner sees; it stays stored whole for the admin."""
    session_delete(session=_owned(request, session_id))
    return Status(204, None)


def _form_data(user: User, body: schemas.SessionCreate) -> dict[str, Any]:
    """The New chat form's fields for ``body``: the person's own workspace and first endpoint where it names none;
    one it names that they may not use is one there is not (404)."""
    workspace = body.workspace
    if workspace is None:
        try:
            workspace = workspace_private(user=user).pk
        except StoreError as error:
            raise ApiRefused(422, str(error)) from error
    elif not workspaces_for(user=user).filter(pk=workspace).exists():
        raise ApiRefused(404, f"There is no workspace {workspace} open to you.")
    endpoint = body.endpoint
    if endpoint is None:
        usable = endpoint_list(user=user)
        if not usable:
            raise ApiRefused(403, "No model endpoint is open to you; staff grant endpoints in the admin.")
        endpoint = usable[0].pk
    elif not endpoints_for(user=user).filter(pk=endpoint).exists():
        raise ApiRefused(404, f"There is no model endpoint {endpoint} open to you.")

    def blank(value: object) -> object:
        return "" if value is None else value

    return {
        "text": body.text,
        "workspace": workspace,
        "endpoint": str(endpoint),
        "model": body.model,
        "mode": body.mode,
        "instructions": body.instructions,
        "temperature": blank(body.temperature),
        "max_tokens": blank(body.max_tokens),
    }


def _created(user: User, body: schemas.SessionCreate) -> ChatSession:
    form = NewSessionForm(_form_data(user, body), user=user)
    if not form.is_valid():
        said = [f"{name}: {message}" for name, messages in form.errors.items() for message in messages]
        raise ApiRefused(422, "The session was not made. " + " ".join(said))
    return new_chat(owner=user, form=form, files=[])


@router.post(
    "",
    response={201: schemas.Created, **ACTION_ERRORS},
    summary="Start a session with its first message",
    openapi_extra={"responses": {201: {"content": {EVENT_STREAM: {"schema": {"type": "string"}}}}}},
)
async def session_create(request: HttpRequest, body: schemas.SessionCreate) -> Any:
    """Store a new session with its first message and queue its reply, as New chat does."""
    user = _user(request)
    session = await store_call(_created)(user, body)
    words = body.text.strip()
    if _wants_stream(request):
        layer, channel = await stream.joined(session.pk)
        queued = await queueing.start(session.pk, Send(words=words), reply_to=channel)
        assert queued is not None, "a new session has no job waiting"
        answer = stream.job_response(layer, channel, session.pk, queued.job_id)
        answer.status_code = 201
        return answer
    queued = await queueing.start(session.pk, Send(words=words), reply_to=None)
    assert queued is not None, "a new session has no job waiting"
    out = await store_call(_one_session)(request, session.pk)
    return Status(
        201, {"session": out, "job": queued.job_id, "events": _events_url(request, session.pk, queued.job_id)}
    )


def _acting(request: HttpRequest, session_id: int, *, asking: bool) -> bool:
    """The session may be acted on (a 404, 403 or 409 where not); whether a reply runs in it."""
    session = _owned(request, session_id)
    refused: StoreError | None = workspace_refusal(session=session)
    if refused is None and asking:
        refused = endpoint_refusal(session=session)
    if refused is not None:
        raise ApiRefused(403, str(refused))
    return reply_running(session)


async def _start(request: HttpRequest, session_id: int, action: Action, *, asking: bool) -> Any:
    running = await store_call(_acting)(request, session_id, asking=asking)
    if running:
        raise ApiRefused(409, str(ReplyInProgress()))
    if _wants_stream(request):
        layer, channel = await stream.joined(session_id)
        queued = await queueing.start(session_id, action, reply_to=channel)
        if queued is None:
            await layer.group_discard(wire.session_group(session_id), channel)
            raise ApiRefused(409, str(ReplyInProgress()))
        answer: HttpResponseBase = stream.job_response(layer, channel, session_id, queued.job_id)
        answer.status_code = 202
        return answer
    queued = await queueing.start(session_id, action, reply_to=None)
    if queued is None:
        raise ApiRefused(409, str(ReplyInProgress()))
    return Status(
        202, {"session": session_id, "job": queued.job_id, "events": _events_url(request, session_id, queued.job_id)}
    )


def _said_words(said: schemas.Said) -> str:
    words = said.text.strip()
    if not words:
        raise ApiRefused(422, "Write a message first.")
    size = len(said.text.encode("utf-8", "surrogatepass"))
    if size > settings.CACHET_MAX_MESSAGE_BYTES:
        raise ApiRefused(
            413, f"That message is {size} bytes; the most Cachet takes is {settings.CACHET_MAX_MESSAGE_BYTES} bytes."
        )
    return words


@router.post(
    "/{int:session_id}/messages",
    response={202: schemas.Queued, **ACTION_ERRORS},
    summary="Send a message",
    openapi_extra=STREAM_DOC,
)
async def message_send(request: HttpRequest, session_id: int, said: schemas.Said) -> Any:
    """Store the message and queue the model's reply."""
    return await _start(request, session_id, Send(words=_said_words(said)), asking=True)


@router.post(
    "/{int:session_id}/regenerate",
    response={202: schemas.Queued, **ACTION_ERRORS},
    summary="Ask the last reply again",
    openapi_extra=STREAM_DOC,
)
async def reply_regenerate(request: HttpRequest, session_id: int, restore: schemas.Restore) -> Any:
    """Take back the last reply (it stays as a branch) and ask the model again."""
    return await _start(request, session_id, Regenerate(restore=restore.restore), asking=True)


@router.post(
    "/{int:session_id}/undo",
    response={202: schemas.Queued, **ACTION_ERRORS},
    summary="Take back the last turn",
    openapi_extra=STREAM_DOC,
)
async def turn_undo(request: HttpRequest, session_id: int, restore: schemas.Restore) -> Any:
    return await _start(request, session_id, Undo(restore=restore.restore), asking=False)


@router.post(
    "/{int:session_id}/rewind",
    response={202: schemas.Queued, **ACTION_ERRORS},
    summary="Take back a turn and every later one",
    openapi_extra=STREAM_DOC,
)
async def turn_rewind(request: HttpRequest, session_id: int, rewind: schemas.RewindTo) -> Any:
    return await _start(request, session_id, Rewind(turn=rewind.turn, restore=rewind.restore), asking=False)


@router.post("/{int:session_id}/stop", response={200: schemas.Stopped, **ERRORS}, summary="Stop the running reply")
async def reply_stop(request: HttpRequest, session_id: int) -> dict[str, bool]:
    """Stop the session's reply wherever it runs, and take out a job of it still waiting."""
    await store_call(_owned)(request, session_id)
    return {"sent": await queueing.stop(session_id)}


@router.get(
    "/{int:session_id}/events",
    url_name="session_events",
    summary="Follow the session's events (Server-Sent Events)",
    response={200: None, **ERRORS},
    openapi_extra={"responses": {200: {"content": {EVENT_STREAM: {"schema": {"type": "string"}}}}}},
)
async def session_events(request: HttpRequest, session_id: int, job: Query[int | None] = None) -> Any:
    """Every typed event of the session from now on; with ``job``, those of that job to its end."""
    await store_call(_owned)(request, session_id)
    layer, channel = await stream.joined(session_id)
    if job is None:
        return stream.session_response(layer, channel, session_id)
    return stream.job_response(layer, channel, session_id, job, gone=stream.JOB_GONE)


def _calls(step: Step, results: dict[tuple[int, str], int]) -> list[dict[str, Any]]:
    calls = []
    for call in step.tool_calls or []:
        number = results.get((step.pk, str(call.get("id", ""))))
        calls.append(
            {
                "name": str(call.get("name", "")),
                "arguments": str(call.get("arguments", "")),
                "result": result_id(number) if number is not None else None,
            }
        )
    return calls


def _turns_out(turns: list[Turn]) -> list[dict[str, Any]]:
    steps: dict[int, list[Step]] = {}
    for step in Step.objects.filter(turn__in=turns).order_by("turn_id", "number"):
        steps.setdefault(step.turn_id, []).append(step)
    results = {
        (step_id, call_id): number
        for step_id, call_id, number in Result.objects.filter(turn__in=turns, step__isnull=False).values_list(
            "step_id", "call_id", "number"
        )
    }
    parents = dict(
        Turn.objects.filter(pk__in=[turn.parent_id for turn in turns if turn.parent_id]).values_list("pk", "number")
    )
    return [
        {
            "number": turn.number,
            "position": turn.position,
            "parent": parents.get(turn.parent_id) if turn.parent_id else None,
            "status": turn.status,
            "live": turn.status != TurnStatus.TAKEN_BACK,
            "words": turn.words,
            "reply": turn.reply_text,
            "error": turn.error,
            "rating": turn.rating,
            "started_at": turn.started_at,
            "finished_at": turn.finished_at,
            "steps": [
                {
                    "number": step.number,
                    "text": step.text,
                    "reasoning": step.reasoning,
                    "finish_reason": step.finish_reason,
                    "tool_calls": _calls(step, results),
                }
                for step in steps.get(turn.pk, [])
            ],
        }
        for turn in turns
    ]


@router.get("/{int:session_id}/turns", response={200: schemas.TurnList, **ERRORS}, summary="Read the turns")
def turns_list(
    request: HttpRequest, session_id: int, taken_back: bool = False, limit: Query[int] = 50, offset: Query[int] = 0
) -> dict[str, Any]:
    """The live branch's turns, oldest first (every stored turn, taken back too, with ``taken_back``)."""
    session = _owned(request, session_id)
    limit, offset = max(1, min(limit, LIST_LIMIT)), max(0, offset)
    turns = Turn.objects.filter(session=session)
    if not taken_back:
        turns = turns.exclude(status=TurnStatus.TAKEN_BACK)
    page = list(turns.order_by("number")[offset : offset + limit])
    return {"count": turns.count(), "items": _turns_out(page)}


@router.get("/{int:session_id}/turns/{int:number}", response={200: schemas.TurnOut, **ERRORS}, summary="Read a turn")
def turn_read(request: HttpRequest, session_id: int, number: int) -> dict[str, Any]:
    session = _owned(request, session_id)
    turn = Turn.objects.filter(session=session, number=number).first()
    if turn is None:
        raise ApiRefused(404, "No such turn.")
    return _turns_out([turn])[0]


def _result_number(text: str) -> int:
    digits = text.strip().removeprefix("#")
    try:
        number = int(digits, 16)
    except ValueError:
        raise ApiRefused(404, "No such result: give its id as the model saw it, as 0012 or #0012.") from None
    if number < 1 or len(digits) > 16:
        raise ApiRefused(404, "No such result.")
    return number


@router.get(
    "/{int:session_id}/results/{rid}", response={200: schemas.ResultOut, **ERRORS}, summary="Read a result by its id"
)
def result_read(request: HttpRequest, session_id: int, rid: str) -> dict[str, Any]:
    """A stored tool result, whole, by its id as the model saw it (``0012``, or ``%230012`` for ``#0012``)."""
    result = result_get(owner=request.user, session_id=session_id, number=_result_number(rid))
    if result is None:
        raise ApiRefused(404, "No such result.")
    return {
        "id": result_id(result.number),
        "number": result.number,
        "turn": Turn.objects.filter(pk=result.turn_id).values_list("number", flat=True).get(),
        "tool": result.tool,
        "arguments": result.arguments_raw,
        "kind": result.kind,
        "status": result_status(result),
        "inserted_text": result.inserted_text,
        "full_text": result.full_text,
        "path": result.path,
        "created_at": result.created_at,
    }


@router.get(
    "/{int:session_id}/export",
    summary="Export a session",
    response={200: None, **ERRORS},
    openapi_extra={
        "responses": {
            200: {
                "content": {
                    "application/json": {"schema": {"type": "object"}},
                    "text/markdown": {"schema": {"type": "string"}},
                }
            }
        }
    },
)
def session_export_view(
    request: HttpRequest, session_id: int, format: Literal["json", "markdown"] = "json"
) -> HttpResponseBase:
    """The session as the page's Export gives it: JSON (every branch; importable again) or Markdown."""
    session = _owned(request, session_id)
    now = timezone.now()
    if format == "markdown":
        chunks = markdown_chunks(session, exported_at=now)
        return download(
            request, chunks, filename=export_filename(session, "md"), content_type="text/markdown; charset=utf-8"
        )
    if format != "json":
        raise ApiRefused(422, "An export is json or markdown.")
    exported = session_export(owner=request.user, session_id=session.pk, exported_at=now)
    if exported is None:
        raise ApiRefused(404, NOT_FOUND)
    return download(request, exported, filename=export_filename(session, "json"), content_type="application/json")


api.add_router("/sessions", router)


def index(request: HttpRequest) -> HttpResponse:
    """``/api/v1/``: where the schema is (no token needed)."""
    schema = request.build_absolute_uri(reverse("api-v1:openapi-json"))
    return HttpResponse(json.dumps({"version": "1", "schema": schema}), content_type="application/json")


@csrf_exempt
def not_found(request: HttpRequest, rest: str = "") -> HttpResponse:
    """Any other path under ``/api/``: a 404 in the API's own JSON, never a page."""
    answer = HttpResponse(
        b'{"detail": "There is no such API route; the routes are listed in /api/v1/openapi.json."}',
        status=404,
        content_type="application/json",
    )
    return answer
