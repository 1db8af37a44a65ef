"""The tools the model uses on a session's workspace folder. Each answers an outcome of
``sessions_app.hygiene.outcomes``; ids, brackets and caps are the rules' business, not theirs."""

from __future__ import annotations

from .context import Sandbox, ToolContext
from .edits import edit, multiedit, write
from .errors import ToolError
from .listing import list_
from .patch import apply_patch
from .paths import resolve_in_workspace
from .read import read
from .recall import recall
from .registry import (
    MODE_CATEGORIES,
    TOOLS,
    TOOLS_BY_NAME,
    Tool,
    call_tool,
    listed_names,
    offered,
    only_reads,
    tool_list,
)
from .run import run
from .search import glob, grep

__all__ = [
    "MODE_CATEGORIES",
    "TOOLS",
    "TOOLS_BY_NAME",
    "Sandbox",
    "Tool",
    "ToolContext",
    "ToolError",
    "apply_patch",
    "call_tool",
    "edit",
    "glob",
    "grep",
    "list_",
    "listed_names",
    "multiedit",
    "offered",
    "only_reads",
    "read",
    "recall",
    "resolve_in_workspace",
    "run",
    "tool_list",
    "write",
]
