"""Attach: files a person gives the model (the button, a drop, a paste), written into the session's workspace;
the next message's note says what arrived. Each answer is the list of files waiting for that message."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.files.uploadedfile import UploadedFile
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from cachet.body_limits import size_text
from chat.agent.images import attached_image
from chat.agent.uploads import UploadExists, UploadRefused, Written, upload_unwrite, upload_write
from sessions_app.models import ChatSession
from sessions_app.selectors.sessions import (
    current_generation,
    session_get,
    upload_get,
    uploads_waiting,
    workspace_refusal,
)
from sessions_app.services.uploads import upload_forget, upload_record


def _session(request: HttpRequest, session_id: int) -> ChatSession:
    session = session_get(owner=request.user, session_id=session_id)
    if session is None:
        raise Http404("No such session.")
    return session


def attachments_context(
    session: ChatSession, *, said: list[str] | None = None, problems: list[str] | None = None
) -> dict[str, object]:
    """The files waiting for the session's next message, and what the last attach did (``problems``: refused)."""
    uploads = list(uploads_waiting(session=session))
    return {"session": session, "uploads": uploads, "said": said or [], "problems": problems or []}


def too_large(file: UploadedFile[bytes]) -> str:
    """Why ``file`` is too large to attach, or ``""``."""
    limit = settings.CACHET_UPLOAD_MAX_BYTES
    if (file.size or 0) <= limit:
        return ""
    return f"{file.name} is {size_text(file.size or 0)}; a file attached is at most {size_text(limit)}."


def attach_files(
    session: ChatSession,
    files: list[UploadedFile[bytes]],
    *,
    folder: str = "",
    replace: bool = False,
    keep_both: bool = False,
) -> tuple[list[Written], list[str]]:
    """Write ``files`` into the session's workspace and record them for its next message; what was written, and
    a line for each file that was not."""
    written: list[Written] = []
    problems: list[str] = []
    for file in files:
        name = file.name or "file"
        problem = too_large(file)
        if problem:
            problems.append(problem)
            continue
        data = file.read()
        done = upload_write(session, name=name, data=data, folder=folder, replace=replace, keep_both=keep_both)
        image = attached_image(done.path, data)
        upload_record(session=session, path=done.path, size=done.size, sha256=done.sha256, image=image)
        if image is not None and image.problem and current_generation(session).reads_images:
            problems.append(f"{done.path}: the model cannot be shown it: {image.problem}.")
        written.append(done)
    return written, problems


def _said(written: list[Written]) -> list[str]:
    return [f"{done.path} replaced." if done.replaced else f"{done.path} attached." for done in written]


@login_required
@require_POST
def attach_view(request: HttpRequest, session_id: int) -> HttpResponse:
    """Write the files sent (``files``, into ``folder``) into the workspace. A name already taken answers JSON with
    ``conflict``, the file's path and a free name, unless ``replace=1`` or ``keep_both=1`` says what to do; a file
    refused is said in the list, in red."""
    session = _session(request, session_id)
    refused = workspace_refusal(session=session)
    if refused is not None:
        return HttpResponse(str(refused), status=403, content_type="text/plain; charset=utf-8")
    files = request.FILES.getlist("files")
    if not files:
        return HttpResponse("Choose a file to attach.", status=400, content_type="text/plain; charset=utf-8")
    try:
        written, problems = attach_files(
            session,
            files,
            folder=request.POST.get("folder", ""),
            replace=request.POST.get("replace") == "1",
            keep_both=request.POST.get("keep_both") == "1",
        )
    except UploadExists as taken:  # a question, not an error: the page asks Replace or keep both
        return JsonResponse({"conflict": True, "message": str(taken), "path": taken.path, "free": taken.free})
    except UploadRefused as error:
        written, problems = [], [str(error)]
    if not request.headers.get("X-Requested-With") and not request.headers.get("HX-Request"):
        return redirect("session", session_id=session.pk)
    context = attachments_context(session, said=_said(written), problems=problems)
    return render(request, "chat/_attachments.html", context)


@login_required
@require_POST
def attachment_remove_view(request: HttpRequest, session_id: int, upload_id: int) -> HttpResponse:
    """The next message no longer says the file arrived; the file leaves the workspace where nobody changed it."""
    upload = upload_get(owner=request.user, session_id=session_id, upload_id=upload_id)
    if upload is None:
        raise Http404("No such attachment.")
    session = upload.session
    refused = workspace_refusal(session=session)
    if refused is not None:
        return HttpResponse(str(refused), status=403, content_type="text/plain; charset=utf-8")
    removed = upload_unwrite(session, path=upload.path, sha256=upload.sha256)
    upload_forget(upload=upload)
    said = f"{upload.path} removed." if removed else f"{upload.path} changed since: it stays in the workspace."
    return render(request, "chat/_attachments.html", attachments_context(session, said=[said]))
