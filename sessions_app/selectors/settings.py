"""A person's own settings, read."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from sessions_app.models import InstructionPreset, Theme, UserSetting


def theme_of(*, owner: Any) -> Theme:
    """The theme ``owner`` chose; the system's preference for anyone who chose none or is not logged in."""
    if not getattr(owner, "is_authenticated", False):
        return Theme.SYSTEM
    chosen = UserSetting.objects.filter(user=owner).values_list("theme", flat=True).first()
    return Theme(chosen) if chosen in Theme.values else Theme.SYSTEM


def presets_of(*, owner: Any) -> QuerySet[InstructionPreset]:
    """The instruction presets ``owner`` saved, by name; nobody else's."""
    if not getattr(owner, "is_authenticated", False):
        return InstructionPreset.objects.none()
    return InstructionPreset.objects.filter(owner_id=owner.pk)


def preset_get(*, owner: Any, preset_id: int) -> InstructionPreset | None:
    return presets_of(owner=owner).filter(pk=preset_id).first()
