"""The tool table, the list offered to the model, and one call: arguments parsed, mode checked, run."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sessions_app.hygiene.config import ContextConfig
from sessions_app.hygiene.outcomes import ErrorOutcome, Outcome

from .context import ToolContext
from .edits import edit, multiedit, write
from .errors import ToolError, one_line, shown
from .listing import list_
from .patch import apply_patch
from .read import read
from .recall import recall
from .run import run
from .schemas import SchemaValues, tool_schemas
from .search import glob, grep

Category = Literal["read", "write", "command"]
ToolFunction = Callable[[Mapping[str, object], ToolContext], Outcome]


@dataclass(frozen=True)
class Tool:
    """A tool: its name, what runs it, and its category. Its schema is ``loop.json``'s (:mod:`.schemas`)."""

    name: str
    function: ToolFunction
    category: Category


TOOLS: tuple[Tool, ...] = (
    Tool("read", read, "read"),
    Tool("list", list_, "read"),
    Tool("glob", glob, "read"),
    Tool("grep", grep, "read"),
    Tool("recall", recall, "read"),
    Tool("edit", edit, "write"),
    Tool("multiedit", multiedit, "write"),
    Tool("write", write, "write"),
    Tool("apply_patch", apply_patch, "write"),
    Tool("run", run, "command"),
)
TOOLS_BY_NAME: dict[str, Tool] = {tool.name: tool for tool in TOOLS}
MODE_CATEGORIES: dict[str, frozenset[Category]] = {
    "plan": frozenset({"read"}),
    "edit": frozenset({"read", "write"}),
    "full": frozenset({"read", "write", "command"}),
}


def only_reads(name: str) -> bool:
    """Whether a call of ``name`` can change nothing outside the store (a known tool of the read category)."""
    tool = TOOLS_BY_NAME.get(name)
    return tool is not None and tool.category == "read"


def offered(*, allow_commands: bool) -> tuple[Tool, ...]:
    """The tools a session offers, in their fixed order; ``run`` only where commands are allowed."""
    return tuple(tool for tool in TOOLS if tool.category != "command" or allow_commands)


def tool_list(*, allow_commands: bool, config: ContextConfig | None = None) -> list[dict[str, Any]]:
    """The schemas of the tools a session offers, for the request's ``tools``, in a fixed order: ``loop.json``'s,
    with the windows of ``config`` (default: ``loop.json``'s own) and the loop's ``run`` timeouts."""
    from sessions_app import prompts  # here: chat.tools imports no Django (a sandbox user's Python imports it)

    config = config or prompts.rules_config()
    loop = prompts.loop_settings()
    values = SchemaValues(config.read_window, config.recall_window, loop.run_timeout, loop.run_max_timeout)
    schemas = tool_schemas(config.tools, values)
    return [schemas[tool.name].offered() for tool in offered(allow_commands=allow_commands)]


def listed_names(tools: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """The names of the tools in a ``tools`` list as the request sends it, in its order."""
    return tuple(str(tool["function"]["name"]) for tool in tools)


def call_tool(name: str, raw_arguments: str, ctx: ToolContext) -> tuple[object, Outcome]:
    """Run one call: (its arguments parsed, or the raw string when not JSON; its outcome).

    A tool the session does not list is unknown; one it lists whose requirement is not met now (a mode
    that forbids it, a workspace whose commands were switched off) answers its ``unavailable`` text.
    """
    arguments, problem = parsed_arguments(name, raw_arguments, ctx)
    config = ctx.config
    tool = TOOLS_BY_NAME.get(name)
    if tool is None or name not in ctx.tools:
        names = ", ".join(ctx.tools)
        return arguments, ErrorOutcome(one_line(config.error("unknown_tool", tool=name, tools=names)))
    if tool.category == "command" and not ctx.allow_commands:
        return arguments, ErrorOutcome(one_line(config.unavailable["commands_off"].format(tool=name)))
    if tool.category not in MODE_CATEGORIES.get(ctx.mode, frozenset({"read"})):
        return arguments, ErrorOutcome(one_line(config.unavailable[name].format(mode=ctx.mode)))
    if problem is not None or not isinstance(arguments, dict):
        return arguments, ErrorOutcome(one_line(problem or config.error("not_object", tool=name)))
    try:
        outcome = tool.function(arguments, ctx)
    except ToolError as error:
        return arguments, ErrorOutcome(one_line(error.message))
    except OSError as error:
        message = config.error("os_error", path=_error_path(error, ctx), detail=error.strerror or error)
        return arguments, ErrorOutcome(one_line(message))
    return arguments, outcome


def _error_path(error: OSError, ctx: ToolContext) -> str:
    filename = error.filename
    if isinstance(filename, str | bytes):
        return shown(os.fsdecode(filename))
    return shown(ctx.root)


def parsed_arguments(name: str, raw_arguments: str, ctx: ToolContext) -> tuple[object, str | None]:
    """A call's arguments parsed as JSON (empty: ``{}``), or the raw string and why it is not JSON."""
    if not raw_arguments.strip():
        return {}, None
    try:
        return json.loads(raw_arguments), None
    except (json.JSONDecodeError, RecursionError) as error:
        return raw_arguments, ctx.config.error("bad_json", tool=name, detail=error)
