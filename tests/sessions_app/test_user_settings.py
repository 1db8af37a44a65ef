"""A person's settings: set, read, kept apart from another person's."""

from __future__ import annotations

from typing import Any

import pytest

from sessions_app.models import Theme, UserSetting
from sessions_app.selectors.settings import theme_of
from sessions_app.services.settings import theme_set

pytestmark = pytest.mark.django_db


def test_the_theme_is_the_systems_until_chosen_and_then_the_persons_own(user: Any, other_user: Any) -> None:
    assert theme_of(owner=user) == Theme.SYSTEM
    theme_set(user=user, theme=Theme.DARK)
    theme_set(user=user, theme=Theme.LIGHT)
    assert theme_of(owner=user) == Theme.LIGHT
    assert theme_of(owner=other_user) == Theme.SYSTEM
    assert UserSetting.objects.count() == 1


def test_nobody_logged_in_gets_the_systems_theme() -> None:
    from django.contrib.auth.models import AnonymousUser

    assert theme_of(owner=AnonymousUser()) == Theme.SYSTEM
    assert theme_of(owner=None) == Theme.SYSTEM
