"""The pieces of the chat page the websocket puts in place: each is one element with an id, rendered by
the page's own templates, as a :class:`chat.web.messages.Put` (or a ``Remove``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.html import format_html

from chat.web import chart
from chat.web.display import CompactionView, StepView, ToolRow, TranscriptPage, TurnView
from chat.web.messages import TEXT_PIECE, Put, Remove
from sessions_app import prompts
from sessions_app.models import ChatSession, Mode, ModelRequest
from sessions_app.selectors.sessions import uploads_waiting
from sessions_app.selectors.totals import RequestTotals

CHART_WINDOW_DEFAULT = 8192


def _render(template: str, context: dict[str, Any]) -> str:
    return render_to_string(f"chat/{template}", context)


def _loading(tag: str, dom_id: str, url: str, order: int | None, select: str = "") -> str:
    """An element that loads itself over HTTP: for what is too large for one websocket message."""
    return format_html(
        '<{} id="{}" class="loading"{} hx-get="{}" hx-trigger="load" hx-swap="outerHTML"{}>Loading…</{}>',
        tag,
        dom_id,
        format_html(' data-order="{}"', order) if order is not None else "",
        url,
        format_html(' hx-select="#{}"', select) if select else "",
        tag,
    )


def turn_url(session_id: int, number: int) -> str:
    return reverse("session_turn", args=[session_id, number])


def turn_put(view: TurnView) -> Put:
    turn = view.turn
    html = _render("_turn.html", {"t": view, "session_id": turn.session_id})
    lazy = _loading("article", f"turn-{turn.number}", turn_url(turn.session_id, turn.number), view.order)
    return Put(f"turn-{turn.number}", html, into="transcript", at="order", lazy=lazy)


def step_put(view: StepView, *, session_id: int, turn_number: int, open: bool) -> Put:
    dom_id = f"step-{view.step.pk}"
    html = _render("_step.html", {"view": view, "session_id": session_id, "open": open})
    lazy = _loading("div", dom_id, turn_url(session_id, turn_number), view.step.number, select=dom_id)
    return Put(dom_id, html, into=f"steps-{turn_number}", at="order", lazy=lazy)


def row_put(row: ToolRow, *, session_id: int) -> Put:
    return Put(row.dom_id, _render("_tool_row.html", {"row": row, "session_id": session_id}))


def compaction_put(view: CompactionView) -> Put:
    dom_id = f"compaction-{view.generation.number}"
    return Put(dom_id, _render("_compaction.html", {"view": view}), into="transcript", at="order")


def compaction_remove(number: int) -> Remove:
    return Remove(f"compaction-{number}")


def turn_remove(number: int) -> Remove:
    return Remove(f"turn-{number}")


def transcript_put(page: TranscriptPage, *, session_id: int) -> Put:
    """The whole transcript of a page again (its last turns), for a page too far behind to catch up."""
    inner = _render("_transcript.html", {"page": page, "session_id": session_id})
    html = format_html('<div id="transcript" class="transcript">{}</div>', inner)
    lazy = format_html(
        '<div id="transcript" class="transcript" hx-get="{}" hx-trigger="load" hx-swap="innerHTML">Loading…</div>',
        reverse("session_turns", args=[session_id]),
    )
    return Put("transcript", html, lazy=lazy)


def chart_window(session: ChatSession) -> int:
    return session.endpoint.window or CHART_WINDOW_DEFAULT


def chart_markup(session: ChatSession, requests: Sequence[ModelRequest], *, more: int, first_index: int) -> str:
    bars = chart.bars_of(requests, first_index=first_index)
    return chart.chart_html(
        bars,
        window=chart_window(session),
        auto_at=prompts.rules_config().compaction_auto_at,
        more=more,
        full_url=reverse("session_chart", args=[session.pk]),
    )


def chart_put(session: ChatSession, requests: Sequence[ModelRequest], *, more: int, first_index: int) -> Put:
    html = chart_markup(session, requests, more=more, first_index=first_index)
    return Put("chart", format_html('<div id="chart" class="chart">{}</div>', html))


def bar_put(bar: chart.Bar, *, window: int) -> Put:
    html = chart.bar_html(bar, window=window, auto_at=prompts.rules_config().compaction_auto_at)
    return Put(f"bar-{bar.request.pk}", str(html), into="chart-bars", at="end")


def axis_put(window: int) -> Put:
    """The chart's axis titles, with the window the bar just put was drawn against."""
    return Put("axis-titles", str(chart.axis_titles(window)))


def summary_put(totals: RequestTotals) -> Put:
    """The chart's summary line."""
    return Put(
        "chart-summary", format_html('<p id="chart-summary" class="chart-summary">{}</p>', chart.summary_text(totals))
    )


def headline_put(totals: RequestTotals) -> Put:
    """The chart's summary in the page's header, on the button that opens and closes the chart."""
    return Put("chart-headline", format_html('<span id="chart-headline">{}</span>', chart.headline_text(totals)))


def title_put(session: ChatSession) -> Put:
    return Put("session-title", _render("_title.html", {"session": session}))


def sidebar_title_put(session: ChatSession) -> Put:
    """The session's name in the sidebar of the pages that show it (where it is the current one)."""
    return Put(f"side-title-{session.pk}", _render("_sidebar_link.html", {"session": session, "current": True}))


def controls_put(*, running: bool, label: str = "") -> Put:
    return Put("controls", _render("_controls.html", {"running": running, "label": label}))


def mode_put(session: ChatSession) -> Put:
    return Put("mode-control", _render("_mode.html", {"session": session, "modes": Mode.choices}))


def model_put(session: ChatSession) -> Put:
    """The session's model menu in the header, closed: it asks the servers for their models when opened."""
    return Put("model-control", _render("_model.html", {"session": session}))


def notice_put(text: str, *, level: str = "info", lines: Sequence[str] = ()) -> Put:
    return Put("notice", _render("_notice.html", {"text": text, "level": level, "lines": list(lines)}))


def composer_put(text: str) -> Put:
    """The message box holding ``text``: undo and rewind give the person their words back. Long words follow
    the box as its value, in pieces: written as HTML they could pass what one message holds."""
    if len(text) <= TEXT_PIECE:
        return Put("composer-text", _render("_composer_text.html", {"text": text, "focus": True}))
    return Put("composer-text", _render("_composer_text.html", {"text": "", "focus": True}), value=text)


def attachments_put(session: ChatSession) -> Put:
    """The files waiting for the session's next message (none once a message said they arrived)."""
    uploads = list(uploads_waiting(session=session))
    return Put("attachments", _render("_attachments.html", {"session": session, "uploads": uploads, "said": []}))
