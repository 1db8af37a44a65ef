"""The login page: the password form, and the button to sign in with the company's provider where OIDC is on."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import views as auth_views

from cachet.directory.forms import LoginForm


class LoginView(auth_views.LoginView):
    authentication_form = LoginForm

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context: dict[str, Any] = super().get_context_data(**kwargs)
        context["oidc_label"] = settings.CACHET_OIDC_LABEL if settings.CACHET_OIDC_CLIENT_ID else ""
        return context
