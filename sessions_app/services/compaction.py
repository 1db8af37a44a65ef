"""Compaction: the summary becomes a new generation's system prompt, with the table of reads it covers."""

from __future__ import annotations

from django.db import transaction

from sessions_app import prompts
from sessions_app.errors import EmptySummary, NothingToCompact, ReplyInProgress
from sessions_app.hygiene import TableRead, compaction_table
from sessions_app.hygiene.config import ContextConfig
from sessions_app.models import BreakCause, ChatSession, Generation, Result, ResultKind, Turn, TurnStatus
from sessions_app.selectors.sessions import history_turns
from sessions_app.services.revisions import revision_next
from sessions_app.services.sessions import generation_create
from sessions_app.text import storable


def covered_reads(session: ChatSession, *, generation: Generation) -> list[TableRead]:
    """Full reads of the live turns since the previous compaction, oldest first."""
    turns = history_turns(session, generation=generation)
    results = Result.objects.filter(turn__in=turns, kind=ResultKind.READ).order_by("number")
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
def compaction_apply(*, session: ChatSession, summary: str, config: ContextConfig | None = None) -> Generation:
    """Start the next generation from ``summary``; an empty summary changes nothing."""
    summary = storable(summary)
    session = ChatSession.objects.select_for_update(no_key=True).get(pk=session.pk)
    if Turn.objects.filter(session=session, status=TurnStatus.OPEN).exists():
        raise ReplyInProgress()
    if not summary.strip():
        raise EmptySummary()
    current = Generation.objects.get(session=session, number=session.generation_number)
    last = history_turns(session, generation=current).order_by("-number").first()
    if last is None:
        raise NothingToCompact()
    config = config or prompts.rules_config()
    table = compaction_table(covered_reads(session, generation=current), config=config)
    number = Generation.objects.filter(session=session).count() + 1
    generation = generation_create(
        session=session,
        number=number,
        mode=session.mode,
        model_name=session.model_name,
        tools_json=current.tools_json,
        summary=summary.strip(),
        table=table,
        covers_through_turn=last.number,
        config=config,
    )
    session.generation_number = number
    session.pending_breaks = [*session.pending_breaks, {"cause": BreakCause.COMPACTION}]
    session.save(update_fields=["generation_number", "pending_breaks", "updated_at"])
    generation.revision = revision_next(session.pk)
    generation.save(update_fields=["revision"])
    return generation
