"""Forms of the session pages, and the choice of a model: an endpoint and a model name, offered as one select
grouped by endpoint whose values are ``ID:MODEL``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django import forms
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from chat.agent.endpoints import FALLBACK_MODEL, EndpointModels, endpoint_models
from sessions_app.models import ApiTokenAccess, ChatSession, InstructionPreset, Mode, ModelEndpoint, Theme, Workspace
from sessions_app.selectors.search import QUERY_CHARS
from sessions_app.selectors.sessions import endpoints_for, session_models, session_workspaces, workspaces_for
from sessions_app.selectors.settings import presets_of
from sessions_app.services.sessions import INSTRUCTIONS_CHARS, MAX_TOKENS_LIMIT, TEMPERATURE_RANGE
from sessions_app.services.tokens import NAME_CHARACTERS

MODEL_MAX_LENGTH = 200
ID_DIGITS = 18


@dataclass(frozen=True)
class ModelChoice:
    """An endpoint and a model on it; an empty model: the endpoint's own, else the first its server lists."""

    endpoint: ModelEndpoint
    model: str


def choice_value(endpoint_id: int, model: str) -> str:
    return f"{endpoint_id}:{model}"


def parse_model_choice(value: object, *, user: AbstractBaseUser | AnonymousUser) -> ModelChoice:
    """``ID`` or ``ID:MODEL`` (a model's name may hold colons) of an endpoint ``user`` may use; a ``ValueError``
    says what is wrong (an endpoint they may not use is one there is not)."""
    if isinstance(value, int) and not isinstance(value, bool):
        ident, model = str(value), ""
    elif isinstance(value, str):
        ident, _, model = value.strip().partition(":")
    else:
        raise ValueError("Choose a model endpoint.")
    ident = ident.strip()
    if not ident.isascii() or not ident.isdigit() or len(ident) > ID_DIGITS:
        raise ValueError("Choose a model endpoint.")
    endpoint = endpoints_for(user=user).filter(pk=int(ident)).first()
    if endpoint is None:
        raise ValueError(f"There is no model endpoint {ident}.")
    model = model.strip()
    if len(model) > MODEL_MAX_LENGTH:
        raise ValueError(f"A model name is at most {MODEL_MAX_LENGTH} characters.")
    return ModelChoice(endpoint, model)


def model_for(choice: ModelChoice, typed: str = "") -> str:
    """The model to use: the one typed, else the one chosen, else the endpoint's, else the first it lists."""
    return typed.strip() or choice.model or endpoint_models(choice.endpoint).preferred or FALLBACK_MODEL


def grouped_choices(
    found: Sequence[EndpointModels], *, current: tuple[int, str] | None = None
) -> list[tuple[str, list[tuple[str, str]]]]:
    """One group per endpoint, its models as options; an endpoint with none offers the model typed below."""
    groups: list[tuple[str, list[tuple[str, str]]]] = []
    for item in found:
        endpoint = item.endpoint
        names = list(item.names)
        if current is not None and current[0] == endpoint.pk and current[1] not in names:
            names.insert(0, current[1])
        label = f"{endpoint.name} · {endpoint.base_url}"
        if not item.listing.listed:
            label += " · lists no models" if item.listing.answered else " · does not answer"
        options = [(choice_value(endpoint.pk, name), name) for name in names]
        groups.append((label, options or [(choice_value(endpoint.pk, ""), "the model typed below")]))
    return groups


def _model_field() -> forms.CharField:
    return forms.CharField(
        max_length=MODEL_MAX_LENGTH,
        required=False,
        label="Or another model",
        help_text="A model name on the chosen endpoint, for one its server does not list or when it does not answer.",
    )


class _ModelChoiceForm(forms.Form):
    endpoint = forms.CharField(label="Model", widget=forms.Select)
    model = _model_field()

    def __init__(self, *args: Any, user: AbstractBaseUser | AnonymousUser, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.user = user
        self.endpoints: list[EndpointModels] = []

    def offer(self, found: Sequence[EndpointModels], *, current: tuple[int, str] | None = None) -> None:
        """Offer the models of ``found``, with ``current`` (an endpoint's id and a model) chosen."""
        self.endpoints = list(found)
        widget = self.fields["endpoint"].widget
        assert isinstance(widget, forms.Select)
        widget.choices = grouped_choices(self.endpoints, current=current)
        if current is not None:
            self.fields["endpoint"].initial = choice_value(*current)

    def clean_endpoint(self) -> ModelChoice:
        try:
            return parse_model_choice(self.cleaned_data["endpoint"], user=self.user)
        except ValueError as error:
            raise forms.ValidationError(str(error)) from error

    def chosen_model(self) -> str:
        choice = self.cleaned_data["endpoint"]
        assert isinstance(choice, ModelChoice)
        return model_for(choice, self.cleaned_data["model"])

    @property
    def unanswered(self) -> list[EndpointModels]:
        return [item for item in self.endpoints if not item.listing.listed]


class SessionSettingsForm(forms.Form):
    """A session's instructions (typed, or one of the person's presets) and sampling; New chat has them too."""

    instructions = forms.CharField(
        required=False,
        max_length=INSTRUCTIONS_CHARS,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 4, "placeholder": "e.g. Answer in French. Keep replies short."}),
        help_text="A note on the first message, and on the next one after a change: never the system prompt.",
    )
    preset = forms.TypedChoiceField(required=False, coerce=int, empty_value=None)
    temperature = forms.FloatField(
        required=False,
        min_value=TEMPERATURE_RANGE[0],
        max_value=TEMPERATURE_RANGE[1],
        widget=forms.NumberInput(attrs={"step": "0.1", "placeholder": "server's"}),
    )
    max_tokens = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_TOKENS_LIMIT,
        label="Max tokens",
        widget=forms.NumberInput(attrs={"placeholder": "server's"}),
    )

    def offer_presets(self, owner: AbstractBaseUser | AnonymousUser) -> None:
        """Offer ``owner``'s presets, and no one else's."""
        self.presets: list[InstructionPreset] = list(presets_of(owner=owner))
        field = self.fields["preset"]
        assert isinstance(field, forms.TypedChoiceField)
        field.choices = [("", "—"), *((str(preset.pk), preset.name) for preset in self.presets)]

    def chosen_instructions(self) -> str:
        """The instructions typed, else the chosen preset's."""
        typed = str(self.cleaned_data.get("instructions") or "")
        if typed.strip():
            return typed
        chosen = self.cleaned_data.get("preset")
        return next((preset.text for preset in self.presets if preset.pk == chosen), "")


class SessionSettingsChangeForm(SessionSettingsForm):
    """The session page's Settings menu: the settings, and a name to keep the instructions as a preset."""

    preset_name = forms.CharField(required=False, max_length=100, label="Save as preset named")

    def __init__(self, *args: Any, session: ChatSession, **kwargs: Any) -> None:
        kwargs.setdefault("auto_id", "settings-%s")
        kwargs["initial"] = {
            "instructions": session.instructions,
            "temperature": session.temperature,
            "max_tokens": session.max_tokens,
        }
        super().__init__(*args, **kwargs)
        self.offer_presets(session.owner)


class NewSessionForm(_ModelChoiceForm, SessionSettingsForm):
    workspace = forms.ModelChoiceField(queryset=Workspace.objects.none(), empty_label=None)
    endpoint = forms.CharField(label="Model", widget=forms.Select, help_text="Each endpoint with the models it lists.")
    model = _model_field()
    mode = forms.ChoiceField(
        choices=Mode.choices,
        initial=Mode.EDIT,
        help_text="plan: read only · edit: read and change files · full: also run commands where allowed.",
    )

    text = forms.CharField(
        label="Message",
        strip=False,
        widget=forms.Textarea,
        error_messages={"required": "Type a message: the session is stored when its first message is sent."},
    )

    field_order = ["workspace", "endpoint", "model", "mode", "text", "instructions", "preset"]

    def __init__(
        self, *args: Any, user: AbstractBaseUser | AnonymousUser, last: ChatSession | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, user=user, **kwargs)
        field = self.fields["workspace"]
        assert isinstance(field, forms.ModelChoiceField)
        field.queryset = workspaces_for(user=user)
        self.last = last
        self.offer_presets(user)

    def clean_text(self) -> str:
        text = self.cleaned_data["text"]
        if not text.strip():
            raise forms.ValidationError(self.fields["text"].error_messages["required"])
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > settings.CACHET_MAX_MESSAGE_BYTES:
            raise forms.ValidationError(
                f"The message is {size:,} bytes; a message is at most {settings.CACHET_MAX_MESSAGE_BYTES:,}."
            )
        return str(text)

    def choose_workspace(self, workspace: Workspace) -> None:
        """Start with ``workspace`` chosen, unless the person's last session is on one they may still use."""
        field = self.fields["workspace"]
        assert isinstance(field, forms.ModelChoiceField)
        last = self.last.workspace_id if self.last is not None else None
        queryset = field.queryset
        # a folder named from a shell (``ask --workspace``) is that command's, not the browser's next default
        usable = last is not None and queryset is not None and queryset.filter(pk=last, from_shell=False).exists()
        field.initial = last if usable else workspace.pk
        if self.last is not None:
            self.fields["mode"].initial = self.last.mode

    def offer_default(self, found: Sequence[EndpointModels]) -> None:
        """Offer the models of ``found`` with the model of the person's last session chosen, else the default
        endpoint's."""
        last = next((item for item in found if self.last and item.endpoint.pk == self.last.endpoint_id), None)
        if (
            self.last is not None
            and last is not None
            and (not last.listing.listed or self.last.model_name in last.names)
        ):
            self.offer(found, current=(self.last.endpoint_id, self.last.model_name))
            return  # the last session's model, where its server still offers it (or does not say)
        default = found[0].endpoint if found else None  # the default endpoint where the person may use it
        preferred = next((item.preferred for item in found if default and item.endpoint.pk == default.pk), "")
        self.offer(found, current=(default.pk, preferred) if default and preferred else None)
        if default and not preferred:
            self.fields["endpoint"].initial = choice_value(default.pk, "")


class ModelChangeForm(_ModelChoiceForm):
    """A session's model menu: sent over the websocket as ``{"type": "model", "endpoint", "model"}``."""

    def __init__(self, *args: Any, session: ChatSession, found: Sequence[EndpointModels], **kwargs: Any) -> None:
        super().__init__(*args, user=session.owner, auto_id="model-%s", **kwargs)
        self.offer(found, current=(session.endpoint_id, session.model_name))


class RenameForm(forms.Form):
    title = forms.CharField(max_length=200, required=False)


class SessionSearchForm(forms.Form):
    """The search box of the session list and its filters; a plain GET form, so it works without scripts."""

    q = forms.CharField(max_length=QUERY_CHARS, required=False, label="Search sessions")
    workspace = forms.TypedChoiceField(
        required=False, coerce=int, empty_value=None, widget=forms.Select(attrs={"aria-label": "Workspace"})
    )
    model = forms.ChoiceField(required=False, widget=forms.Select(attrs={"aria-label": "Model"}))

    def __init__(self, *args: Any, owner: AbstractBaseUser | AnonymousUser, **kwargs: Any) -> None:
        kwargs.setdefault("auto_id", "search-%s")
        super().__init__(*args, **kwargs)
        workspace = self.fields["workspace"]
        assert isinstance(workspace, forms.TypedChoiceField)
        workspace.choices = [("", "All workspaces"), *((str(pk), name) for pk, name in session_workspaces(owner=owner))]
        model = self.fields["model"]
        assert isinstance(model, forms.ChoiceField)
        model.choices = [("", "All models"), *((name, name) for name in session_models(owner=owner))]

    @property
    def filtered(self) -> bool:
        return (
            self.is_bound and self.is_valid() and any(self.cleaned_data.get(key) for key in ("q", "workspace", "model"))
        )


class ThemeForm(forms.Form):
    theme = forms.ChoiceField(choices=Theme.choices)


class ImportForm(forms.Form):
    """A session exported as JSON, and the workspace (one the person may use) to bring it into."""

    file = forms.FileField(label="Exported JSON file", widget=forms.ClearableFileInput(attrs={"accept": ".json"}))
    workspace = forms.ModelChoiceField(queryset=Workspace.objects.none(), empty_label=None)

    def __init__(self, *args: Any, user: AbstractBaseUser | AnonymousUser, **kwargs: Any) -> None:
        kwargs.setdefault("auto_id", "import-%s")
        super().__init__(*args, **kwargs)
        field = self.fields["workspace"]
        assert isinstance(field, forms.ModelChoiceField)
        field.queryset = workspaces_for(user=user)


class ApiTokenForm(forms.Form):
    """A new personal access token: its name (checked by ``api_token_create``, which says what is wrong) and
    whether it may change anything."""

    name = forms.CharField(
        required=False,
        label="Name",
        help_text="What will use it, to know it again later: e.g. “CI”, “my editor”.",
        widget=forms.TextInput(
            attrs={
                "required": True,
                "maxlength": NAME_CHARACTERS,
                "autocomplete": "off",
                "aria-describedby": "token-name-help",
            }
        ),
    )
    access = forms.ChoiceField(choices=ApiTokenAccess.choices, initial=ApiTokenAccess.READ, widget=forms.RadioSelect)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("auto_id", "token-%s")
        super().__init__(*args, **kwargs)
