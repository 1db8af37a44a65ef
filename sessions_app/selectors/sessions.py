"""Reads of sessions, turns and results; every one takes the owner unless it serves the store itself."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import connection
from django.db.models import BooleanField, Exists, ExpressionWrapper, OuterRef, Q, QuerySet

from sessions_app.errors import EndpointRefused, FolderRefused, NotAMember, WorkspaceRefused
from sessions_app.folders import folder_check, nesting_refusal, people_folder, private_folder, workspace_roots
from sessions_app.models import (
    DEFAULT_ENDPOINT_NAME,
    ChatSession,
    Generation,
    ModelEndpoint,
    Result,
    SessionShare,
    Turn,
    TurnStatus,
    Upload,
    Workspace,
)


def _sessions() -> QuerySet[ChatSession]:
    """Sessions as they are used: with their workspace and endpoint."""
    return ChatSession.objects.select_related("workspace", "endpoint")


def session_list(*, owner: AbstractBaseUser | AnonymousUser) -> QuerySet[ChatSession]:
    """The owner's sessions, those they deleted left out."""
    return _sessions().filter(owner_id=owner.pk, deleted_at__isnull=True)


def session_get(*, owner: AbstractBaseUser | AnonymousUser, session_id: int) -> ChatSession | None:
    """The session if ``owner`` owns it, else ``None`` (so others see a 404, never a 403)."""
    return session_list(owner=owner).filter(pk=session_id).first()


def session_shared(*, token: str) -> ChatSession | None:
    """The session a working read-only link ``token`` shows: never a revoked link's, nor a deleted session."""
    return (
        _sessions()
        .filter(shares__token=token, shares__revoked_at__isnull=True, deleted_at__isnull=True)
        .select_related("owner")
        .first()
    )


def session_share_token(session: ChatSession) -> str:
    """The token of the session's working read-only link, or ``""``."""
    token: str | None = (
        SessionShare.objects.filter(session=session, revoked_at__isnull=True).values_list("token", flat=True).first()
    )
    return token or ""


def session_by_id(*, session_id: int) -> ChatSession:
    """Session ``session_id`` with its workspace and endpoint, whoever owns it: for the work on a session already
    let in (a job, a reply, a tab's catch-up), never for what a person asks. Raises ``ChatSession.DoesNotExist``."""
    return _sessions().get(pk=session_id)


def may_use(*, workspace: Any, user: Any) -> Q:
    """Who may use a workspace, the one rule: its members and the people of its groups; everyone where staff
    opened it to everyone; staff where it has no members and no group. ``workspace`` and ``user`` are ids or
    expressions (``OuterRef("owner_id")``)."""
    members = Workspace.members.through.objects.filter(workspace_id=workspace)
    groups = Workspace.groups.through.objects.filter(workspace_id=workspace)
    opened = Workspace.objects.filter(pk=workspace, open_to_everyone=True)
    staff = get_user_model().objects.filter(pk=user, is_staff=True, is_active=True)
    return (
        Q(Exists(members.filter(user_id=user)))
        | Q(Exists(groups.filter(group__user=user)))
        | Q(Exists(opened))
        | (Q(Exists(staff)) & ~Q(Exists(members)) & ~Q(Exists(groups)))
    )


def may_use_endpoint(*, endpoint: Any, user: Any) -> Q:
    """Who may use a model endpoint, the one rule: everyone where it is open to everyone (as endpoints are made);
    else the people and the groups staff granted it, and staff. ``endpoint`` and ``user`` are ids or expressions."""
    opened = ModelEndpoint.objects.filter(pk=endpoint, open_to_everyone=True)
    people = ModelEndpoint.people.through.objects.filter(modelendpoint_id=endpoint, user_id=user)
    groups = ModelEndpoint.groups.through.objects.filter(modelendpoint_id=endpoint, group__user=user)
    staff = get_user_model().objects.filter(pk=user, is_staff=True, is_active=True)
    return Q(Exists(opened)) | Q(Exists(people)) | Q(Exists(groups)) | Q(Exists(staff))


def endpoints_for(*, user: AbstractBaseUser | AnonymousUser) -> QuerySet[ModelEndpoint]:
    """The model endpoints ``user`` may use."""
    return ModelEndpoint.objects.filter(may_use_endpoint(endpoint=OuterRef("pk"), user=user.pk))


def endpoint_refusal(*, session: ChatSession) -> EndpointRefused | None:
    """Why the session's model may not be asked now: its owner may no longer use its endpoint (``None``: they may)."""
    endpoint = session.endpoint
    if endpoints_for(user=session.owner).filter(pk=endpoint.pk).exists():
        return None
    return EndpointRefused(endpoint.name)


def workspaces_for(*, user: AbstractBaseUser | AnonymousUser) -> QuerySet[Workspace]:
    """The workspaces ``user`` may use."""
    return Workspace.objects.filter(may_use(workspace=OuterRef("pk"), user=user.pk))


def unusable_workspace_ids(*, owner: AbstractBaseUser | AnonymousUser) -> set[int]:
    """The workspaces the owner has sessions on but may no longer use (removed from their members)."""
    rows = session_list(owner=owner).order_by().exclude(may_use(workspace=OuterRef("workspace_id"), user=owner.pk))
    return set(rows.values_list("workspace_id", flat=True).distinct())


def workspace_refusal(*, session: ChatSession) -> WorkspaceRefused | None:
    """Why the session is read-only now: its owner may no longer use its workspace, or the workspace's folder
    is one Cachet may not use now (:func:`workspace_folder_refusal`); ``None`` where the owner may act in it."""
    workspace = session.workspace
    if not Workspace.objects.filter(may_use(workspace=workspace.pk, user=session.owner_id), pk=workspace.pk).exists():
        return NotAMember(workspace.name)
    refusal = workspace_folder_refusal(workspace=workspace)
    return FolderRefused(workspace.name, refusal) if refusal else None


def workspace_folder_refusal(*, workspace: Workspace) -> str:
    """Why the workspace's folder may not be used now, empty where it may: a private workspace lives at its
    owner's folder under the data folder's ``people``; a folder named from a shell (``ask --workspace``) is none
    Cachet refuses anywhere; any other lies under ``CACHET_WORKSPACE_ROOTS``; and none nests in another's."""
    if workspace.owner_id is not None:
        expected = private_folder(workspace.owner_id)
        if Path(workspace.folder) != expected:
            return f"a private workspace lives at {expected}, not {workspace.folder}"
        refusal = ""
    else:
        checked = folder_check(workspace.folder, anywhere=workspace.from_shell)
        refusal = checked.refusal
    return refusal or workspace_nesting(folder=Path(workspace.folder), excluding=workspace.pk)


def workspace_nesting(*, folder: Path, excluding: int | None = None) -> str:
    """Why ``folder`` (resolved) cannot be a workspace's beside the others (``excluding`` one): it is one of
    theirs, or lies inside or holds one; empty where it nests with none."""
    others = Workspace.objects.order_by("name")
    if excluding is not None:
        others = others.exclude(pk=excluding)
    return nesting_refusal(folder, others.values_list("name", "folder"))


def workspace_roots_for(*, workspace: Workspace) -> tuple[str, ...] | None:
    """The folders the workspace's folder must still lie under when an action opens it (``None``: anywhere)."""
    if workspace.owner_id is not None:
        return (str(people_folder()),)
    if workspace.from_shell:
        return None
    return tuple(str(root) for root in workspace_roots())


@dataclass(frozen=True)
class Standing:
    """What holds for a session's next tool call: its mode, its workspace's permissions, and whether its owner
    may still use the workspace."""

    mode: str
    allow_commands: bool
    allow_network: bool
    member: bool


def session_standing(*, session: ChatSession) -> Standing:
    """The session's :class:`Standing` now, in one indexed query (read before every tool call of a reply)."""
    sql, params = _standing_sql()
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, session.pk])
        row = cursor.fetchone()
    if row is None:
        raise ChatSession.DoesNotExist(f"No session {session.pk}.")
    mode, allow_commands, allow_network, member = row
    return Standing(mode=mode, allow_commands=allow_commands, allow_network=allow_network, member=member)


_ANY_SESSION = -1  # stands for the session's id while the query is compiled


@functools.cache
def _standing_sql() -> tuple[str, tuple[Any, ...]]:
    """The SQL of :func:`session_standing` and its parameters but the session's id (the last one), compiled
    from the ORM (so from :func:`may_use`) once: compiling its two subqueries took 0.9 ms a call, twice the
    query's own round trip, on the path between a reply's steps."""
    member = ExpressionWrapper(
        may_use(workspace=OuterRef("workspace_id"), user=OuterRef("owner_id")), output_field=BooleanField()
    )
    query = (
        ChatSession.objects.filter(pk=_ANY_SESSION)
        .order_by()
        .annotate(member=member)
        .values_list("mode", "workspace__allow_commands", "workspace__allow_network", "member")
    )
    sql, params = query.query.sql_with_params()
    assert params[-1] == _ANY_SESSION and sql.endswith("%s"), "the session's id is the query's last parameter"
    return sql, tuple(params[:-1])


def endpoint_default() -> ModelEndpoint | None:
    """The endpoint named ``default`` (the one the environment sets), else the oldest one."""
    endpoints = ModelEndpoint.objects.all()
    return endpoints.filter(name=DEFAULT_ENDPOINT_NAME).first() or endpoints.order_by("id").first()


def endpoint_list(*, user: AbstractBaseUser | AnonymousUser | None = None) -> list[ModelEndpoint]:
    """The endpoints ``user`` may use (every one where ``None``: a command on the server), the default one first,
    then by name."""
    default = endpoint_default()
    others = (ModelEndpoint.objects if user is None else endpoints_for(user=user)).order_by("name")
    if default is not None and user is not None and not others.filter(pk=default.pk).exists():
        return list(others)
    return [default, *others.exclude(pk=default.pk)] if default is not None else list(others)


def compactions(session: ChatSession) -> QuerySet[Generation]:
    """The session's live compactions. A change of model starts a generation that keeps the summary and the
    turns covered of the one before it; that one is no compaction of its own."""
    earlier_same = Generation.objects.filter(
        session=OuterRef("session"),
        taken_back=False,
        covers_through_turn=OuterRef("covers_through_turn"),
        number__lt=OuterRef("number"),
    )
    return (
        Generation.objects.filter(session=session, taken_back=False, covers_through_turn__isnull=False)
        .exclude(summary="")
        .exclude(Exists(earlier_same))
    )


def current_generation(session: ChatSession) -> Generation:
    """The generation ``session`` is in, read once per session object: what a generation holds for requests
    (its system prompt, tools, summary, what it covers) never changes once it is made, and a session object
    read again, or one whose ``generation_number`` moved, reads it again."""
    kept = vars(session).get(_CURRENT_GENERATION)
    if isinstance(kept, Generation) and kept.number == session.generation_number:
        return kept
    generation = Generation.objects.get(session=session, number=session.generation_number)
    vars(session)[_CURRENT_GENERATION] = generation
    return generation


_CURRENT_GENERATION = "_cachet_current_generation"


def history_turns(session: ChatSession, *, generation: Generation | None = None) -> QuerySet[Turn]:
    """Live turns the current generation's requests carry, oldest first."""
    generation = generation or current_generation(session)
    turns = Turn.objects.filter(session=session).exclude(status=TurnStatus.TAKEN_BACK)
    if generation.covers_through_turn is not None:
        if generation.resumes_after_step is not None:  # a reply compacted while it ran goes on in this generation
            turns = turns.filter(number__gte=generation.covers_through_turn)
        else:
            turns = turns.filter(number__gt=generation.covers_through_turn)
    return turns.order_by("number")


def open_turn(session: ChatSession) -> Turn | None:
    return Turn.objects.filter(session=session, status=TurnStatus.OPEN).order_by("-number").first()


def last_live_turn(session: ChatSession) -> Turn | None:
    return Turn.objects.filter(session=session).exclude(status=TurnStatus.TAKEN_BACK).order_by("-number").first()


def turn_position(*, session_id: int, number: int | None) -> int | None:
    """The place in its branch of stored turn ``number``: the number a person sees and types."""
    if number is None:
        return None
    found: int | None = (
        Turn.objects.filter(session_id=session_id, number=number).values_list("position", flat=True).first()
    )
    return found


def live_turn_at(session: ChatSession, position: int) -> Turn | None:
    """The live turn at ``position`` in the live branch (1 is the first)."""
    return Turn.objects.filter(session=session, position=position).exclude(status=TurnStatus.TAKEN_BACK).first()


def result_get(*, owner: AbstractBaseUser | AnonymousUser, session_id: int, number: int) -> Result | None:
    return Result.objects.filter(
        session_id=session_id, session__owner_id=owner.pk, session__deleted_at__isnull=True, number=number
    ).first()


def stored_full_text(session: ChatSession, number: int) -> str | None:
    """The full text of result ``number`` of ``session`` for ``recall``: taken-back turns' results too."""
    return Result.objects.filter(session=session, number=number).values_list("full_text", flat=True).first()


def session_workspaces(*, owner: AbstractBaseUser | AnonymousUser) -> list[tuple[int, str]]:
    """The workspaces the owner's sessions are on, as ids and names, by name."""
    rows = session_list(owner=owner).order_by().values_list("workspace_id", "workspace__name").distinct()
    return sorted(rows, key=lambda row: row[1])


def session_models(*, owner: AbstractBaseUser | AnonymousUser) -> list[str]:
    """The models the owner's sessions use, by name."""
    return sorted(session_list(owner=owner).order_by().values_list("model_name", flat=True).distinct())


def uploads_waiting(*, session: ChatSession) -> QuerySet[Upload]:
    """The files attached to ``session`` that its next message will say arrived, oldest first."""
    return Upload.objects.filter(session=session, turn__isnull=True).defer("image").order_by("id")


def upload_get(*, owner: AbstractBaseUser | AnonymousUser, session_id: int, upload_id: int) -> Upload | None:
    """A waiting upload of the owner's session, else ``None``."""
    session = session_get(owner=owner, session_id=session_id)
    if session is None:
        return None
    return uploads_waiting(session=session).filter(pk=upload_id).first()
