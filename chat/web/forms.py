"""Forms of the session pages."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from sessions_app.models import Mode, ModelEndpoint, Workspace
from sessions_app.selectors.sessions import workspaces_for


class NewSessionForm(forms.Form):
    workspace = forms.ModelChoiceField(queryset=Workspace.objects.none(), empty_label=None)
    endpoint = forms.ModelChoiceField(queryset=ModelEndpoint.objects.all(), empty_label=None, label="Model endpoint")
    model = forms.CharField(
        max_length=200,
        required=False,
        help_text="Leave empty for the endpoint's model, or the first model the server lists.",
    )
    mode = forms.ChoiceField(
        choices=Mode.choices,
        initial=Mode.EDIT,
        help_text="plan: read only · edit: read and change files · full: also run commands where allowed.",
    )

    def __init__(self, *args: Any, user: AbstractBaseUser | AnonymousUser, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["workspace"]
        assert isinstance(field, forms.ModelChoiceField)
        field.queryset = workspaces_for(user=user)


class RenameForm(forms.Form):
    title = forms.CharField(max_length=200, required=False)
