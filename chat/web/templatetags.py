"""Template filters of the chat pages."""

from __future__ import annotations

from django import template
from django.utils.safestring import SafeString

from chat.web.display import result_id
from chat.web.rendering import markdown_html

register = template.Library()


@register.filter(name="markdown")
def markdown(text: str | None) -> SafeString:
    """``text`` rendered as sanitized markdown; put it inside an element with ``hx-disable``."""
    return markdown_html(text or "")


@register.filter(name="words")
def words(text: str | None) -> SafeString:
    """A person's message rendered as sanitized markdown, each line break they typed kept."""
    return markdown_html(text or "", breaks=True)


@register.filter(name="rid")
def rid(number: int | None) -> str:
    """A result number as its id, ``#0003``."""
    return result_id(number) if number else ""
