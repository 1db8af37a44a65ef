"""A person's own settings: how the pages look."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db import transaction

from sessions_app.models import Theme, UserSetting


def theme_set(*, user: User, theme: Theme) -> UserSetting:
    """Remember ``theme`` for ``user``: every page they open from now on renders with it."""
    with transaction.atomic():
        setting, _ = UserSetting.objects.get_or_create(user=user)
        setting = UserSetting.objects.select_for_update(no_key=True).get(pk=setting.pk)
        setting.theme = theme
        setting.save(update_fields=["theme"])
    return setting
