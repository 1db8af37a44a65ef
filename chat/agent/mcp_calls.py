"""A reply's call of an MCP server's tool: what holds when it runs (the server still on in the workspace, the mode),
then the call, its answer as the outcome a result is inserted from. The server's listing at the time is kept."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chat.agent.mcp import McpAddress, McpListing, McpStopped, McpTimedOut, McpUnreachable, mcp_call
from chat.agent.model.cancel import Cancel
from chat.tools.context import ToolContext
from chat.tools.errors import one_line
from chat.tools.registry import parsed_arguments
from sessions_app.hygiene.config import ContextConfig
from sessions_app.hygiene.outcomes import ErrorOutcome, Outcome, OutputOutcome
from sessions_app.models import McpServer
from sessions_app.tool_names import split_name


@dataclass(frozen=True)
class McpPlanned:
    """A call to make: the server, how to reach it, the tool and its arguments; ``only_reading`` in plan mode."""

    server_id: int
    server: str
    address: McpAddress
    timeout: float
    name: str
    tool: str
    arguments: dict[str, Any]
    only_reading: bool
    mode: str


@dataclass(frozen=True)
class McpRefused:
    """A call not made: its arguments as parsed, and the one line it answers."""

    arguments: object
    outcome: ErrorOutcome


def mcp_address(server: McpServer, workspace: ToolContext) -> McpAddress:
    """Where ``server`` is; a command runs in ``workspace``'s sandbox."""
    if server.command.strip():
        return McpAddress(command=server.command, read_only=server.folders, workspace=workspace)
    return McpAddress(url=server.url, token=server.bearer_token)


def mcp_planned(name: str, raw_arguments: str, ctx: ToolContext, *, workspace_id: int) -> McpPlanned | McpRefused:
    """The call of ``name`` (``server__tool``, listed by the session) as it can be made now, or why it cannot."""
    split = split_name(name)
    assert split is not None
    server_name, tool = split
    config = ctx.config
    arguments, problem = parsed_arguments(name, raw_arguments, ctx)
    server = McpServer.objects.filter(workspace_id=workspace_id, name=server_name, enabled=True).first()
    if server is None:
        return McpRefused(arguments, ErrorOutcome(config.unavailable["mcp_off"].format(tool=name, server=server_name)))
    if problem is not None or not isinstance(arguments, dict):
        return McpRefused(arguments, ErrorOutcome(one_line(problem or config.error("not_object", tool=name))))
    return McpPlanned(
        server.pk,
        server_name,
        mcp_address(server, ctx),
        float(server.call_timeout),
        name,
        tool,
        arguments,
        only_reading=ctx.mode == "plan",
        mode=ctx.mode,
    )


async def mcp_outcome(
    planned: McpPlanned, *, config: ContextConfig, cancel: Cancel | None
) -> tuple[Outcome, McpListing | None]:
    """Make the call (Stop, ``cancel``, ends it); its outcome, and the server's listing where it answered."""
    unavailable = config.unavailable
    name, server = planned.name, planned.server
    try:
        answer = await mcp_call(
            planned.address,
            tool=planned.tool,
            arguments=planned.arguments,
            timeout=planned.timeout,
            only_reading=planned.only_reading,
            cancel=cancel,
        )
    except McpUnreachable as error:
        down = unavailable["mcp_down"].format(tool=name, server=server, detail=str(error))
        return ErrorOutcome(one_line(down)), None
    except McpTimedOut:
        return ErrorOutcome(config.error("mcp_timed_out", tool=name, seconds=f"{planned.timeout:g}")), None
    except McpStopped:
        return ErrorOutcome(config.error("mcp_stopped", tool=name)), None
    if answer.refused == "dropped":
        return ErrorOutcome(unavailable["mcp_dropped"].format(tool=name, server=server)), answer.listing
    if answer.refused == "read_only":
        refusal = unavailable["mcp_plan"].format(tool=name, server=server, mode=planned.mode)
        return ErrorOutcome(refusal), answer.listing
    if answer.is_error:
        return OutputOutcome(f"{config.error('mcp_tool_error', tool=name)}\n{answer.text}"), answer.listing
    return OutputOutcome(answer.text), answer.listing
