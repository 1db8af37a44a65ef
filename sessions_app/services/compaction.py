"""Compaction: the summary becomes a new generation's system prompt, with the table of reads it covers."""

from __future__ import annotations

from django.db import transaction

from sessions_app import prompts
from sessions_app.errors import EmptySummary, NothingToCompact, ReplyInProgress
from sessions_app.hygiene import TableRead, compaction_table
from sessions_app.hygiene.config import ContextConfig
from sessions_app.models import BreakCause, ChatSession, Generation, Result, ResultKind, Turn, TurnStatus
from sessions_app.selectors.sessions import current_generation, history_turns
from sessions_app.services.revisions import revision_next
from sessions_app.services.sessions import generation_create
from sessions_app.services.turns import resumed_fields
from sessions_app.text import storable


def covered_reads(
    session: ChatSession, *, generation: Generation, within: Turn | None = None, after_step: int = -1
) -> list[TableRead]:
    """Full reads of the live turns since the previous compaction, oldest first; of a reply compacted while it
    runs (``within``), those of its steps up to ``after_step`` only."""
    turns = history_turns(session, generation=generation)
    results = Result.objects.filter(turn__in=turns, kind=ResultKind.READ).order_by("number")
    if generation.resumes_after_step is not None and generation.covers_through_turn is not None:
        results = results.exclude(
            turn__number=generation.covers_through_turn, step__number__lte=generation.resumes_after_step
        )
    if within is not None:
        results = results.exclude(turn=within, step__number__gt=after_step)
    return [
        TableRead(
            number=result.number,
            path=result.path,
            abs_path=result.abs_path,
            first_line=result.first_line or 0,
            last_line=result.last_line or 0,
            total_lines=result.total_lines or 0,
            sha256=result.sha256,
        )
        for result in results
    ]


@transaction.atomic
def compaction_apply(
    *,
    session: ChatSession,
    summary: str,
    config: ContextConfig | None = None,
    within: Turn | None = None,
    after_step: int | None = None,
    today: str | None = None,
    instructions: str | None = None,
) -> Generation:
    """Start the next generation from ``summary``; an empty summary changes nothing.

    ``within``: the open turn whose reply is compacted while it runs. With ``after_step`` (0 or more) the summary
    covers its steps up to that one, and the reply goes on in the new generation with its message and its later
    steps; without, the summary covers the turns before it, and the whole turn goes on. Either way the new
    generation sends that message with the full note, as of ``today`` and with the workspace's ``instructions``
    (``resumed_fields``); the turn's stored message, which earlier requests sent, stays as it is.
    """
    if within is not None and not today:
        raise ValueError("a compaction inside a reply needs the date its note states")
    summary = storable(summary)
    session = ChatSession.objects.select_for_update(no_key=True).get(pk=session.pk)
    others_open = Turn.objects.filter(session=session, status=TurnStatus.OPEN)
    if within is not None:
        others_open = others_open.exclude(pk=within.pk)
    if others_open.exists():
        raise ReplyInProgress()
    if not summary.strip():
        raise EmptySummary()
    current = current_generation(session)
    covered = history_turns(session, generation=current)
    if within is not None and after_step is None:
        covered = covered.exclude(pk=within.pk)
    last = covered.order_by("-number").first()
    if last is None:
        raise NothingToCompact()
    config = config or prompts.rules_config()
    reads = covered_reads(
        session, generation=current, within=within, after_step=-1 if after_step is None else after_step
    )
    table = compaction_table(reads, config=config)
    resumed = None
    reads_images = session.endpoint.images_read
    if within is not None:
        resumed = resumed_fields(
            session=session,
            turn=within,
            model_name=session.model_name,
            today=today or "",
            instructions=instructions,
            reads_images=reads_images,
            config=config,
        )
    number = Generation.objects.filter(session=session).count() + 1
    generation = generation_create(
        session=session,
        number=number,
        mode=session.mode,
        model_name=session.model_name,
        reads_images=reads_images,
        tools_json=current.tools_json,
        summary=summary.strip(),
        table=table,
        covers_through_turn=last.number,
        resumes_after_step=after_step if within is not None else None,
        resumed=resumed,
        config=config,
    )
    session.generation_number = number
    session.pending_breaks = [*session.pending_breaks, {"cause": BreakCause.COMPACTION}]
    session.save(update_fields=["generation_number", "pending_breaks", "updated_at"])
    generation.revision = revision_next(session.pk)
    generation.save(update_fields=["revision"])
    return generation
