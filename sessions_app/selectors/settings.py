"""A person's own settings, read."""

from __future__ import annotations

from typing import Any

from django.db.models import BooleanField, Exists, ExpressionWrapper, OuterRef, Q, QuerySet

from sessions_app.models import InstructionPreset, Theme, UserSetting


def theme_of(*, owner: Any) -> Theme:
    """The theme ``owner`` chose; the system's preference for anyone who chose none or is not logged in."""
    if not getattr(owner, "is_authenticated", False):
        return Theme.SYSTEM
    chosen = UserSetting.objects.filter(user=owner).values_list("theme", flat=True).first()
    return Theme(chosen) if chosen in Theme.values else Theme.SYSTEM


def presets_of(*, owner: Any) -> QuerySet[InstructionPreset]:
    """The instruction presets ``owner`` saved and those staff shared with them or their groups (``shared``), by
    name; nobody else's."""
    if not getattr(owner, "is_authenticated", False):
        return InstructionPreset.objects.none()
    people = InstructionPreset.people.through.objects.filter(instructionpreset_id=OuterRef("pk"), user_id=owner.pk)
    groups = InstructionPreset.groups.through.objects.filter(instructionpreset_id=OuterRef("pk"), group__user=owner.pk)
    offered = Q(owner_id=owner.pk) | Q(Exists(people)) | Q(Exists(groups))
    shared = ExpressionWrapper(~Q(owner_id=owner.pk), output_field=BooleanField())
    return InstructionPreset.objects.filter(offered).annotate(shared=shared).order_by("name", "pk")


def preset_get(*, owner: Any, preset_id: int) -> InstructionPreset | None:
    """One of ``owner``'s own presets (one shared with them is not theirs to delete)."""
    return InstructionPreset.objects.filter(owner_id=owner.pk, pk=preset_id).first()
