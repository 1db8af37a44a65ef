"""``{{ session|totals_brief }}``: a listed session's requests added up, as the session list shows them."""

from __future__ import annotations

from django import template

from chat.web.chart import totals_brief as brief
from sessions_app.models import ChatSession
from sessions_app.selectors.totals import listed_totals

register = template.Library()


@register.filter
def totals_brief(session: ChatSession) -> str:
    """The figures of a session annotated by ``with_totals``; "" where it was not, or made no request."""
    return brief(listed_totals(session))
