"""What every page's template is given beside its own context."""

from __future__ import annotations

import functools
from collections.abc import Callable

from django.http import HttpRequest

from sessions_app.models import Theme
from sessions_app.selectors.settings import theme_of


def theme(request: HttpRequest) -> dict[str, object]:
    """The person's theme, rendered on ``<html>`` so the page never flashes the other one, and the choices.
    Read only where a template uses it (a fragment does not)."""
    user = getattr(request, "user", None)
    chosen: Callable[[], str] = functools.cache(lambda: theme_of(owner=user).value)
    return {"theme": chosen, "themes": Theme.choices}
