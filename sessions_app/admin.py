"""The admin: staff configure workspaces and endpoints, and see every stored session, result and request."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from sessions_app.hygiene import format_id, parse_id
from sessions_app.models import (
    ChatSession,
    Generation,
    ModelEndpoint,
    ModelRequest,
    Result,
    Step,
    Turn,
    Workspace,
)


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Stored history is shown, never edited; deleting stays with the owner's own session delete."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
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


@admin.register(Workspace)
class WorkspaceAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["name", "folder", "allow_commands", "allow_network"]
    filter_horizontal = ["members"]
    search_fields = ["name", "folder"]


@admin.register(ModelEndpoint)
class ModelEndpointAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["name", "base_url", "model", "context_window"]
    search_fields = ["name", "base_url", "model"]


class TurnInline(ReadOnlyInline):
    model = Turn
    fields = ["number", "status", "words", "reply_text", "error", "started_at"]


class GenerationInline(ReadOnlyInline):
    model = Generation
    fields = ["number", "model_name", "mode", "covers_through_turn", "taken_back", "created_at"]


@admin.register(ChatSession)
class ChatSessionAdmin(ReadOnlyAdmin):
    list_display = ["id", "title", "owner", "workspace", "model_name", "mode", "updated_at"]
    list_filter = ["owner", "workspace", "mode"]
    search_fields = ["title", "owner__username"]
    inlines = [GenerationInline, TurnInline]


@admin.register(Generation)
class GenerationAdmin(ReadOnlyAdmin):
    list_display = ["session", "number", "model_name", "mode", "covers_through_turn", "taken_back"]
    list_filter = ["taken_back"]


class StepInline(ReadOnlyInline):
    model = Step
    fields = ["number", "text", "reasoning", "tool_calls", "finish_reason"]


@admin.register(Turn)
class TurnAdmin(ReadOnlyAdmin):
    list_display = ["session", "number", "status", "short_words", "started_at"]
    list_filter = ["status", "session__owner"]
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
        "completion_tokens",
        "time_to_first_token",
        "total_time",
        "status",
    ]
    list_filter = ["kind", "break_cause", "status", "session__owner"]
    search_fields = ["model_name", "error"]
