"""The context-hygiene rules as pure Python: no Django, no I/O, no clock."""

from __future__ import annotations

from .cap import cap_text, is_over_cap
from .config import CapLimits, ContextConfig, context_config, deep_merge
from .dedupe import READ_KINDS, Kind, PriorResult, args_key, newest_same_listing
from .edits import last_seen_sha, render_edit, unannounced_reads
from .ids import format_id, parse_id
from .lines import count_lines, line_window
from .notes import (
    NOTHING_STATED,
    ComposedMessage,
    StatedContext,
    UploadedFile,
    compose_message,
    restated_message,
    size_text,
    stated_after,
)
from .outcomes import (
    EditOutcome,
    ErrorOutcome,
    FileChange,
    ListingOutcome,
    Outcome,
    OutputOutcome,
    ReadOutcome,
    RecallOutcome,
)
from .reads import containing_read, render_read
from .recall import render_recall
from .render import render_result
from .rendered import Rendered
from .table import TableRead, compaction_table, system_prompt_with_summary

__all__ = [
    "NOTHING_STATED",
    "READ_KINDS",
    "CapLimits",
    "ComposedMessage",
    "ContextConfig",
    "EditOutcome",
    "ErrorOutcome",
    "FileChange",
    "Kind",
    "ListingOutcome",
    "Outcome",
    "OutputOutcome",
    "PriorResult",
    "ReadOutcome",
    "RecallOutcome",
    "Rendered",
    "StatedContext",
    "TableRead",
    "UploadedFile",
    "args_key",
    "cap_text",
    "compaction_table",
    "compose_message",
    "containing_read",
    "context_config",
    "count_lines",
    "deep_merge",
    "format_id",
    "is_over_cap",
    "last_seen_sha",
    "line_window",
    "newest_same_listing",
    "parse_id",
    "render_edit",
    "render_read",
    "render_recall",
    "render_result",
    "restated_message",
    "size_text",
    "stated_after",
    "system_prompt_with_summary",
    "unannounced_reads",
]
