"""Starting, renaming and configuring sessions."""

from __future__ import annotations

import hashlib
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from sessions_app import prompts
from sessions_app.errors import ReplyInProgress
from sessions_app.hygiene import system_prompt_with_summary
from sessions_app.hygiene.config import ContextConfig
from sessions_app.models import (
    RESUMED_FIELDS,
    BreakCause,
    ChatSession,
    Generation,
    InstructionPreset,
    Mode,
    ModelEndpoint,
    TitleSource,
    Turn,
    TurnStatus,
    Workspace,
)
from sessions_app.selectors.requests import dumps
from sessions_app.selectors.sessions import current_generation
from sessions_app.services.locks import reply_lock
from sessions_app.services.revisions import revision_next
from sessions_app.text import storable


def generation_create(
    *,
    session: ChatSession,
    number: int,
    mode: str,
    model_name: str,
    reads_images: bool,
    tools_json: str,
    summary: str = "",
    table: str = "",
    covers_through_turn: int | None = None,
    resumes_after_step: int | None = None,
    resumed: dict[str, Any] | None = None,
    config: ContextConfig | None = None,
) -> Generation:
    """A generation with its system prompt built now, as at a session's start, then frozen; ``reads_images``:
    whether its model is sent the images attached to messages. ``resumed``: the values of its ``RESUMED_FIELDS``,
    where a compaction inside a reply left a turn running."""
    base = prompts.system_prompt()
    if summary:
        system = system_prompt_with_summary(base, summary=summary, table=table, config=config or prompts.rules_config())
    else:
        system = base
    return Generation.objects.create(
        session=session,
        number=number,
        system_prompt=system,
        system_prompt_sha256=hashlib.sha256(system.encode()).hexdigest(),
        tools_json=tools_json,
        mode=mode,
        model_name=model_name,
        reads_images=reads_images,
        summary=summary,
        table=table,
        covers_through_turn=covers_through_turn,
        resumes_after_step=resumes_after_step,
        **(resumed or {}),
    )


@transaction.atomic
def session_start(
    *,
    owner: User,
    workspace: Workspace,
    endpoint: ModelEndpoint,
    model_name: str,
    tools: list[dict[str, Any]],
    mode: str = Mode.EDIT,
    title: str = "",
    instructions: str = "",
    temperature: float | None = None,
    max_tokens: int | None = None,
) -> ChatSession:
    """A new session whose system prompt and tool list are frozen into generation 1; its ``instructions`` go into
    its first message's note."""
    model_name = storable(model_name)
    _check_sampling(temperature=temperature, max_tokens=max_tokens)
    session = ChatSession.objects.create(
        owner=owner,
        title=storable(title),
        workspace=workspace,
        endpoint=endpoint,
        model_name=model_name,
        mode=mode,
        instructions=_instructions(instructions),
        temperature=temperature,
        max_tokens=max_tokens,
    )
    generation_create(
        session=session,
        number=1,
        mode=mode,
        model_name=model_name,
        reads_images=endpoint.images_read,
        tools_json=dumps(tools),
    )
    return session


TEMPERATURE_RANGE = (0.0, 2.0)
MAX_TOKENS_LIMIT = 1_000_000
INSTRUCTIONS_CHARS = 20_000
TITLE_CHARACTERS = 80  # a title the model wrote is cut to this, at a word


def _check_sampling(*, temperature: float | None, max_tokens: int | None) -> None:
    low, high = TEMPERATURE_RANGE
    if temperature is not None and not low <= temperature <= high:
        raise ValueError(f"The temperature is from {low:g} to {high:g}.")
    if max_tokens is not None and not 1 <= max_tokens <= MAX_TOKENS_LIMIT:
        raise ValueError(f"Max tokens is from 1 to {MAX_TOKENS_LIMIT:,}.")


def _instructions(text: str) -> str:
    text = storable(text).strip()
    if len(text) > INSTRUCTIONS_CHARS:
        raise ValueError(f"Instructions are at most {INSTRUCTIONS_CHARS:,} characters.")
    return text


@transaction.atomic
def session_settings_set(
    *, session: ChatSession, instructions: str, temperature: float | None, max_tokens: int | None
) -> ChatSession:
    """The session's instructions and sampling from its next message on: changed instructions are a note on that
    message (never the system prompt), and sampling goes after the conversation in the request. A reply running
    now keeps what it started with."""
    _check_sampling(temperature=temperature, max_tokens=max_tokens)
    text = _instructions(instructions)
    locked = ChatSession.objects.select_for_update(no_key=True).get(pk=session.pk)
    locked.instructions, locked.temperature, locked.max_tokens = text, temperature, max_tokens
    locked.save(update_fields=["instructions", "temperature", "max_tokens", "updated_at"])
    return locked


@transaction.atomic
def preset_save(*, owner: User, name: str, text: str) -> InstructionPreset:
    """Keep ``text`` as the owner's preset ``name`` (one of that name is replaced)."""
    name = storable(name).strip()[:100]
    if not name:
        raise ValueError("Name the preset.")
    text = _instructions(text)
    if not text:
        raise ValueError("Type the instructions to keep as a preset.")
    preset, _ = InstructionPreset.objects.update_or_create(owner=owner, name=name, defaults={"text": text})
    return preset


@transaction.atomic
def preset_delete(*, preset: InstructionPreset) -> None:
    preset.delete()


@transaction.atomic
def session_rename(*, session: ChatSession, title: str) -> ChatSession:
    """The person's own title: the model's is never written over it."""
    session.title = storable(title).strip()[:200]
    session.title_source = TitleSource.PERSON
    session.save(update_fields=["title", "title_source", "updated_at"])
    return session


def title_from_answer(text: str) -> str:
    """A title from the model's answer: its first line with text, without Markdown marks, quotes or a closing
    full stop, at most ``TITLE_CHARACTERS`` long; "" where nothing is left."""
    line = next((line for line in text.splitlines() if line.strip()), "")
    line = line.strip().lstrip("#*-> ").strip().strip("*_`\"'“”‘’«» ").strip()
    line = line.removeprefix("Title:").removeprefix("title:").strip().strip("\"'“”‘’ ").rstrip(".").strip()
    if len(line) > TITLE_CHARACTERS:
        line = line[: TITLE_CHARACTERS - 1].rsplit(" ", 1)[0].rstrip(" ,;:") + "…"
    return storable(line)


@transaction.atomic
def session_title_by_model(*, session_id: int, answer: str) -> ChatSession | None:
    """Title the session with the model's ``answer`` where its title is still the first words typed (a rename,
    even one made while the model wrote, wins); the session, or ``None`` where nothing changed."""
    session = ChatSession.objects.select_for_update(no_key=True).get(pk=session_id)
    title = title_from_answer(answer)
    if session.title_source != TitleSource.TYPED or not title:
        return None
    session.title = title
    session.title_source = TitleSource.MODEL
    session.save(update_fields=["title", "title_source", "updated_at"])
    return session


@transaction.atomic
def session_set_mode(*, session: ChatSession, mode: str) -> ChatSession:
    """The new mode takes effect as a note on the next message; the system prompt stays as it is."""
    if mode not in Mode.values:
        raise ValueError(f"Unknown mode {mode!r}; the modes are {', '.join(Mode.values)}.")
    session.mode = mode
    session.save(update_fields=["mode", "updated_at"])
    return session


@transaction.atomic
def session_change_model(*, session: ChatSession, endpoint: ModelEndpoint, model_name: str) -> ChatSession:
    """Move the session to another model: a new generation, its system prompt rebuilt, the history kept. The
    next request's break is a model change. The same endpoint and model again change nothing."""
    model_name = storable(model_name).strip()
    if not model_name:
        raise ValueError("Name the model to change to.")
    limit = ChatSession._meta.get_field("model_name").max_length or 0
    if len(model_name) > limit:
        raise ValueError(f"A model name is at most {limit} characters.")
    session = ChatSession.objects.select_for_update(no_key=True).select_related("endpoint").get(pk=session.pk)
    if endpoint.pk == session.endpoint_id and model_name == session.model_name:
        return session
    if Turn.objects.filter(session=session, status=TurnStatus.OPEN).exists():
        raise ReplyInProgress()
    current = current_generation(session)
    number = Generation.objects.filter(session=session).count() + 1
    generation = generation_create(
        session=session,
        number=number,
        mode=session.mode,
        model_name=model_name,
        reads_images=endpoint.images_read,
        tools_json=current.tools_json,
        summary=current.summary,
        table=current.table,
        covers_through_turn=current.covers_through_turn,
        resumes_after_step=current.resumes_after_step,
        resumed={name: getattr(current, name) for name in RESUMED_FIELDS},
    )
    session.endpoint = endpoint
    session.model_name = model_name
    session.generation_number = number
    session.pending_breaks = [*session.pending_breaks, {"cause": BreakCause.MODEL_CHANGE}]
    session.save(update_fields=["endpoint", "model_name", "generation_number", "pending_breaks", "updated_at"])
    generation.revision = session.revision = revision_next(session.pk)
    generation.save(update_fields=["revision"])
    return session


def session_model_switch(*, session: ChatSession, endpoint: ModelEndpoint, model_name: str) -> ChatSession:
    """:func:`session_change_model` under the session's reply lock, so it never lands in the middle of a
    reply; refused with :class:`ReplyInProgress` while one runs."""
    with reply_lock(session):
        return session_change_model(session=session, endpoint=endpoint, model_name=model_name)


@transaction.atomic
def session_delete(*, session: ChatSession) -> None:
    """The owner deletes the session: it leaves everything they see (list, pages, search, export, ``ask``), and
    stays stored whole for the admin."""
    ChatSession.objects.filter(pk=session.pk, deleted_at__isnull=True).update(deleted_at=timezone.now())


@transaction.atomic
def session_pin(*, session: ChatSession, pinned: bool) -> ChatSession:
    """Pin the session at the top of its owner's list, or unpin it."""
    ChatSession.objects.filter(pk=session.pk).update(pinned=pinned)
    session.pinned = pinned
    return session


@transaction.atomic
def session_archive(*, session: ChatSession, archived: bool) -> ChatSession:
    """Move the session out of its owner's list, under Archived, or back; an archived session is unpinned."""
    ChatSession.objects.filter(pk=session.pk).update(archived=archived, pinned=False if archived else session.pinned)
    session.archived = archived
    session.pinned = False if archived else session.pinned
    return session
