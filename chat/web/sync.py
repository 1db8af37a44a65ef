"""What a tab that connects or reconnects lacks: the changes after the revision it shows, not the transcript.

A page is rendered at a revision of its session; every stored change moves the revision on and marks what it
changed (a turn, a compaction) with it. A tab says which revision it has, the oldest turn it shows and the
last bar of its chart, and gets back the turns and compactions changed since, the bars it lacks, and the
small parts that are always sent (the controls, the mode, the title, the files waiting for a message); after
a change of model, the header's model menu and the whole chart, whose scale is the endpoint's context window.
"""

from __future__ import annotations

from dataclasses import dataclass

from chat.web import chart, fragments, queueing
from chat.web.display import PAGE_TURNS, CompactionView, transcript_page, turn_views
from chat.web.messages import Op, pack
from sessions_app.models import ChatSession, Generation, ModelRequest, Turn, TurnStatus
from sessions_app.selectors.requests import finished_requests, last_time_to_first_token
from sessions_app.selectors.sessions import compactions, session_by_id
from sessions_app.services.locks import reply_running


@dataclass(frozen=True)
class PageState:
    """What a tab says it shows: the session revision, the oldest turn on it, the last bar of its chart."""

    revision: int
    first_turn: int
    last_bar: int


@dataclass(frozen=True)
class CatchUp:
    messages: list[str]
    running: bool


def catch_up(session_id: int, state: PageState) -> CatchUp:
    """The messages that bring a tab from ``state`` to the session as stored now."""
    session = session_by_id(session_id=session_id)
    revision = session.revision
    replying = reply_running(session)
    running = replying or queueing.busy(session_id)
    ops: list[Op] = []
    model_changed = state.revision < revision and _model_changed(session, state)
    if state.revision < revision:
        ops.extend(_turn_changes(session, state, running=running))
        ops.extend(_compaction_changes(session, state))
    if model_changed:
        ops.extend([fragments.model_put(session), chart_page_put(session)])  # the chart's scale may have changed
    else:
        ops.extend(_bar_changes(session, state))
    ops.extend(
        [
            fragments.controls_put(
                running=running, label="Replying…" if replying else queueing.QUEUED if running else ""
            ),
            fragments.mode_put(session),
            fragments.title_put(session),
            fragments.sidebar_title_put(session),  # a title the model wrote before the tab connected, a rename
            fragments.attachments_put(session),
        ]
    )
    return CatchUp(pack(ops, rev=revision), running)


def _turn_changes(session: ChatSession, state: PageState, *, running: bool) -> list[Op]:
    changed = list(
        Turn.objects.filter(session=session, revision__gt=state.revision).only("number", "status").order_by("number")
    )
    ops: list[Op] = [fragments.turn_remove(turn.number) for turn in changed if turn.status == TurnStatus.TAKEN_BACK]
    live = [turn.number for turn in changed if turn.status != TurnStatus.TAKEN_BACK]
    shown = [number for number in live if number >= state.first_turn]
    if len(shown) > PAGE_TURNS or len(shown) < len(live):
        # Turns made live again above the oldest one the tab shows (a flip to another branch): the tab's
        # transcript no longer continues what it shows, so it gets the live branch's last turns again.
        return [fragments.transcript_put(transcript_page(session, running=running), session_id=session.pk)]
    if shown:
        turns = list(Turn.objects.filter(session=session, number__in=shown).order_by("number"))
        last = Turn.objects.filter(session=session).exclude(status=TurnStatus.TAKEN_BACK).order_by("-number").first()
        for view in turn_views(turns, running=running, last_number=last.number if last else None):
            ops.append(fragments.turn_put(view))
    return ops


def _compaction_changes(session: ChatSession, state: PageState) -> list[Op]:
    changed = Generation.objects.filter(session=session, revision__gt=state.revision)
    ops: list[Op] = [
        fragments.compaction_remove(number)
        for number in changed.filter(taken_back=True).exclude(summary="").values_list("number", flat=True)
    ]
    for generation in compactions(session).filter(revision__gt=state.revision):
        if (generation.covers_through_turn or 0) >= state.first_turn:
            ops.append(fragments.compaction_put(CompactionView(generation)))
    return ops


def _model_changed(session: ChatSession, state: PageState) -> bool:
    """Whether the session moved to another model after the revision the tab shows: a live generation changed
    since then that is no compaction."""
    changed = Generation.objects.filter(session=session, revision__gt=state.revision, taken_back=False)
    return changed.exclude(pk__in=compactions(session).values("pk")).exists()


def _bar_changes(session: ChatSession, state: PageState) -> list[Op]:
    finished = finished_requests(session=session)
    missing = list(finished.filter(id__gt=state.last_bar).select_related("turn").order_by("id")[: chart.SHOWN_BARS + 1])
    if not missing:
        return []
    before = finished.filter(id__lte=state.last_bar)
    first_index = before.count() + 1
    if len(missing) > chart.SHOWN_BARS or not state.last_bar:
        return [chart_page_put(session)]
    bars = chart.bars_of(missing, first_index=first_index, ttft_before=last_time_to_first_token(before))
    window = fragments.chart_window(session)
    return [fragments.bar_put(bar, window=window) for bar in bars]


def chart_requests(session: ChatSession) -> tuple[list[ModelRequest], int, int]:
    """The last requests the page's chart shows, how many earlier ones it leaves out, and the first's index."""
    finished = finished_requests(session=session)
    requests = list(reversed(finished.select_related("turn").order_by("-id")[: chart.SHOWN_BARS]))
    total = finished.count() if len(requests) == chart.SHOWN_BARS else len(requests)
    more = total - len(requests)
    return requests, more, more + 1


def chart_page_put(session: ChatSession) -> Op:
    requests, more, first_index = chart_requests(session)
    return fragments.chart_put(session, requests, more=more, first_index=first_index)
