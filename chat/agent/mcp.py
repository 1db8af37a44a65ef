"""Tools from MCP servers, through the official SDK (``mcp``): a server's listing (its tools and instructions) and
one call, each over a connection of its own (to the server's streamable-HTTP endpoint, or to its command started
in the workspace's sandbox: ``mcp_stdio``), bounded in time and ended by Stop. Async: the worker awaits them."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from chat.agent.mcp_stdio import sandboxed_stdio
from chat.agent.model.cancel import Cancel
from chat.tools.context import ToolContext
from sessions_app.tool_names import offered_name


@dataclass(frozen=True)
class McpTool:
    """A tool as the server lists it: its name, description, arguments' schema, and whether it says it only reads."""

    name: str
    description: str
    input_schema: dict[str, Any]
    read_only: bool


@dataclass(frozen=True)
class McpListing:
    """What a server said when asked: its tools, and its instructions (``""``: none)."""

    tools: tuple[McpTool, ...]
    instructions: str

    def as_json(self) -> str:
        return json.dumps([asdict(tool) for tool in self.tools], ensure_ascii=False, sort_keys=True)

    def tool(self, name: str) -> McpTool | None:
        return next((tool for tool in self.tools if tool.name == name), None)


@dataclass(frozen=True)
class McpAnswer:
    """A call's answer as text (``is_error``: the tool said it failed), and the server's listing at the time;
    ``refused``: the call was not made, the server no longer lists the tool (``dropped``) or does not mark it
    read-only where only reading is allowed (``read_only``)."""

    text: str
    is_error: bool
    listing: McpListing
    refused: str = ""


class McpUnreachable(Exception):
    """The server did not answer, or not as MCP; ``str()`` is one line that says how."""


class McpStopped(Exception):
    """Stop ended the call before the server answered."""


class McpTimedOut(Exception):
    """The call took longer than it may."""


def tools_of(tools_json: str) -> tuple[McpTool, ...]:
    """The tools a server's stored listing (:meth:`McpListing.as_json`) holds."""
    return tuple(McpTool(**tool) for tool in json.loads(tools_json or "[]"))


def tool_schema(server: str, tool: McpTool) -> dict[str, Any] | None:
    """The tool as a request's ``tools`` offers it; ``None`` where its name cannot be offered."""
    name = offered_name(server, tool.name)
    if name is None:
        return None
    schema = tool.input_schema if tool.input_schema.get("type") == "object" else {"type": "object", "properties": {}}
    description = f"(MCP server {server}) {tool.description}".strip()
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


@dataclass(frozen=True)
class McpAddress:
    """Where a server is: its streamable-HTTP ``url`` (with a bearer ``token``), or a ``command`` run in the
    sandbox of ``workspace``'s folder, the folders ``read_only`` bound read-only in it."""

    url: str = ""
    token: str = ""
    command: str = ""
    read_only: tuple[str, ...] = ()
    workspace: ToolContext | None = None


async def mcp_listing(address: McpAddress, *, timeout: float) -> McpListing:
    """Ask the server for its tools and instructions."""
    listing = await _connected(address, timeout, None, None)
    assert isinstance(listing, McpListing)
    return listing


async def mcp_call(
    address: McpAddress,
    *,
    tool: str,
    arguments: Mapping[str, Any],
    timeout: float,
    only_reading: bool = False,
    cancel: Cancel | None = None,
) -> McpAnswer:
    """Call ``tool`` (where ``only_reading``, only if the server marks it read-only); its answer as text. Raises
    :class:`McpUnreachable`, :class:`McpTimedOut` or :class:`McpStopped`."""
    answer = await _connected(address, timeout, _Call(tool, dict(arguments), only_reading), cancel)
    assert isinstance(answer, McpAnswer)
    return answer


@dataclass(frozen=True)
class _Call:
    tool: str
    arguments: dict[str, Any]
    only_reading: bool


async def _connected(address: McpAddress, timeout: float, call: _Call | None, cancel: Cancel | None) -> Any:
    """The session's answer within ``timeout``; Stop (``cancel``, set from any thread) ends it at once, as if its
    time were up, and says so."""
    loop = asyncio.get_running_loop()
    stopped = False
    try:
        async with asyncio.timeout(timeout) as limit:

            def stop() -> None:
                nonlocal stopped
                stopped = True
                loop.call_soon_threadsafe(limit.reschedule, loop.time())

            with cancel.hooked(stop) if cancel is not None else contextlib.nullcontext():
                return await _session(address, call)
    except TimeoutError:
        raise McpStopped() if stopped else McpTimedOut() from None


async def _session(address: McpAddress, call: _Call | None) -> McpListing | McpAnswer:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {address.token}"} if address.token else {}
    ended: list[str] = []
    try:
        async with contextlib.AsyncExitStack() as stack:
            if address.command:
                assert address.workspace is not None
                transport: Any = sandboxed_stdio(
                    address.command, address.workspace, read_only=address.read_only, ended=ended
                )
            else:
                http = await stack.enter_async_context(httpx2.AsyncClient(headers=headers))
                transport = streamable_http_client(address.url, http_client=http)
            client = await stack.enter_async_context(Client(transport, mode="legacy", cache=None))
            listed = await client.list_tools()
            listing = McpListing(tuple(_tool(tool) for tool in listed.tools), client.instructions or "")
            if call is None:
                return listing
            listed_tool = listing.tool(call.tool)
            if listed_tool is None:
                return McpAnswer("", False, listing, refused="dropped")
            if call.only_reading and not listed_tool.read_only:
                return McpAnswer("", False, listing, refused="read_only")
            result = await client.call_tool(call.tool, call.arguments)
            return McpAnswer(_text(result), bool(getattr(result, "is_error", False)), listing)
    except asyncio.CancelledError:
        raise
    except BaseException as error:  # the SDK's task groups raise groups of what went wrong
        current = asyncio.current_task()
        if current is not None and current.cancelling():  # the time is up, or Stop: a group holding the cancel
            raise asyncio.CancelledError() from None
        raise McpUnreachable(f"its command ended: {ended[0]}" if ended else _reason(error)) from None


def _tool(tool: Any) -> McpTool:
    annotations = tool.annotations
    read_only = bool(annotations is not None and annotations.read_only_hint)
    return McpTool(tool.name, tool.description or "", dict(tool.input_schema or {}), read_only)


def _text(result: Any) -> str:
    """A call's content as text: each text block as it is; an image or audio named, not shown; a resource by its
    text or its address; structured content alone as JSON."""
    parts: list[str] = []
    for block in getattr(result, "content", None) or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind} {block.mime_type}, not shown]")
        elif kind == "resource":
            resource = block.resource
            parts.append(getattr(resource, "text", None) or f"[resource {resource.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource {block.uri}]")
    structured = getattr(result, "structured_content", None)
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False))
    return "\n".join(parts)


def _reason(error: BaseException) -> str:
    """One line for what went wrong, the innermost cause of a group."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    detail = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {detail}" if detail else type(error).__name__
