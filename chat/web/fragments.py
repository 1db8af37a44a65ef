"""The HTML pieces the websocket pushes: each is an element with ``hx-swap-oob`` that htmx's ws extension
swaps into the page by its id. Streamed text is escaped, never parsed as markup."""

from __future__ import annotations

from typing import Any

from django.template.loader import render_to_string
from django.utils.html import format_html
from django.utils.safestring import SafeString

from chat.web import chart
from chat.web.display import LiveText, row_for_result, single_turn, transcript
from sessions_app.models import ChatSession, Mode, ModelRequest, Result, Turn


def _render(template: str, context: dict[str, Any]) -> str:
    return render_to_string(f"chat/{template}", context)


def page_context(session: ChatSession, *, live: LiveText | None, running: bool, label: str = "") -> dict[str, Any]:
    """What the chat page and the full re-sync of a websocket render from."""
    return {
        "session": session,
        "session_id": session.pk,
        "entries": transcript(session, live=live),
        "running": running,
        "label": label,
        "modes": Mode.choices,
        "chart": chart_of(session),
    }


def chart_of(session: ChatSession) -> SafeString:
    requests = ModelRequest.objects.filter(session=session).select_related("turn").order_by("id")
    return chart.chart_svg(list(requests))


def sync(session: ChatSession, *, live: LiveText | None, running: bool, label: str = "") -> str:
    """Everything that changes on the chat page, to bring a (re)connected tab up to date."""
    context = page_context(session, live=live, running=running, label=label)
    return "".join(
        [
            format_html('<div id="transcript" hx-swap-oob="innerHTML">{}</div>', _render("_transcript.html", context)),
            controls(running=running, label=label),
            _render("_mode.html", {**context, "oob": True}),
            format_html('<div id="chart" hx-swap-oob="innerHTML">{}</div>', context["chart"]),
            format_html('<h1 id="session-title" hx-swap-oob="true">{}</h1>', session.title or "New session"),
        ]
    )


def transcript_html(session: ChatSession) -> str:
    context = {"session": session, "session_id": session.pk, "entries": transcript(session)}
    return format_html('<div id="transcript" hx-swap-oob="innerHTML">{}</div>', _render("_transcript.html", context))


def turn_appended(turn: Turn) -> str:
    """A new turn at the end of the transcript, unless the page already shows it."""
    view = single_turn(turn, live=LiveText())
    html = _render("_turn.html", {"t": view, "session_id": turn.session_id, "oob": False})
    return format_html(
        '<div hx-swap-oob="beforeend:#transcript:not(:has(#turn-{}))">{}</div>{}',
        turn.number,
        html,
        title(turn.session_id),
    )


def title(session_id: int) -> str:
    session = ChatSession.objects.only("title").get(pk=session_id)
    return format_html('<h1 id="session-title" hx-swap-oob="true">{}</h1>', session.title or "New session")


def turn_replaced(turn: Turn) -> str:
    """The whole turn again, as stored: when it finishes, fails or stops."""
    view = single_turn(turn)
    return _render("_turn.html", {"t": view, "session_id": turn.session_id, "oob": True})


def steps_replaced(turn: Turn) -> str:
    """The turn's stored steps, and an empty live area for the next step."""
    view = single_turn(turn, live=LiveText())
    context = {"t": view, "session_id": turn.session_id, "oob": True, "live": LiveText()}
    return _render("_steps.html", context) + _render("_live.html", context)


def result_row(result: Result) -> str:
    row = row_for_result(result)
    if row is None:
        return ""
    return _render("_tool_row.html", {"row": row, "session_id": result.session_id, "oob": True})


def text_delta(turn_number: int, delta: str) -> str:
    return format_html('<span hx-swap-oob="beforeend:#stream-{}">{}</span>', turn_number, delta)


def reasoning_delta(turn_number: int, delta: str) -> str:
    return format_html('<span hx-swap-oob="beforeend:#reasoning-{}">{}</span>', turn_number, delta)


def calling(turn_number: int, name: str) -> str:
    return format_html('<ul hx-swap-oob="beforeend:#calling-{}"><li>calling {}…</li></ul>', turn_number, name)


def chart_replaced(session_id: int) -> str:
    session = ChatSession(pk=session_id)
    return format_html('<div id="chart" hx-swap-oob="innerHTML">{}</div>', chart_of(session))


def controls(*, running: bool, label: str = "") -> str:
    return _render("_controls.html", {"running": running, "label": label, "oob": True})


def mode_control(session: ChatSession) -> str:
    return _render("_mode.html", {"session": session, "modes": Mode.choices, "oob": True})


def notice(text: str, *, level: str = "info", lines: list[str] | None = None) -> str:
    return _render("_notice.html", {"text": text, "level": level, "lines": lines or [], "oob": True})


def composer(text: str) -> str:
    """The message box holding ``text``: undo and rewind give the person their words back."""
    return _render("_composer_text.html", {"text": text, "oob": True})
