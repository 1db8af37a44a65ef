"""Runs conformance case files (``docs/conformance.md``) through the reply loop the browser and ``ask`` use.

The case plays the model (:class:`CaseModel`): a tool step is the model calling that tool, a reply step its
text, a compact step its summary; undo, rewind, regenerate and compact are the loop's own actions, and a
request step shows what the loop would send next. The runner has no step logic of its own. Each case runs
in a fresh session and workspace folder, inside a transaction that is rolled back.
"""

from __future__ import annotations

import base64
import collections
import json
import os
import posixpath
import re
import shutil
import tempfile
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.db import transaction

from chat.agent.events import Compacted, ReplyEvent, RequestStarted, ResultStored, TurnEnded, TurnStarted
from chat.agent.images import attached_image
from chat.agent.loop import ReplyLoop, store
from chat.agent.mcp import McpTimedOut, McpUnreachable, mcp_listing
from chat.agent.mcp_calls import mcp_address
from chat.agent.model import Cancel, Completion, StreamPiece, TextPiece, ToolCall, ToolCallPiece
from chat.agent.uploads import UploadRefused, upload_write
from chat.agent.workspace import folder_context, sandbox_settings, session_tools
from chat.tools.sandbox import give_to_commands
from sessions_app import prompts
from sessions_app.errors import StoreError
from sessions_app.models import ChatSession, Generation, McpServer, ModelEndpoint, RequestKind, Workspace
from sessions_app.services.mcp import mcp_server_listed
from sessions_app.services.sessions import (
    session_model_switch,
    session_set_mode,
    session_settings_set,
    session_start,
)
from sessions_app.services.uploads import upload_record

ACTIONS = (
    "user",
    "tool",
    "reply",
    "change",
    "undo",
    "rewind",
    "regenerate",
    "compact",
    "set_mode",
    "set_date",
    "set_instructions",
    "attach",
    "retry_model",
    "request",
)
EXPECTATIONS = (
    "expect",
    "expect_first_line",
    "expect_contains",
    "expect_not_contains",
    "expect_full",
    "expect_roles",
    "expect_table",
)
DEFAULT_DATE = "2026-01-01"
MAX_STEPS = 100_000
MCP_NAME_FORMAT = re.compile(r"[a-z][a-z0-9-]{0,19}")
MCP_TIMEOUT = 30.0


class FormatError(Exception):
    """The file is not a conformance file; ``str()`` says where."""


@dataclass
class CaseResult:
    name: str
    failure: str | None = None

    @property
    def line(self) -> str:
        return f"ok {self.name}" if self.failure is None else f"FAIL {self.name}: {self.failure}"


@dataclass
class StepText:
    text: str
    full: str | None = None
    roles: list[str] | None = None
    table: str | None = None


class StepFailure(Exception):
    pass


def load_cases(path: Path) -> list[dict[str, Any]]:
    """The cases of a file, checked for the format; ``FormatError`` otherwise."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise FormatError(f"{path}: {error}") from error
    if not isinstance(data, dict) or data.get("format") != 1 or not isinstance(data.get("cases"), list):
        raise FormatError(f'{path}: not a conformance file (needs "format": 1 and a "cases" list)')
    names: set[str] = set()
    for index, case in enumerate(data["cases"], start=1):
        if not isinstance(case, dict) or not isinstance(case.get("name"), str):
            raise FormatError(f"{path}: case {index} has no name")
        if case["name"] in names:
            raise FormatError(f"{path}: case name {case['name']!r} is used twice")
        names.add(case["name"])
        where = f"{path}: case {case['name']!r}"
        _check_workspace(where, case.get("workspace", {}))
        if not isinstance(case.get("config", {}), dict):
            raise FormatError(f"{where}: config must be an object")
        if "window" in case and not (_is_count(case["window"]) and case["window"] > 0):
            raise FormatError(f"{where}: window must be a whole number of tokens, at least 1")
        if not isinstance(case.get("images", False), bool):
            raise FormatError(f"{where}: images must be true or false")
        _check_mcp(where, case.get("mcp", {}))
        steps = case.get("steps")
        if not isinstance(steps, list) or not steps:
            raise FormatError(f"{where} has no steps")
        for number, step in enumerate(steps, start=1):
            actions = [key for key in ACTIONS if isinstance(step, dict) and key in step]
            if len(actions) != 1:
                raise FormatError(f"{where} step {number} needs exactly one action")
            _check_expectations(f"{where} step {number}", step)
    cases: list[dict[str, Any]] = data["cases"]
    return cases


TEXT_EXPECTATIONS = frozenset({"expect", "expect_first_line", "expect_full", "expect_table"})


def _check_expectations(where: str, step: Mapping[str, Any]) -> None:
    """Refuse an expectation the format does not know, or of the wrong type: it would never be checked."""
    for key, value in step.items():
        if not key.startswith("expect"):
            continue
        if key not in EXPECTATIONS:
            raise FormatError(f"{where}: unknown expectation {key!r}")
        if key in TEXT_EXPECTATIONS:
            if not isinstance(value, str):
                raise FormatError(f"{where}: {key} must be a string")
        elif not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise FormatError(f"{where}: {key} must be a list of strings")


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_workspace(where: str, files: Any) -> None:
    """A workspace is an object of relative paths, each a text, ``{"lines": N}``, ``{"symlink": T}`` or
    ``{"base64": B}`` (the file's bytes: a document, a binary file)."""
    if not isinstance(files, dict):
        raise FormatError(f"{where}: workspace must be an object")
    for relative, spec in files.items():
        parts = Path(relative).parts
        if not relative or Path(relative).is_absolute() or ".." in parts:
            raise FormatError(f"{where}: workspace path {relative!r} must be relative and stay inside")
        if isinstance(spec, str):
            continue
        if isinstance(spec, dict) and _is_count(spec.get("lines")) and isinstance(spec.get("line", ""), str):
            continue
        if isinstance(spec, dict) and isinstance(spec.get("symlink"), str):
            continue
        if isinstance(spec, dict) and isinstance(spec.get("base64"), str) and _is_base64(spec["base64"]):
            continue
        raise FormatError(f"{where}: workspace entry {relative!r} is not a text, lines, symlink or base64")


def _check_mcp(where: str, servers: Any) -> None:
    """``mcp`` names scripted MCP servers: each an object with ``tools`` (a list of objects with a ``name``, and
    optionally ``description``, ``read_only``, ``answer`` and ``error``) and optionally ``instructions``."""
    if not isinstance(servers, dict):
        raise FormatError(f"{where}: mcp must be an object of servers by name")
    for name, server in servers.items():
        tools = server.get("tools") if isinstance(server, dict) else None
        if not MCP_NAME_FORMAT.fullmatch(str(name)) or not isinstance(tools, list):
            raise FormatError(f"{where}: mcp server {name!r} needs a lowercase name and a list of tools")
        if not isinstance(server.get("instructions", ""), str):
            raise FormatError(f"{where}: mcp server {name!r}: instructions must be a text")
        for tool in tools:
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or not tool["name"]:
                raise FormatError(f"{where}: mcp server {name!r}: each tool needs a name")


def _mcp_servers(folder: Path, servers: Mapping[str, Any], workspace: Workspace) -> None:
    """The case's scripted MCP servers, each a command in the workspace's sandbox, asked for their tools now."""
    scripts = folder / "mcp"
    scripts.mkdir(mode=0o755)
    shutil.copyfile(Path(__file__).with_name("mcp_scripted.py"), scripts / "mcp_scripted.py")
    context = folder_context(workspace)
    for name, server in servers.items():
        (scripts / f"{name}.json").write_text(json.dumps({"name": name, **server}), encoding="utf-8")
        command = f"exec python3 -I {scripts}/mcp_scripted.py {scripts}/{name}.json"
        row = McpServer.objects.create(workspace=workspace, name=name, command=command, read_only_folders=str(scripts))
        try:
            listing = async_to_sync(mcp_listing)(mcp_address(row, context), timeout=MCP_TIMEOUT)
        except (McpUnreachable, McpTimedOut) as error:
            raise FormatError(f"the MCP server {name} did not answer: {error or 'no answer in time'}") from None
        mcp_server_listed(server_id=row.pk, tools_json=listing.as_json(), instructions=listing.instructions)
    for path in (scripts, *scripts.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)


def _is_base64(text: str) -> bool:
    try:
        base64.b64decode(text, validate=True)
    except ValueError:
        return False
    return True


def _make_workspace(root: Path, files: Mapping[str, Any]) -> None:
    for relative, spec in files.items():
        target = root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(spec, str):
            target.write_bytes(spec.encode("utf-8"))
        elif isinstance(spec, dict) and "lines" in spec:
            pattern = str(spec.get("line", "line {n}"))
            target.write_bytes(
                "".join(pattern.replace("{n}", str(n)) + "\n" for n in range(1, int(spec["lines"]) + 1)).encode()
            )
        elif isinstance(spec, dict) and "symlink" in spec:
            os.symlink(str(spec["symlink"]).replace("{root}", str(root)), target)
        elif isinstance(spec, dict) and "base64" in spec:
            target.write_bytes(base64.b64decode(spec["base64"]))
        else:
            raise FormatError(f"workspace entry {relative!r} is not a text, lines, symlink or base64")


def _substitute(value: Any, root: str) -> Any:
    if isinstance(value, str):
        return value.replace("{root}", root)
    if isinstance(value, list):
        return [_substitute(item, root) for item in value]
    if isinstance(value, dict):
        return {key: _substitute(item, root) for key, item in value.items()}
    return value


def render_request(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
    """A request as the case format shows it: ``[tools] …``, then each message under ``[ROLE]``."""
    lines = ["[tools] " + " ".join(tool["function"]["name"] for tool in tools)]
    for message in messages:
        lines.append(f"[{message['role']}]")
        content = message.get("content")
        if isinstance(content, list):
            lines.extend(_part(part) for part in content)
        elif content:
            lines.append(str(content))
        for call in message.get("tool_calls", []):
            lines.append(f"[call {call['function']['name']}] {call['function']['arguments']}")
    return "\n".join(lines)


def _part(part: Mapping[str, Any]) -> str:
    """A part of a message's content: a text as it is, an image as ``[image TYPE, N bytes]``."""
    if part.get("type") != "image_url":
        return str(part.get("text", ""))
    head, _, data = str(part["image_url"]["url"]).partition(",")
    media_type = head.removeprefix("data:").removesuffix(";base64")
    return f"[image {media_type}, {len(base64.b64decode(data))} bytes]"


def _strip(text: str) -> str:
    return text.rstrip("\n")


def check(step: Mapping[str, Any], got: StepText) -> str | None:
    """The first expectation of ``step`` that ``got`` fails, said as ``expected … got …``."""
    text = _strip(got.text)
    if "expect" in step and _strip(step["expect"]) != text:
        return f"expected {step['expect']!r} got {got.text!r}"
    if "expect_first_line" in step:
        first = text.split("\n", 1)[0]
        if _strip(step["expect_first_line"]) != first:
            return f"expected first line {step['expect_first_line']!r} got {first!r}"
    for needle in step.get("expect_contains", []):
        if needle not in got.text:
            return f"expected text containing {needle!r} got {got.text!r}"
    for needle in step.get("expect_not_contains", []):
        if needle in got.text:
            return f"expected text without {needle!r} got {got.text!r}"
    if "expect_full" in step:
        full = _strip(got.full if got.full is not None else "")
        if _strip(step["expect_full"]) != full:
            return f"expected full text {step['expect_full']!r} got {got.full!r}"
    if "expect_roles" in step and step["expect_roles"] != got.roles:
        return f"expected roles {step['expect_roles']!r} got {got.roles!r}"
    if "expect_table" in step:
        table = _strip(got.table or "")
        if _strip(step["expect_table"]) != table:
            return f"expected table {step['expect_table']!r} got {got.table!r}"
    return None


@dataclass(frozen=True)
class _Answer:
    """What the model says next: text, or one tool call with its arguments as the case wrote them."""

    text: str = ""
    call: tuple[str, str] | None = None


class _CaseAnswer:
    """One scripted answer, streamed as a server would: the text, then the call. The answer is taken from the
    case when it is read, not when it is asked for: the loop sends the next request before it yields the
    results of the step before, and the case gives the next answer only once it has seen them."""

    def __init__(self, model: CaseModel, prompt_tokens: int) -> None:
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.completion: Completion | None = None

    def start(self) -> None:
        pass

    async def aclose(self) -> None:
        pass

    async def __aiter__(self) -> AsyncGenerator[StreamPiece, None]:
        answer, call_id = self.model.next_answer()
        calls: list[ToolCall] = []
        if answer.text:
            yield TextPiece(answer.text)
        if answer.call is not None:
            name, arguments = answer.call
            calls.append(ToolCall(index=0, id=call_id, name=name, arguments=arguments))
            yield ToolCallPiece(0, name)
        self.completion = Completion(
            text=answer.text,
            reasoning="",
            tool_calls=calls,
            finish_reason="tool_calls" if calls else "stop",
            prompt_tokens=self.prompt_tokens,
            cached_tokens=None,
            completion_tokens=None,
            usage=None,
            timings=None,
            time_to_first_token=None,
            total_time=0.0,
            model=None,
        )


CASE_WINDOW = 2_000_000_000  # the runner's model has no context window to pass, unless a case gives one
CASE_BYTES_PER_TOKEN = 4  # the runner's model counts a prompt of N bytes as N / 4 tokens, rounded up


class CaseModel:
    """The case plays the model: each answer is given before the loop asks for it."""

    url = "conformance:"

    def __init__(self) -> None:
        self.answers: collections.deque[_Answer] = collections.deque()
        self.calls = 0

    def stream(self, body: bytes, *, cancel: Cancel) -> _CaseAnswer:
        return _CaseAnswer(self, -(-len(body) // CASE_BYTES_PER_TOKEN))

    def next_answer(self) -> tuple[_Answer, str]:
        """The case's next answer, with the id its call (if any) gets."""
        if not self.answers:
            raise StepFailure("the reply loop asked the model, but the case says nothing more")
        answer = self.answers.popleft()
        if answer.call is not None:
            self.calls += 1
        return answer, f"call_{self.calls}"


@dataclass
class CaseRun:
    """One case played through the reply loop: ``running`` is the action the case is in the middle of."""

    case: Mapping[str, Any]
    root: Path
    session: ChatSession
    model: CaseModel
    loop: ReplyLoop
    running: AsyncGenerator[ReplyEvent, None] | None = None
    reply_open: bool = False

    async def _next(self) -> ReplyEvent | None:
        assert self.running is not None
        try:
            event = await anext(self.running)
        except StopAsyncIteration:
            self.running = None
            self.reply_open = False
            return None
        if isinstance(event, TurnStarted | TurnEnded):
            self.reply_open = isinstance(event, TurnStarted)
        return event

    async def _until(self, *kinds: type[ReplyEvent]) -> ReplyEvent | None:
        """Go on with the running action to its next event of ``kinds``; ``None`` when it ends first."""
        while self.running is not None:
            event = await self._next()
            if isinstance(event, kinds):
                return event
        return None

    async def _finish(self) -> list[ReplyEvent]:
        """Run the running action to its end (the lock it holds goes with it)."""
        events: list[ReplyEvent] = []
        while self.running is not None:
            event = await self._next()
            if event is not None:
                events.append(event)
        return events

    async def _start(self, action: AsyncGenerator[ReplyEvent, None]) -> None:
        await self._end_open_reply()
        self.running = action

    async def _end_open_reply(self) -> None:
        """An open reply is first ended with empty text."""
        if self.running is not None:
            if self.reply_open:
                self.model.answers.append(_Answer(text=""))
            await self._finish()

    async def _ensure_reply(self) -> None:
        if not self.reply_open:
            await self._start(self.loop.send("go"))
            await self._until(TurnStarted)

    async def close(self) -> None:
        if self.running is not None:
            await self.running.aclose()
            self.running = None
            self.reply_open = False

    async def step(self, step: Mapping[str, Any]) -> StepText:
        if "user" in step:
            await self._start(self.loop.send(str(step["user"])))
            started = await self._until(TurnStarted)
            assert isinstance(started, TurnStarted)
            return StepText(started.turn.message)
        if "tool" in step:
            return await self._tool(str(step["tool"]), step.get("args", {}))
        if "reply" in step:
            await self._ensure_reply()
            self.model.answers.append(_Answer(text=str(step["reply"])))
            ended = await self._until(TurnEnded)
            await self._finish()
            assert isinstance(ended, TurnEnded)
            return StepText(await store(lambda: ended.turn.reply_text))
        if "change" in step:
            return await store(self._change, step["change"])
        if "undo" in step:
            await self._start(self.loop.undo())
            await self._finish()
            return StepText("")
        if "rewind" in step:
            await self._start(self.loop.rewind(int(step["rewind"])))
            await self._finish()
            return StepText("")
        if "regenerate" in step:
            await self._start(self.loop.regenerate())
            started = await self._until(TurnStarted)
            assert isinstance(started, TurnStarted)
            return StepText(started.turn.message)
        if "compact" in step:
            summary = _Answer(text=str(step["compact"]))
            generation = await self._compacted_in_reply(summary) if self.reply_open else None
            if generation is None:
                await self._start(self.loop.compact())
                self.model.answers.append(summary)
                compacted = [event for event in await self._finish() if isinstance(event, Compacted)]
                generation = compacted[0].generation
            return StepText(generation.system_prompt, table=generation.table)
        if "set_mode" in step:
            await store(session_set_mode, session=self.session, mode=str(step["set_mode"]))
            return StepText("")
        if "set_date" in step:
            self.loop.date = str(step["set_date"])
            return StepText("")
        if "set_instructions" in step:
            self.session = await store(
                session_settings_set,
                session=self.session,
                instructions=str(step["set_instructions"]),
                temperature=self.session.temperature,
                max_tokens=self.session.max_tokens,
            )
            return StepText("")
        if "attach" in step:
            return await store(self._attach, step["attach"])
        if "retry_model" in step:
            await self._end_open_reply()
            self.session = await store(self._model_switched, str(step["retry_model"]))
            await self._start(self.loop.regenerate())
            started = await self._until(TurnStarted)
            assert isinstance(started, TurnStarted)
            return StepText(started.turn.message)
        if "request" in step:
            built = await store(self.loop.next_request)
            return StepText(render_request(built.messages, built.tools), roles=[m["role"] for m in built.messages])
        raise StepFailure("no action")

    def _model_switched(self, model_name: str) -> ChatSession:
        return session_model_switch(session=self.session, endpoint=self.session.endpoint, model_name=model_name)

    async def _compacted_in_reply(self, summary: _Answer) -> Generation | None:
        """Where the open reply's next request asks for a summary (it would not fit the window, so the reply is
        compacted while it runs), answer it, and go on until the reply's next request is sent from the new
        generation; ``None`` where it asks for the next step, the reply still open."""
        started = await self._until(RequestStarted)
        if not isinstance(started, RequestStarted) or started.request.kind != RequestKind.COMPACTION:
            return None
        self.model.answers.append(summary)
        compacted = await self._until(Compacted)
        if not isinstance(compacted, Compacted):
            raise StepFailure("the compaction inside the reply made no new generation")
        await self._until(RequestStarted)
        return compacted.generation

    async def _tool(self, name: str, args: Any) -> StepText:
        await self._ensure_reply()
        self.model.answers.append(_Answer(call=(name, json.dumps(args, ensure_ascii=False))))
        stored = await self._until(ResultStored)
        if not isinstance(stored, ResultStored):
            raise StepFailure(f"the call to {name} stored no result")
        return StepText(stored.result.inserted_text, full=stored.result.full_text)

    def _attach(self, attached: Mapping[str, Any]) -> StepText:
        """The person attaches a file, written and recorded as Attach does: the next message's note says it."""
        folder, name = posixpath.split(str(attached["path"]))
        content = attached.get("content", "")
        data = base64.b64decode(content["base64"]) if isinstance(content, Mapping) else str(content).encode("utf-8")
        try:
            done = upload_write(self.session, name=name, data=data, folder=folder, replace=True)
        except UploadRefused as refused:
            raise StepFailure(f"the attachment was refused: {refused}") from None
        image = attached_image(done.path, data)
        upload_record(session=self.session, path=done.path, size=done.size, sha256=done.sha256, image=image)
        return StepText(done.path)

    def _change(self, change: Mapping[str, Any]) -> StepText:
        target = self.root / str(change["path"])
        where = os.path.realpath(target.parent) if change.get("delete") else os.path.realpath(target)
        if where != str(self.root) and not where.startswith(str(self.root) + os.sep):
            raise StepFailure(f"change of {change['path']!r} would touch {where}, outside the workspace")
        if change.get("delete"):
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(str(change["content"]).encode("utf-8"))
        return StepText("")


async def _played(run: CaseRun, steps: list[Mapping[str, Any]], root: str) -> str | None:
    """Play the case's steps through the reply loop (its store calls on the caller's thread, inside the case's
    transaction); the first failure, said as the case's result says it."""
    try:
        for number, step in enumerate(steps, start=1):
            step = _substitute(step, root)
            try:
                got = await run.step(step)
            except StoreError as error:
                run.running, run.reply_open = None, False
                got = StepText(str(error))
            except StepFailure as error:
                return f"step {number}: {error}"
            failure = check(step, got)
            if failure is not None:
                return f"step {number}: {failure}"
        return None
    finally:
        await run.close()


CASE_WORKSPACE = "workspace"


def _case_workspace(root: Path, *, commands: bool, user: Any) -> Workspace:
    """The case's workspace, always named ``workspace`` so the first message's note is the same bytes in every
    run: a real workspace of that name is renamed inside the case's transaction, which is rolled back. Its folder
    is a temporary one the runner (a command of the server's shell) made, so it may lie outside the roots; the
    runner's user is its one member."""
    for existing in Workspace.objects.select_for_update().filter(name=CASE_WORKSPACE):
        existing.name = f"{CASE_WORKSPACE}-{existing.pk}-kept"
        existing.save(update_fields=["name"])
    workspace = Workspace.objects.create(
        name=CASE_WORKSPACE, folder=str(root), allow_commands=commands, from_shell=True
    )
    workspace.members.add(user)
    return workspace


def _user() -> Any:
    users = get_user_model()
    user, _ = users.objects.get_or_create(username="conformance-runner", defaults={"is_active": False})
    return user


def run_case(case: Mapping[str, Any]) -> CaseResult:
    """Run one case in a fresh session and workspace, rolled back afterwards."""
    name = str(case["name"])
    folder = Path(tempfile.mkdtemp(prefix="cachet-case-")).resolve()
    root = folder / "ws"
    root.mkdir()
    outcome = CaseResult(name)
    try:
        _make_workspace(root, _substitute(case.get("workspace", {}), str(root)))
        if case.get("commands", False) or case.get("mcp"):
            folder.chmod(0o711)  # as root, commands run as the sandbox user, who must reach the workspace
            give_to_commands(str(root), sandbox_settings(), prompts.rules_config())
        config = prompts.rules_config(case.get("config"))
        with transaction.atomic():
            try:
                owner = _user()
                workspace = _case_workspace(root, commands=bool(case.get("commands", False)), user=owner)
                endpoint, _ = ModelEndpoint.objects.get_or_create(
                    name="conformance",
                    defaults={
                        "base_url": "http://127.0.0.1:9/v1",
                        "model": "conformance",
                        "context_window": CASE_WINDOW,
                    },
                )
                window = int(case.get("window", CASE_WINDOW))
                if endpoint.window != window:
                    endpoint.context_window, endpoint.server_context_window = window, None
                    endpoint.save(update_fields=["context_window", "server_context_window"])
                endpoint.reads_images, endpoint.server_reads_images = bool(case.get("images", False)), None
                endpoint.save(update_fields=["reads_images", "server_reads_images"])
                if case.get("mcp"):
                    _mcp_servers(folder, case["mcp"], workspace)
                session = session_start(
                    owner=owner,
                    workspace=workspace,
                    endpoint=endpoint,
                    model_name="conformance",
                    tools=session_tools(workspace, config=config),
                    mode=str(case.get("mode", "edit")),
                    instructions=str(case.get("instructions", "")),
                )
                model = CaseModel()
                loop = ReplyLoop(
                    session,
                    model=model,
                    config=config,
                    date=str(case.get("date", DEFAULT_DATE)),
                    max_steps=MAX_STEPS,
                    titles=False,  # a case scripts every request; a title is no rule of the spec
                )
                run = CaseRun(case=case, root=root, session=session, model=model, loop=loop)
                outcome.failure = async_to_sync(_played)(run, case["steps"], str(root))
            finally:
                transaction.set_rollback(True)
    except FormatError as error:
        outcome.failure = f"setup: {error}"
    except Exception as error:  # a crash fails the case and the run goes on
        outcome.failure = f"error: {type(error).__name__}: {error}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return outcome
