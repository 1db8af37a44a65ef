"""A person's own settings, read."""

from __future__ import annotations

from typing import Any

from sessions_app.models import Theme, UserSetting


def theme_of(*, owner: Any) -> Theme:
    """The theme ``owner`` chose; the system's preference for anyone who chose none or is not logged in."""
    if not getattr(owner, "is_authenticated", False):
        return Theme.SYSTEM
    chosen = UserSetting.objects.filter(user=owner).values_list("theme", flat=True).first()
    return Theme(chosen) if chosen in Theme.values else Theme.SYSTEM
