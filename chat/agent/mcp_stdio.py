"""An MCP server that runs as a command, for the SDK's client: started in the workspace's sandbox as ``run``'s
commands are (``chat.tools.sandbox``: bubblewrap, the sandbox user, its limits, the workspace's network setting),
speaking MCP on its standard input and output, one JSON-RPC message a line. It lives for one listing or one call;
when the client is done it is killed with everything it started, and the workspace is walked once more (its quota
kept, a git folder it made disarmed), as after ``run``."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

import anyio
from asgiref.sync import sync_to_async

from chat.tools.context import ToolContext
from chat.tools.run import command_workspace
from chat.tools.sandbox import sandboxed

LINE_LIMIT = 16 << 20  # the longest message a server may write, in bytes
ERRORS_KEPT = 4096


@contextlib.asynccontextmanager
async def sandboxed_stdio(
    command: str, ctx: ToolContext, *, read_only: tuple[str, ...] = (), ended: list[str] | None = None
) -> AsyncIterator[object]:
    """The transport streams (read, write) of ``command`` run in the sandbox of ``ctx``'s workspace; where the
    command ends its output, the last line it wrote to its errors is added to ``ended``."""
    import mcp_types as types
    from mcp.shared.message import SessionMessage

    stack = contextlib.ExitStack()
    fds: list[int] = []
    try:
        in_read, in_write = os.pipe()
        out_read, out_write = os.pipe()
        errors = os.memfd_create("cachet-mcp-errors", os.MFD_CLOEXEC)
        fds += [in_read, in_write, out_read, out_write, errors]
        opened = await sync_to_async(stack.enter_context, thread_sensitive=False)(command_workspace(ctx))
        workspace, _ = opened
        running = sandboxed(
            command, workspace, out_write, ctx, input_pipe=(in_read, in_write), errors_fd=errors, read_only=read_only
        )
        await sync_to_async(stack.enter_context, thread_sensitive=False)(running)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await sync_to_async(stack.close, thread_sensitive=False)()
        for fd in fds:
            os.close(fd)
        raise
    for fd in (in_read, out_write):
        os.close(fd)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=LINE_LIMIT)
    out_pipe = os.fdopen(out_read, "rb", buffering=0)
    in_pipe = os.fdopen(in_write, "wb", buffering=0)
    read_transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), out_pipe)
    write_transport, _ = await loop.connect_write_pipe(asyncio.Protocol, in_pipe)
    incoming_writer, incoming = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    outgoing, outgoing_reader = anyio.create_memory_object_stream[SessionMessage](0)

    async def from_server() -> None:
        async with incoming_writer:
            while line := await reader.readline():
                if not line.strip():
                    continue
                try:
                    message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                except ValueError as error:
                    await incoming_writer.send(error)
                    continue
                await incoming_writer.send(SessionMessage(message))
            if ended is not None:
                ended.append(_last_error_line(errors))

    async def to_server() -> None:
        async with outgoing_reader:
            async for message in outgoing_reader:
                data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                write_transport.write(data.encode() + b"\n")

    try:
        async with anyio.create_task_group() as pumps:
            pumps.start_soon(from_server)
            pumps.start_soon(to_server)
            try:
                yield incoming, outgoing
            finally:
                pumps.cancel_scope.cancel()
    finally:
        write_transport.close()
        read_transport.close()
        with anyio.CancelScope(shield=True):
            await sync_to_async(stack.close, thread_sensitive=False)()
        os.close(errors)


def _last_error_line(fd: int) -> str:
    size = os.fstat(fd).st_size
    data = os.pread(fd, ERRORS_KEPT, max(0, size - ERRORS_KEPT))
    lines = [line for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "the command ended"
