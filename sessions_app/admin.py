"""The admin: staff configure workspaces and endpoints, and see every stored session, result and request."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from sessions_app.folders import folder_check
from sessions_app.hygiene import format_id, parse_id
from sessions_app.models import (
    DEFAULT_ENDPOINT_NAME,
    ApiToken,
    ChatSession,
    DirectoryAccount,
    Generation,
    InstructionPreset,
    McpServer,
    ModelEndpoint,
    ModelRequest,
    Result,
    Step,
    Turn,
    TurnStatus,
    Upload,
    UsageDay,
    Workspace,
)
from sessions_app.selectors.sessions import workspace_nesting
from sessions_app.selectors.totals import listed_totals, with_totals
from sessions_app.services.tokens import api_token_revoke
from sessions_app.services.workspaces import workspace_folders_lock
from sessions_app.tool_names import offered_name


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Stored history is shown, never edited nor deleted; deleting stays with the owner's own session delete."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReadOnlyInline(admin.TabularInline):  # type: ignore[type-arg]
    extra = 0
    can_delete = False
    show_change_link = True

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [str(name) for name in self.fields or []]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class KeepsSessionsAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Configuration that sessions point to: deletable while no session uses it, since sessions are kept."""

    session_link = ""  # the ChatSession field that points to this model
    in_use_text = "Sessions use {names}, and sessions are kept, so it cannot be deleted."

    def get_deleted_objects(
        self, objs: Sequence[Model] | QuerySet[Any], request: HttpRequest
    ) -> tuple[list[Any], dict[str, int], set[str], list[Any]]:
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        if protected:
            # The sessions listed stop the delete, not a missing permission (the admin deletes no session).
            perms_needed.discard(str(ChatSession._meta.verbose_name))
            in_use = [str(obj) for obj in objs if ChatSession.objects.filter(**{self.session_link: obj}).exists()]
            messages.error(request, self.in_use_text.format(names=", ".join(f"“{name}”" for name in in_use)))
        return deleted, counts, perms_needed, protected


class WorkspaceForm(forms.ModelForm):  # type: ignore[type-arg]
    """A workspace as staff set it: its folder lies under ``CACHET_WORKSPACE_ROOTS`` (one named from a shell may
    keep its own), is none Cachet refuses (``sessions_app.folders``) and nests with no other workspace's; it is
    stored resolved, symlinks followed. The check holds the lock every maker of a workspace takes, until the
    admin's transaction saves it."""

    class Meta:
        model = Workspace
        fields = "__all__"  # noqa: DJ007 - the admin's own fieldsets decide what shows

    def clean_folder(self) -> str:
        given = self.cleaned_data["folder"]
        kept = self.instance.pk is not None and self.instance.from_shell and given == self.instance.folder
        checked = folder_check(given, anywhere=kept)
        if not checked.allowed:
            raise forms.ValidationError(f"Cachet may not use this folder: {checked.refusal}.")
        workspace_folders_lock()
        nesting = workspace_nesting(folder=checked.folder, excluding=self.instance.pk)
        if nesting:
            raise forms.ValidationError(f"Cachet may not use this folder: {nesting}.")
        if not kept:
            self.instance.from_shell = False
        return str(checked.folder)


NOBODY_LEFT = (
    "“{name}” has no members or groups now and is not open to everyone: only staff can use it, and the sessions "
    "others have on it are read-only. Add members or groups, or tick “Open to everyone” to let every person in."
)
EVERYONE_RUNS = "Every person can use “{name}” now, and run commands in it: it is open to everyone and allows commands."


@admin.register(Workspace)
class WorkspaceAdmin(KeepsSessionsAdmin):
    """Shared workspaces as staff make them; a private one (``owner``) shows its folder, owner and members, which
    never change."""

    form = WorkspaceForm
    session_link = "workspace"
    list_display = ["name", "folder", "owner", "open_to_everyone", "allow_commands", "allow_network"]
    list_filter = ["open_to_everyone", "allow_commands"]
    filter_horizontal = ["members", "groups"]
    search_fields = ["name", "folder"]
    PRIVATE_FIXED = ("folder", "owner", "members", "groups", "open_to_everyone", "from_shell")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        fixed = ["owner", "from_shell"]
        if obj is not None and obj.owner_id is not None:
            fixed = list(self.PRIVATE_FIXED)
        return [*super().get_readonly_fields(request, obj), *fixed]

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        workspace = form.instance
        if workspace.owner_id is not None:
            return
        if not workspace.open_to_everyone and not workspace.members.exists() and not workspace.groups.exists():
            self.message_user(request, NOBODY_LEFT.format(name=workspace.name), messages.WARNING)
        elif workspace.open_to_everyone and workspace.allow_commands:
            self.message_user(request, EVERYONE_RUNS.format(name=workspace.name), messages.WARNING)


API_KEY_FIELD = "api_key"
API_KEY_FIELDS = (API_KEY_FIELD, "remove_api_key")


class ModelEndpointForm(forms.ModelForm):  # type: ignore[type-arg]
    """An endpoint as staff set it: its API key is never shown again; left empty it stays as it was, and
    "Remove the API key" removes it."""

    api_key = forms.CharField(
        required=False,
        label="New API key",
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Sent as a bearer token. Never shown again: leave empty to keep the one stored.",
    )
    remove_api_key = forms.BooleanField(required=False, label="Remove the API key")

    class Meta:
        model = ModelEndpoint
        fields = "__all__"  # noqa: DJ007 - the admin's own fieldsets decide what shows

    def clean_api_key(self) -> str:
        given = str(self.cleaned_data.get("api_key") or "")
        if self.data.get("remove_api_key"):
            return ""
        return given or (self.instance.api_key if self.instance.pk else "")


@admin.register(ModelEndpoint)
class ModelEndpointAdmin(KeepsSessionsAdmin):
    form = ModelEndpointForm
    session_link = "endpoint"
    list_display = ["name", "base_url", "model", "open_to_everyone", "context_window", "window_read", "window_used"]
    list_filter = ["open_to_everyone"]
    search_fields = ["name", "base_url", "model"]
    readonly_fields = ["api_key_state", "window_read", "window_used", "images_said"]  # people and groups: plain lists

    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[Any]:
        """The form's fields, the key's replaced by whether one is set; only those who may change it get a field
        to replace it (Django shows every field's value to those who may only view)."""
        key_fields = [*API_KEY_FIELDS, "api_key_state"]
        fields = [name for name in super().get_fields(request, obj) if name not in key_fields]
        editable = self.has_add_permission(request) if obj is None else self.has_change_permission(request, obj)
        shown = (["api_key_state"] if obj is not None else []) + (list(API_KEY_FIELDS) if editable else [])
        at = fields.index("model") if "model" in fields else len(fields)
        return [*fields[:at], *shown, *fields[at:]]

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> Any:
        """On the endpoint named ``default`` where the environment sets its URL: a warning that a URL changed here
        lasts until the next start."""
        endpoint = self.get_object(request, object_id)
        named_default = endpoint is not None and endpoint.name == DEFAULT_ENDPOINT_NAME
        if request.method == "GET" and named_default and settings.CACHET_MODEL_URL:
            messages.warning(
                request,
                f"CACHET_MODEL_URL sets this endpoint's URL ({settings.CACHET_MODEL_URL}) at every start of "
                "Cachet: a URL changed here lasts until the next one. Unset it to keep what you set here.",
            )
        return super().change_view(request, object_id, form_url, extra_context)

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        """No filter on the key in the list's URL (``?api_key__startswith=sk-a`` would tell it a letter at a
        time), as Django's own ``UserAdmin`` refuses filters on passwords."""
        return not lookup.startswith(API_KEY_FIELD) and super().lookup_allowed(lookup, value, request)

    @admin.display(description="API key")
    def api_key_state(self, obj: ModelEndpoint) -> str:
        return "set" if obj.api_key else "none"

    @admin.display(description="window the server says")
    def window_read(self, obj: ModelEndpoint) -> str:
        if obj.server_window_url != obj.base_url or obj.server_window_read_at is None:
            return "not asked yet"
        asked = obj.server_window_read_at.strftime("%Y-%m-%d %H:%M UTC")
        if obj.server_context_window is None:
            return f"the server does not say (asked {asked})"
        where = f"; {obj.server_window_how}" if obj.server_window_how else ""
        return f"{obj.server_context_window:,} tokens (asked {asked}{where})"

    @admin.display(description="window used")
    def window_used(self, obj: ModelEndpoint) -> str:
        return f"{obj.window:,} tokens"

    @admin.display(description="images, as the server says")
    def images_said(self, obj: ModelEndpoint) -> str:
        if obj.server_window_url != obj.base_url or obj.server_window_read_at is None:
            return "not asked yet"
        if obj.server_reads_images is None:
            return "the server does not say: the setting above decides"
        verdict = "its model reads images" if obj.server_reads_images else "its model does not read images"
        return f"{verdict} (llama.cpp /props modalities): this decides, not the setting above"


class McpServerForm(forms.ModelForm):  # type: ignore[type-arg]
    """An MCP server as staff set it: its bearer token is never shown again; left empty it stays as it was."""

    bearer_token = forms.CharField(
        required=False,
        label="New bearer token",
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Sent as Authorization: Bearer …. Never shown again: leave empty to keep the one stored.",
    )
    remove_bearer_token = forms.BooleanField(required=False, label="Remove the bearer token")

    class Meta:
        model = McpServer
        fields = "__all__"  # noqa: DJ007 - the admin's own fieldsets decide what shows

    def clean_bearer_token(self) -> str:
        given = str(self.cleaned_data.get("bearer_token") or "")
        if self.data.get("remove_bearer_token"):
            return ""
        return given or (self.instance.bearer_token if self.instance.pk else "")


@admin.register(McpServer)
class McpServerAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """MCP servers of workspaces. Saved, a server is asked for its tools at once (by a worker); the page says what
    it answered when shown again."""

    form = McpServerForm
    list_display = ["name", "workspace", "address", "enabled", "tools_offered", "checked_at", "problem"]
    list_filter = ["enabled", "workspace"]
    search_fields = ["name", "url", "command", "workspace__name"]
    readonly_fields = ["tools_offered", "instructions", "checked_at", "problem"]

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        return not lookup.startswith("bearer_token") and super().lookup_allowed(lookup, value, request)

    def save_model(self, request: HttpRequest, obj: McpServer, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)  # saved, a worker asks it for its tools (chat.tasks)
        self.message_user(request, f"{obj.name} is being asked for its tools: reload this page in a moment.")

    @admin.display(description="URL or command")
    def address(self, obj: McpServer) -> str:
        return obj.url or f"$ {obj.command}"

    @admin.display(description="tools offered to new sessions")
    def tools_offered(self, obj: McpServer) -> str:
        if not obj.checked_at:
            return "not asked yet"
        names = [
            (offered_name(obj.name, tool["name"]) or f"{tool['name']} (name not usable)")
            + (" (read-only)" if tool.get("read_only") else "")
            for tool in json.loads(obj.tools_json or "[]")
        ]
        return ", ".join(names) or "none"


admin.site.site_header = "Cachet administration"
admin.site.site_title = "Cachet admin"
admin.site.index_title = "Sessions, people, workspaces and model endpoints"

admin.site.unregister(get_user_model())


@admin.register(get_user_model())
class PersonAdmin(KeepsSessionsAdmin, UserAdmin):  # type: ignore[type-arg]
    session_link = "owner"
    in_use_text = (
        "The account {names} has sessions, which are kept, so it cannot be deleted. "
        "Untick Active on its page instead: it can no longer log in."
    )


class TurnInline(ReadOnlyInline):
    model = Turn
    fields = ["number", "position", "status", "taken_back_by", "words", "reply_text", "error", "started_at"]


class GenerationInline(ReadOnlyInline):
    model = Generation
    fields = ["number", "model_name", "mode", "covers_through_turn", "taken_back", "created_at"]


_FORK_OPEN = mark_safe('<li class="cachet-fork"><ul>')
_BRANCH_OPEN = mark_safe('<li class="cachet-branch"><ul>')
_LIVE_BRANCH_OPEN = mark_safe('<li class="cachet-branch live"><span class="cachet-live-mark">live branch</span><ul>')
_CLOSE = mark_safe("</ul></li>")


def _turn_row(turn: Turn) -> SafeString:
    live = turn.status != TurnStatus.TAKEN_BACK
    status = turn.get_status_display() + (f" by {turn.taken_back_by}" if turn.taken_back_by and not live else "")
    return format_html(
        '<li class="cachet-turn{}"><b>turn {}</b> <span class="cachet-stored">(stored {})</span> · {} · {}</li>',
        " live" if live else "",
        turn.position,
        turn.number,
        status,
        " ".join(turn.words.split())[:80],
    )


def turn_tree_html(turns: Sequence[Turn]) -> SafeString:
    """The turns as a tree: a branch's turns one under the other, each fork a nested list of its branches,
    the live branch marked."""
    children: dict[int | None, list[Turn]] = {}
    for turn in sorted(turns, key=lambda each: each.number):
        children.setdefault(turn.parent_id, []).append(turn)
    parts: list[SafeString] = []
    pending: list[Turn | SafeString] = []

    def fork(kids: list[Turn]) -> None:
        """Queue ``kids`` as branches of a fork (queued last first, taken first first)."""
        pending.append(_CLOSE)
        for kid in reversed(kids):
            pending.extend([_CLOSE, kid, _LIVE_BRANCH_OPEN if kid.status != TurnStatus.TAKEN_BACK else _BRANCH_OPEN])
        pending.append(_FORK_OPEN)

    roots = children.get(None, [])
    if len(roots) == 1:
        pending.append(roots[0])
    elif roots:
        fork(roots)
    while pending:
        item = pending.pop()
        if not isinstance(item, Turn):
            parts.append(item)
            continue
        parts.append(_turn_row(item))
        kids = children.get(item.pk, [])
        if len(kids) == 1:
            pending.append(kids[0])
        elif kids:
            fork(kids)
    if not parts:
        return mark_safe("<p>No turns yet.</p>")
    return format_html('<ul class="cachet-tree">{}</ul>', format_html_join("", "{}", ((part,) for part in parts)))


@admin.register(ChatSession)
class ChatSessionAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "title",
        "owner",
        "workspace",
        "model_name",
        "mode",
        "requests",
        "prompt_tokens",
        "cached",
        "processed",
        "prompt_time",
        "cache_saved",
        "updated_at",
        "deleted_at",
    ]
    list_filter = ["owner", "workspace", "mode", ("deleted_at", admin.EmptyFieldListFilter)]
    search_fields = ["title", "owner__username"]
    readonly_fields = ["turn_tree"]
    inlines = [GenerationInline, TurnInline]

    class Media:
        css = {"all": ["cachet/admin.css"]}

    def get_queryset(self, request: HttpRequest) -> QuerySet[ChatSession]:
        return with_totals(super().get_queryset(request))

    @admin.display(description="requests", ordering="request_count")
    def requests(self, session: ChatSession) -> int:
        return int(getattr(session, "request_count", 0))

    @admin.display(description="prompt tokens", ordering="prompt_sum")
    def prompt_tokens(self, session: ChatSession) -> str:
        return f"{getattr(session, 'prompt_sum', 0):,}"

    @admin.display(description="cached")
    def cached(self, session: ChatSession) -> str:
        prompt = int(getattr(session, "prompt_sum", 0))
        return f"{int(getattr(session, 'cached_sum', 0)) / prompt:.0%}" if prompt else "–"

    @admin.display(description="processed")
    def processed(self, session: ChatSession) -> str:
        return f"{listed_totals(session).processed_tokens:,}"

    @admin.display(description="prompt time", ordering="prompt_seconds_sum")
    def prompt_time(self, session: ChatSession) -> str:
        return f"{listed_totals(session).prompt_seconds:.1f} s"

    @admin.display(description="cache saved")
    def cache_saved(self, session: ChatSession) -> str:
        """The time computing the cached tokens would have taken at the server's measured speed."""
        saved = listed_totals(session).saved_seconds
        return f"{saved:.1f} s" if saved is not None else "–"

    @admin.display(description="turns")
    def turn_tree(self, session: ChatSession) -> SafeString:
        turns = Turn.objects.filter(session=session).only(
            "number", "parent", "position", "status", "taken_back_by", "words"
        )
        return turn_tree_html(list(turns))


@admin.register(Generation)
class GenerationAdmin(ReadOnlyAdmin):
    list_display = ["session", "number", "model_name", "mode", "covers_through_turn", "taken_back"]
    list_filter = ["taken_back"]


class StepInline(ReadOnlyInline):
    model = Step
    fields = ["number", "text", "reasoning", "tool_calls", "finish_reason"]


@admin.register(Turn)
class TurnAdmin(ReadOnlyAdmin):
    list_display = ["session", "number", "status", "short_words", "rating", "started_at"]
    list_filter = ["status", "rating", "session__owner"]
    search_fields = ["words", "message", "reply_text"]
    inlines = [StepInline]

    @admin.display(description="message")
    def short_words(self, turn: Turn) -> str:
        return turn.words[:80]


def _numbered(text: str) -> SafeString:
    rows = format_html_join(
        "",
        '<tr><td class="number">{}</td><td><pre>{}</pre></td></tr>',
        ((number, line) for number, line in enumerate(text.split("\n"), start=1)),
    )
    return format_html('<table class="cachet-lines">{}</table>', rows)


@admin.register(Result)
class ResultAdmin(ReadOnlyAdmin):
    list_display = ["result_id", "session", "owner", "tool", "kind", "path", "created_at"]
    list_filter = ["tool", "kind", "session__owner", "session"]
    search_fields = ["path", "abs_path", "full_text"]
    list_select_related = ["session__owner"]
    readonly_fields = (
        "result_id",
        "session",
        "turn",
        "tool",
        "kind",
        "arguments_raw",
        "path",
        "abs_path",
        "sha256",
        "texts",
    )
    fields = readonly_fields

    class Media:
        css = {"all": ["cachet/admin.css"]}

    @admin.display(description="id", ordering="number")
    def result_id(self, result: Result) -> str:
        return format_id(result.number, 4)

    @admin.display(description="owner", ordering="session__owner")
    def owner(self, result: Result) -> str:
        return str(result.session.owner)

    @admin.display(description="inserted text | full text")
    def texts(self, result: Result) -> SafeString:
        return format_html(
            '<div class="cachet-texts">'
            "<div><h3>Inserted text (sent to the model)</h3>{}</div>"
            "<div><h3>Full text (stored)</h3>{}</div></div>",
            _numbered(result.inserted_text),
            _numbered(result.full_text),
        )

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Result], search_term: str
    ) -> tuple[QuerySet[Result], bool]:
        term = search_term.strip()
        if term.startswith("#"):
            number = parse_id(term)
            if number is not None:
                return queryset.filter(number=number), False
        found, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        return found, may_have_duplicates


@admin.register(ModelRequest)
class ModelRequestAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "session",
        "kind",
        "model_name",
        "bytes_sent",
        "shared_prefix_bytes",
        "break_cause",
        "prompt_tokens",
        "cached_tokens",
        "expected_cached_tokens",
        "cache_miss",
        "cache_miss_tokens",
        "completion_tokens",
        "time_to_first_token",
        "total_time",
        "status",
    ]
    list_filter = ["kind", "break_cause", "cache_miss", "status", "session__owner"]
    search_fields = ["model_name", "error"]
    exclude = ["cache_miss_before", "cache_miss_after"]
    readonly_fields = ["renderings"]

    class Media:
        css = {"all": ["cachet/admin.css"]}

    @admin.display(description="first message rendered differently (template miss)")
    def renderings(self, request: ModelRequest) -> SafeString | str:
        if not (request.cache_miss_before or request.cache_miss_after):
            return "—"
        return format_html(
            '<div class="cachet-texts">'
            "<div><h3>Message {} as the server rendered it for the request before</h3>{}</div>"
            "<div><h3>As it rendered it for this request</h3>{}</div></div>",
            request.cache_miss_message,
            _numbered(request.cache_miss_before),
            _numbered(request.cache_miss_after),
        )


@admin.register(Upload)
class UploadAdmin(ReadOnlyAdmin):
    """Files people attached: where they went in the workspace, and the message that said they arrived."""

    list_display = ["id", "session", "path", "size", "turn", "created_at"]
    list_select_related = ["session", "turn"]
    search_fields = ["path"]


@admin.register(UsageDay)
class UsageDayAdmin(ReadOnlyAdmin):
    """The daily roll-up the usage page reads (``/usage/``, which adds it up per person, model and day)."""

    list_display = [
        "day",
        "owner",
        "endpoint",
        "model_name",
        "requests",
        "failed",
        "prompt_tokens",
        "cached_tokens",
        "completion_tokens",
        "prompt_seconds",
    ]
    list_filter = ["day", "endpoint", "owner"]
    date_hierarchy = "day"
    list_select_related = ["owner", "endpoint"]


@admin.register(DirectoryAccount)
class DirectoryAccountAdmin(ReadOnlyAdmin):
    """Who signs in through the company's directory (OIDC or LDAP): their id there, and the directory's groups at
    their last sign-in (mapped to Cachet's groups then). To stop someone, untick Active on their user."""

    list_display = ["user", "source", "subject", "directory_groups", "signed_in_at", "created_at"]
    list_filter = ["source"]
    search_fields = ["user__username", "subject"]
    list_select_related = ["user"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """People's personal access tokens for the API: who has which, what it may do, when it was last used. Only
    its first characters are known (the rest is kept as a digest); staff revoke one, nobody makes one here."""

    list_display = ["name", "owner", "access", "shown", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["access", ("revoked_at", admin.EmptyFieldListFilter), "owner"]
    list_select_related = ["owner"]
    search_fields = ["name", "owner__username", "shown"]
    readonly_fields = ["owner", "name", "access", "shown", "created_at", "last_used_at", "revoked_at"]
    exclude = ["digest"]
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        for token in queryset:
            api_token_revoke(token=token)
        self.message_user(request, f"Revoked {queryset.count()} token(s).", messages.SUCCESS)


@admin.register(InstructionPreset)
class InstructionPresetAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Presets, a person's own; staff share one (a team's good instructions) with people and groups, who find it
    in New chat's and Settings' preset list, marked "(shared)"."""

    list_display = ["name", "owner", "created_at"]
    list_filter = ["groups"]
    search_fields = ["name", "text", "owner__username"]
    filter_horizontal = ["people", "groups"]
