"""A turn's life: the person's message stored with its note, the reply's steps, and how it ended."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from sessions_app import prompts
from sessions_app.errors import ReplyInProgress
from sessions_app.hygiene import (
    NOTHING_STATED,
    ComposedMessage,
    StatedContext,
    UploadedFile,
    compose_message,
    stated_after,
)
from sessions_app.hygiene.config import ContextConfig
from sessions_app.models import (
    MESSAGE_FIELDS,
    ChatSession,
    Generation,
    McpServer,
    Step,
    StepDraft,
    Turn,
    TurnStatus,
    Upload,
)
from sessions_app.selectors.sessions import current_generation, history_turns, last_live_turn, uploads_waiting
from sessions_app.selectors.turns import turn_draft_text, turn_reply_text
from sessions_app.services.durability import WITHOUT_WAITING, commit_without_waiting_for_disk
from sessions_app.services.revisions import revision_next, turn_bump
from sessions_app.services.rows import row_insert, row_stored, row_values
from sessions_app.text import storable, storable_or_none, title_from
from sessions_app.tool_names import listed_servers
from sessions_app.types import StoredCall

NOTE_FIELDS = MESSAGE_FIELDS[1:]  # what a message's note states


def stated_context(session: ChatSession, *, generation: Generation) -> StatedContext:
    """What the request being built last stated: the workspace, the model, the mode, the date, the
    workspace's instructions and the session's (its system prompt states none of them)."""
    stated = NOTHING_STATED
    carried_a_note = (
        Q(note_instructions__isnull=False)
        | Q(note_session_instructions__isnull=False)
        | Q(note_tool_instructions__isnull=False)
        | ~Q(note_workspace="", note_model="", note_mode="", note_date="")
    )
    if generation.resumed_turn is not None:
        carried_a_note |= Q(number=generation.resumed_turn)
    noted = history_turns(session, generation=generation).filter(carried_a_note)
    # the turns whose message carried a note: a few in a long session, not every turn
    for number, *notes in noted.values_list("number", *NOTE_FIELDS):
        if number == generation.resumed_turn:  # its note as this generation sends it
            notes = [getattr(generation, f"resumed_{name}") for name in NOTE_FIELDS]
        workspace, model, date, mode, instructions, session_instructions, tool_instructions = notes
        stated = stated_after(
            stated,
            ComposedMessage(
                "",
                workspace_noted=workspace or None,
                model_noted=model or None,
                mode_noted=mode or None,
                date_noted=date or None,
                instructions_noted=instructions,
                session_instructions_noted=session_instructions,
                tool_instructions_noted=tool_instructions,
            ),
        )
    return stated


def tool_instructions(session: ChatSession, *, generation: Generation) -> dict[str, str]:
    """The instructions of the MCP servers whose tools ``generation`` lists, as each last said them, by server; a
    server switched off or gone from the workspace says none."""
    servers = listed_servers(generation.tools_json)
    if not servers:
        return {}
    found = McpServer.objects.filter(workspace_id=session.workspace_id, name__in=servers, enabled=True)
    return dict(found.values_list("name", "instructions"))


def _locked(session: ChatSession) -> ChatSession:
    sessions = ChatSession.objects.select_related("workspace").select_for_update(no_key=True, of=("self",))
    locked = sessions.get(pk=session.pk)  # the workspace's name goes into the message's note
    if Turn.objects.filter(session=locked, status=TurnStatus.OPEN).exists():
        raise ReplyInProgress()
    return locked


def _next_turn_number(session: ChatSession) -> int:
    number = session.next_turn_number
    session.next_turn_number = number + 1
    return number


def _branch_end(session: ChatSession) -> tuple[Turn | None, int]:
    """The last turn of the live branch, which a new turn follows, and the new turn's position."""
    last = last_live_turn(session)
    return last, (last.position + 1 if last is not None else 1)


def _uploaded(uploads: Iterable[Upload], *, reads_images: bool) -> list[UploadedFile]:
    """What a note says of ``uploads``; where the generation's model reads images, an image goes with the message
    (or the note says why it cannot)."""
    return [
        UploadedFile(
            upload.path,
            upload.size,
            shown=reads_images and bool(upload.image_type),
            problem=upload.image_problem if reads_images else "",
        )
        for upload in uploads
    ]


def _composed(
    session: ChatSession,
    generation: Generation,
    words: str,
    *,
    today: str,
    instructions: str | None,
    config: ContextConfig | None,
    uploads: Iterable[Upload] = (),
    full: bool = False,
) -> ComposedMessage:
    return compose_message(
        words,
        today=today,
        workspace=session.workspace.name,
        model=generation.model_name,
        mode=session.mode,
        mode_text=prompts.mode_text(session.mode),
        instructions=storable_or_none(instructions),
        stated=NOTHING_STATED if full else stated_context(session, generation=generation),
        config=config or prompts.rules_config(),
        session_instructions=session.instructions,
        tool_instructions=tool_instructions(session, generation=generation),
        uploads=_uploaded(uploads, reads_images=generation.reads_images),
    )


def resumed_fields(
    *,
    session: ChatSession,
    turn: Turn,
    model_name: str,
    today: str,
    instructions: str | None,
    reads_images: bool,
    config: ContextConfig | None = None,
) -> dict[str, Any]:
    """The ``RESUMED_FIELDS`` of a generation that a compaction inside ``turn``'s reply starts: the turn's words
    with the full note, as the first message of a generation carries it (the workspace, ``model_name``, the mode
    as it is now, ``today``, the workspace's ``instructions`` and the session's; its images where the new generation
    ``reads_images``), and what that note states.

    The turn keeps its stored message, which the generations before sent: nothing already sent is rewritten.
    The new generation's requests send this one in its place (``RequestBuilder``), and its later messages are
    noted against it (:func:`stated_context`)."""
    composed = compose_message(
        turn.words,
        today=today,
        workspace=session.workspace.name,
        model=model_name,
        mode=session.mode,
        mode_text=prompts.mode_text(session.mode),
        instructions=storable_or_none(instructions),
        stated=NOTHING_STATED,
        config=config or prompts.rules_config(),
        session_instructions=session.instructions,
        tool_instructions=tool_instructions(session, generation=current_generation(session)),
        uploads=_uploaded(Upload.objects.filter(turn=turn).defer("image").order_by("id"), reads_images=reads_images),
    )
    return {
        "resumed_turn": turn.number,
        "resumed_message": storable(composed.text),
        "resumed_note_workspace": composed.workspace_noted or "",
        "resumed_note_model": composed.model_noted or "",
        "resumed_note_date": composed.date_noted or "",
        "resumed_note_mode": composed.mode_noted or "",
        "resumed_note_instructions": composed.instructions_noted,
        "resumed_note_session_instructions": composed.session_instructions_noted,
        "resumed_note_tool_instructions": composed.tool_instructions_noted,
    }


def message_preview(
    *, session: ChatSession, words: str, today: str, instructions: str | None, config: ContextConfig | None = None
) -> str:
    """The message :func:`turn_start` would store for ``words`` now, note included; nothing is stored."""
    generation = current_generation(session)
    uploads = uploads_waiting(session=session)
    composed = _composed(
        session, generation, storable(words), today=today, instructions=instructions, config=config, uploads=uploads
    )
    return storable(composed.text)


@transaction.atomic
def turn_start(
    *,
    session: ChatSession,
    words: str,
    today: str,
    instructions: str | None,
    config: ContextConfig | None = None,
) -> Turn:
    """Store the person's message, with the note it needs, as a new open turn at the end of the live branch; the
    files attached since the last message are said in it and belong to it from then on. One open turn per
    session."""
    session = _locked(session)
    words = storable(words)
    generation = current_generation(session)
    uploads = list(uploads_waiting(session=session).select_for_update(no_key=True))
    composed = _composed(
        session, generation, words, today=today, instructions=instructions, config=config, uploads=uploads
    )
    if not session.title:
        session.title = title_from(words)
    number = _next_turn_number(session)
    session.save(update_fields=["next_turn_number", "title", "updated_at"])
    parent, position = _branch_end(session)
    turn = Turn.objects.create(
        session=session,
        number=number,
        parent=parent,
        position=position,
        generation=generation,
        words=words,
        message=storable(composed.text),
        note_workspace=composed.workspace_noted or "",
        note_model=composed.model_noted or "",
        note_date=composed.date_noted or "",
        note_mode=composed.mode_noted or "",
        note_instructions=composed.instructions_noted,
        note_session_instructions=composed.session_instructions_noted,
        note_tool_instructions=composed.tool_instructions_noted,
        mode=session.mode,
        revision=revision_next(session.pk),
    )
    Upload.objects.filter(pk__in=[upload.pk for upload in uploads]).update(turn=turn)
    return turn


@transaction.atomic
def turn_restart(
    *,
    session: ChatSession,
    like: Turn,
    today: str = "",
    instructions: str | None = None,
    config: ContextConfig | None = None,
    said: Sequence[Upload] = (),
) -> Turn:
    """A new open turn at the end of the live branch carrying ``like``'s message as it is (regenerate takes
    ``like`` back and asks again with it: the new turn is its sibling). Where the current generation resumed
    ``like`` after a compaction inside its reply, that is the message as this generation sent it, full note
    included: the new turn is the first of the generation, whose first message carries the full note. Where the
    session moved to another model since ``like`` was sent ("Retry with another model"), its words get a note
    composed now (as of ``today``, with the workspace's ``instructions``), which names the model it is asked of,
    and the files its message ``said`` arrived."""
    session = _locked(session)
    number = _next_turn_number(session)
    session.save(update_fields=["next_turn_number", "updated_at"])
    parent, position = _branch_end(session)
    generation = current_generation(session)
    resumed = generation.resumed_turn == like.number  # the first message of this generation: its note is full
    if like.generation.model_name != generation.model_name and today:
        composed = _composed(
            session,
            generation,
            like.words,
            today=today,
            instructions=instructions,
            config=config,
            uploads=said,
            full=resumed,
        )
        message = {
            "message": storable(composed.text),
            "note_workspace": composed.workspace_noted or "",
            "note_model": composed.model_noted or "",
            "note_date": composed.date_noted or "",
            "note_mode": composed.mode_noted or "",
            "note_instructions": composed.instructions_noted,
            "note_session_instructions": composed.session_instructions_noted,
            "note_tool_instructions": composed.tool_instructions_noted,
        }
    elif resumed:
        message = {name: getattr(generation, f"resumed_{name}") for name in MESSAGE_FIELDS}
    else:
        message = {name: getattr(like, name) for name in MESSAGE_FIELDS}
    return Turn.objects.create(
        session=session,
        number=number,
        parent=parent,
        position=position,
        generation_id=generation.pk,
        words=like.words,
        **message,
        mode=session.mode,
        revision=revision_next(session.pk),
    )


@transaction.atomic
def step_draft_save(*, turn: Turn, number: int, text: str, reasoning: str) -> None:
    """Keep what step ``number`` has streamed so far, so a crash loses at most what came since."""
    commit_without_waiting_for_disk()
    StepDraft.objects.bulk_create(
        [StepDraft(turn=turn, number=number, text=storable(text), reasoning=storable(reasoning))],
        update_conflicts=True,
        unique_fields=["turn", "number"],
        update_fields=["text", "reasoning", "updated_at"],
    )


def step_record(
    *,
    turn: Turn,
    number: int,
    text: str,
    reasoning: str,
    tool_calls: list[StoredCall],
    finish_reason: str | None,
    drafted: bool = True,
    wait_for_disk: bool = True,
) -> Step:
    """Store step ``number`` of a reply as the model sent it; its draft goes (``drafted`` false: none was
    saved, so there is none to delete). ``wait_for_disk`` false: the caller's next commit waits for it
    (``sessions_app.services.durability``).

    One statement, atomic by itself (``sessions_app.services.rows``): the draft goes, the step is inserted, the
    session's revision moves on and the turn is marked changed at it."""
    step = Step(
        turn=turn,
        number=number,
        text=storable(text),
        reasoning=storable(reasoning),
        tool_calls=[
            StoredCall(id=storable(call["id"]), name=storable(call["name"]), arguments=storable(call["arguments"]))
            for call in tool_calls
        ],
        finish_reason=storable(finish_reason or ""),
    )
    bump = turn_bump(turn)
    params = [*bump.params]
    dropped = ""
    if drafted:
        drafts = connection.ops.quote_name(StepDraft._meta.db_table)
        dropped = f", dropped AS (DELETE FROM {drafts} WHERE turn_id = %s AND number = %s)"
        params += [turn.pk, number]
    also = "" if wait_for_disk else f", {WITHOUT_WAITING}"
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH {bump.sql}{dropped} {row_insert(Step).sql} FROM marked "
            f"RETURNING id, (SELECT revision FROM marked){also}",
            [*params, *row_values(step)],
        )
        row = cursor.fetchone()
    if row is None:
        raise Turn.DoesNotExist(f"No turn {turn.pk} in session {turn.session_id}.")
    turn.revision = int(row[1])
    return row_stored(step, int(row[0]))


@transaction.atomic
def turn_finish(*, turn: Turn, unstored: str = "") -> Turn:
    """The reply is done: its text is its steps' texts (and ``unstored``, a closing line of the loop's own)."""
    turn = Turn.objects.select_for_update(no_key=True).get(pk=turn.pk)
    turn.reply_text = storable(turn_reply_text(turn, unstored=unstored))
    turn.status = TurnStatus.DONE
    turn.finished_at = timezone.now()
    turn.revision = revision_next(turn.session_id)
    turn.save(update_fields=["reply_text", "status", "finished_at", "revision"])
    ChatSession.objects.filter(pk=turn.session_id).update(updated_at=timezone.now())
    return turn


@transaction.atomic
def turn_fail(*, turn: Turn, error: str, unstored: str = "", interrupted: bool = False) -> Turn:
    """End a reply that could not finish: its message, steps and results stay stored, and so does
    ``unstored``, the text that streamed after the last stored step (where the caller has none, the step's
    text as last saved while it streamed)."""
    turn = Turn.objects.select_for_update(no_key=True).get(pk=turn.pk)
    if turn.status != TurnStatus.OPEN:
        return turn
    unstored = unstored or turn_draft_text(turn)
    StepDraft.objects.filter(turn=turn).delete()
    turn.reply_text = storable(turn_reply_text(turn, unstored=unstored))
    turn.error = storable(error)
    turn.status = TurnStatus.INTERRUPTED if interrupted else TurnStatus.FAILED
    turn.finished_at = timezone.now()
    turn.revision = revision_next(turn.session_id)
    turn.save(update_fields=["reply_text", "error", "status", "finished_at", "revision"])
    return turn


@transaction.atomic
def turns_interrupt_orphans(*, session: ChatSession, reason: str) -> int:
    """Mark interrupted the open turns nobody is replying to (the caller holds the session's reply lock);
    the text their last step had streamed, as last saved, is kept."""
    count = 0
    for turn in Turn.objects.select_for_update(no_key=True).filter(session=session, status=TurnStatus.OPEN):
        turn_fail(turn=turn, error=reason, unstored=turn_draft_text(turn), interrupted=True)
        count += 1
    return count


@transaction.atomic
def turn_rate(*, turn: Turn, rating: str) -> Turn:
    """The owner's thumbs up or down (``Rating``) on ``turn``'s reply, ``""`` taking it back; kept for the admin."""
    turn.rating = rating
    turn.rated_at = timezone.now() if rating else None
    turn.save(update_fields=["rating", "rated_at"])
    return turn
