"""Read-only links to a session: started and stopped by its owner, each a fresh unguessable token; and copies
of what a link shows, made into the sessions of whoever follows it."""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from sessions_app import prompts
from sessions_app.errors import StoreError
from sessions_app.hygiene import ContextConfig, UploadedFile, restated_message
from sessions_app.models import UNTITLED, ChatSession, SessionShare, TurnStatus, Upload
from sessions_app.selectors.exports import export_snapshot
from sessions_app.selectors.sessions import session_shared
from sessions_app.services.imports import ImportRejected, session_import
from sessions_app.services.locks import reply_running
from sessions_app.services.workspaces import workspace_private


@transaction.atomic
def share_start(*, session: ChatSession) -> SessionShare:
    """The session's read-only link, made where it has none that works."""
    ChatSession.objects.select_for_update(no_key=True).filter(pk=session.pk).first()
    found = SessionShare.objects.filter(session=session, revoked_at__isnull=True).first()
    if found is not None:
        return found
    return SessionShare.objects.create(session=session, token=secrets.token_urlsafe(24))


@transaction.atomic
def share_stop(*, session: ChatSession) -> int:
    """Revoke the session's link: it shows nothing from now on. How many were revoked."""
    return SessionShare.objects.filter(session=session, revoked_at__isnull=True).update(revoked_at=timezone.now())


class CopyRefused(StoreError):
    """A shared session not copied, with the one line that says why."""


COPY = " (copy)"


def session_copy_shared(*, token: str, owner: User, copied_at: datetime | None = None) -> ChatSession:
    """A session of ``owner``'s own, in their private workspace, holding what the working link ``token`` shows:
    the live branch, its steps and results. The owner's instructions, their settings and their requests stay
    behind: each message's note is stated again as the copy's own (its workspace), without instructions, and the
    copy's first request reads everything afresh. :class:`CopyRefused` says why not."""
    session = session_shared(token=token)
    if session is None:
        raise CopyRefused("This link shows nothing: it was stopped, or never was.")
    if reply_running(session):
        raise CopyRefused("A reply is running in this session; copy it once it has ended.")
    exported = json.loads("".join(export_snapshot(session, exported_at=copied_at or timezone.now())))
    workspace = workspace_private(user=owner)
    uploads: dict[int, list[UploadedFile]] = {}
    for number, path, size in Upload.objects.filter(session=session, turn__isnull=False).values_list(
        "turn__number", "path", "size"
    ):
        uploads.setdefault(number, []).append(UploadedFile(path, size))
    copied = as_seen(exported, workspace=workspace.name, uploads=uploads, config=prompts.rules_config())
    try:
        return session_import(owner=owner, workspace=workspace, raw=json.dumps(copied).encode())
    except ImportRejected as error:
        raise CopyRefused(f"This session could not be copied: {error}") from error


def as_seen(
    exported: dict[str, Any], *, workspace: str, uploads: dict[int, list[UploadedFile]], config: ContextConfig
) -> dict[str, Any]:
    """The export ``exported`` as its link shows it, made a copy's: see :func:`session_copy_shared`."""
    turns = [
        turn
        for turn in exported["turns"]
        if turn["status"] not in (TurnStatus.TAKEN_BACK, TurnStatus.OPEN) and not turn["taken_back_by"]
    ]
    kept = {turn["number"] for turn in turns}
    used = {turn["generation"] for turn in turns}
    generations = [g for g in exported["generations"] if not g["taken_back"] or g["number"] in used]
    words = {turn["number"]: turn["words"] for turn in turns}
    for turn in turns:
        turn.update(
            _restated(
                turn,
                "",
                words=turn["words"],
                workspace=workspace,
                uploads=uploads.get(turn["number"], ()),
                config=config,
            )
        )
        turn.update(
            note_instructions=None,
            note_session_instructions=None,
            note_tool_instructions=None,
            rating="",
            rated_at=None,
        )
    for generation in generations:
        resumed = generation.get("resumed_turn")
        if resumed is not None and resumed in kept and generation.get("resumed_message"):
            generation.update(
                _restated(
                    generation,
                    "resumed_",
                    words=words[resumed],
                    workspace=workspace,
                    uploads=uploads.get(resumed, ()),
                    config=config,
                )
            )
            generation["resumed_note_instructions"] = generation["resumed_note_session_instructions"] = None
            generation["resumed_note_tool_instructions"] = None
        elif resumed is not None and resumed not in kept:
            generation.update(resumed_turn=None, resumed_message="")
    results = [result for result in exported["results"] if result["turn"] in kept]
    numbers = {result["number"] for result in results}
    session = exported["session"]
    session.update(
        title=(session["title"] or UNTITLED)[: 200 - len(COPY)] + COPY,
        instructions="",
        max_tokens=None,
        temperature=None,
        pending_breaks=[],
        generation_number=max(g["number"] for g in generations if not g["taken_back"]),
    )
    return {
        **exported,
        "generations": generations,
        "turns": turns,
        "steps": [step for step in exported["steps"] if step["turn"] in kept],
        "results": [_result_seen(result, numbers) for result in results],
        "requests": [],
        "last_request": None,
    }


def _restated(
    row: dict[str, Any],
    prefix: str,
    *,
    words: str,
    workspace: str,
    uploads: Sequence[UploadedFile],
    config: ContextConfig,
) -> dict[str, Any]:
    """The message of ``row`` (a turn's, or a generation's ``resumed_`` one) stated again as the copy states it:
    the items its note stated, the workspace being the copy's, and no instructions."""
    mode = row[f"{prefix}note_mode"] or None
    note = row[f"{prefix}message"][len(words) :]
    composed = restated_message(
        words,
        workspace=workspace if row[f"{prefix}note_workspace"] else None,
        model=row[f"{prefix}note_model"] or None,
        mode=mode,
        mode_text=prompts.mode_text(mode) if mode else "",
        mode_first=mode is not None and config.note["mode"].format(mode=mode, text="") not in note,
        date=row[f"{prefix}note_date"] or None,
        config=config,
        uploads=uploads,
    )
    return {f"{prefix}message": composed.text, f"{prefix}note_workspace": composed.workspace_noted or ""}


def _result_seen(result: dict[str, Any], numbers: set[int]) -> dict[str, Any]:
    """A result of the live branch as the copy keeps it: what undo would write back into the owner's files stays
    behind, and links to results of other branches go."""
    refers_to = result["refers_to"]
    return {
        **result,
        "changed_files": [],
        "refers_to": refers_to if refers_to in numbers else None,
        "stale": [number for number in result["stale"] if number in numbers],
    }
