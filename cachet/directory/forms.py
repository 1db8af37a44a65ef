"""The login form: a local password, or the directory's where LDAP is on; it says so when the directory was away
rather than calling the password wrong."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError

AWAY = "The company directory (LDAP) did not answer, so your password could not be checked; try again in a moment."
AWAY_MARK = "cachet_directory_away"  # set on a request whose login found the directory away (``cachet.directory.ldap``)


class LoginForm(AuthenticationForm):
    directory_away = False

    def clean(self) -> dict[str, Any]:
        try:
            cleaned: dict[str, Any] = super().clean()
        except ValidationError:
            if self.request is not None and getattr(self.request, AWAY_MARK, False):
                self.directory_away = True
                raise ValidationError(AWAY, code="directory_away") from None
            raise
        return cleaned
