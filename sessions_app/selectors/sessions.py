"""Reads of sessions, turns and results; every one takes the owner unless it serves the store itself."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Exists, OuterRef, Q, QuerySet

from sessions_app.models import (
    DEFAULT_ENDPOINT_NAME,
    ChatSession,
    Generation,
    ModelEndpoint,
    Result,
    Turn,
    TurnStatus,
    Workspace,
)


def session_list(*, owner: AbstractBaseUser | AnonymousUser) -> QuerySet[ChatSession]:
    return ChatSession.objects.filter(owner_id=owner.pk).select_related("workspace", "endpoint")


def session_get(*, owner: AbstractBaseUser | AnonymousUser, session_id: int) -> ChatSession | None:
    """The session if ``owner`` owns it, else ``None`` (so others see a 404, never a 403)."""
    return session_list(owner=owner).filter(pk=session_id).first()


def workspaces_for(*, user: AbstractBaseUser | AnonymousUser) -> QuerySet[Workspace]:
    return Workspace.objects.filter(Q(members=None) | Q(members=user.pk)).distinct()


def endpoint_default() -> ModelEndpoint | None:
    """The endpoint named ``default`` (the one the environment sets), else the oldest one."""
    endpoints = ModelEndpoint.objects.all()
    return endpoints.filter(name=DEFAULT_ENDPOINT_NAME).first() or endpoints.order_by("id").first()


def endpoint_list() -> list[ModelEndpoint]:
    """Every endpoint, the default one first, then by name."""
    default = endpoint_default()
    others = ModelEndpoint.objects.order_by("name")
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


def result_get(*, owner: AbstractBaseUser | AnonymousUser, session_id: int, number: int) -> Result | None:
    return Result.objects.filter(session_id=session_id, session__owner_id=owner.pk, number=number).first()


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
