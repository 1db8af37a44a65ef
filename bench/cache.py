"""Benchmark: what Cachet's requests cost a real llama.cpp server, against the physical minimum and the way
other harnesses ("peers") send the same conversation, per chat-template shape and with sessions sharing a slot.

How the conversation is made. The generated test model answers noise, so it cannot choose tool calls. The
reference session therefore runs through Cachet's real reply loop and store (``ReplyLoop``: real tools on a real
workspace folder, real Postgres, real HTTP) against the project's scripted server, which plays the model's
decisions (reasoning, tool calls, answers) step by step. Every request Cachet sent is kept byte for byte; then
the same bodies are sent, in order, to llama.cpp (xllamacpp, in-process, ``--jinja``, one slot, one generated
token per request). llama.cpp keeps a prompt, not what it generated after it, when the next request differs
there, so it processes exactly what it would have in a live run with a model that had chosen these calls. The
session has its ``--turns`` turns (30; 6 with ``--quick``) plus one taken back by an undo: reads of a large and
of small files, re-reads (stubs inside a reply, full reads in later turns), greps (and one repeated, answered
``Same result as``), edits, a ``glob``, an undo and one compaction halfway.

Peers are built from the same stored turns, request by request, the way harnesses people run send them:

- (a) ``resend``: every earlier tool call and result is sent again with each request (an agent CLI's way), stubs
  and ``Same result as`` answered in full;
- (b) ``date``: (a) with the day's date on the first line of the system prompt, the day changing halfway through
  the session (as clients that state the date in their system prompt do);
- (c) ``prune``: (a) where, at each new turn, tool results older than the last two turns and beyond the newest
  ``PRUNE_PROTECT`` characters are replaced by a placeholder once that frees at least ``PRUNE_MINIMUM``
  characters (OpenCode's prune, scaled to this session's size);
- and, only as a labelled worst case on the reference session, ``clock``: (a) with the date and time to the
  minute (of a simulated clock: a request every 20 s, a turn every 3 min) on the system prompt's first line.

The physical minimum of a request is its tokens not shared with the previous request's token sequence, both
made by the server's own ``/apply-template`` then ``/tokenize``. Tokens "lost to the template" are those of
the previous request that the next one, carrying the same messages and more, no longer starts with: the chat
template rendered the same messages differently.

Per template shape (``testing.chat_templates.TEMPLATE_SHAPES`` where it exists, else the generated
model's ChatML) Cachet's requests are replayed again. Then two and four sessions in different workspaces
alternate turn by turn on one slot, with llama.cpp's host-memory prompt cache (``--cache-ram``) on and off,
with today's one system prompt and with the old one whose first line named the workspace and the model
("before" issue 10's item 1, made by rewriting that line in the same requests).

Last, a team: 2, 4 or 8 sessions of ``--session-turns`` turns (30; quick 12) take turns round robin on 1 or 2
replicas of 1, 2 or 4 slots (``--scenarios``; the default seven, or ``all`` eighteen; quick 2 sessions on one
server of 2 slots), each scenario under six policies: Cachet's requests with llama.cpp's own slot choice, with
Cachet's placement (the reply loop's own ``place``: replica, then ``id_slot``, a slot taken over handed over
first so that llama.cpp's host-memory cache keeps its prefix; the handover's tokens are counted) on default
flags, and with ``--slot-save-path`` added (the flags docs/deployment.md recommends: a prefix saved when its
slot is taken over, put back when its session returns), and the peers (a), (b) and (c) with the server's own choice.
Sessions go to the replica of their number, as Cachet spreads them. Every figure is processed tokens over the
floor: the same sessions, each on a server of its own; a peer's is also given over its own floor (its own requests,
each session alone), which tells what sharing the servers cost it from what its longer requests cost. The
``--slot-save-path`` files go to temporary folders.

The lines ``cachet processed/minimum = R`` (R to 3 decimals, the worst template shape) and ``cachet
processed/floor = R`` (the worst scenario of Cachet's placement, on default flags or with saved slots, against
each session alone; targets 1.05 and 1.00) are an interface.

    python bench/cache.py [--quick] [--turns 30] [--session-turns 30] [--team-only] [--scenarios 8x2x2,...]
        [--layers 1] [--dim 32] [--threads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testing.interrupts import sigterm_as_interrupt  # noqa: E402

if TYPE_CHECKING:
    from sessions_app.models import ChatSession, Turn
    from testing.llama import LlamaServer
    from testing.scripted_server import Step
    from testing.tiny_gguf import ModelShape

DATE = "2026-11-30"
MODEL = "bench"
CTX = 65536
PRUNE_PROTECT = 8000
PRUNE_MINIMUM = 4000
PRUNED = "[Old tool result content cleared]"
OLD_FIRST_LINE = (
    'You are a coding assistant working in the workspace "{workspace}" on a server. You are the model {model}.'
)

Message = dict[str, Any]


# --- the workspace and the reference conversation -----------------------------------------------------------


def make_workspace(folder: Path) -> None:
    """A small Python project: one large module, a few small ones, notes."""
    app = folder / "app"
    app.mkdir(parents=True)
    (app / "big.py").write_text(
        "".join(f"def handler_{i}(request):\n    return respond(request, code={i})\n" for i in range(1, 46))
    )
    (app / "util.py").write_text(
        "".join(f"def helper_{i}(value):\n    return value * {i} + {i % 7}\n" for i in range(1, 11))
    )
    (app / "config.py").write_text("".join(f"SETTING_{i} = {i}\n" for i in range(1, 41)))
    (app / "models.py").write_text(
        "".join(f"class Model{i}:\n    name = 'model_{i}'\n    size = {i * 3}\n" for i in range(1, 9))
    )
    docs = folder / "docs"
    docs.mkdir()
    (docs / "notes.md").write_text("".join(f"- Note {i}: the handlers answer with respond().\n" for i in range(1, 9)))


@dataclass
class Action:
    """One thing the person does: send a message (its reply scripted as steps), undo, or compact."""

    kind: str
    words: str = ""
    steps: list[Step] = field(default_factory=list)


def _reply(turn: int, topic: str) -> str:
    return (
        f"Turn {turn}: I looked at {topic}. The handlers all answer through respond() with their own code, the "
        "helpers are small arithmetic functions and the settings are plain constants. Nothing here needs a "
        "change beyond what you asked; tell me if you want the next file looked at."
    )


def turn_steps(turn: int, *, one_call: bool = False) -> tuple[str, list[Step]]:
    """The person's words and the scripted reply of turn ``turn`` (1-based), by a cycle of six kinds; with
    ``one_call`` a step calling several tools is split into steps of one call each (for templates that take one)."""
    from testing.scripted_server import Step

    kind = (turn - 1) % 6
    think = f"Turn {turn}: the person wants this checked; I read before I answer."
    if kind == 0:
        words, topic = "Read app/big.py and tell me how the handlers answer.", "app/big.py"
        steps = [
            Step(reasoning=think, tool_calls=[("read", {"path": "app/big.py"})]),
            Step(reasoning=think, tool_calls=[("read", {"path": "app/big.py", "offset": 12, "limit": 20})]),
        ]
    elif kind == 1:
        words, topic = "What do the helpers in app/util.py compute?", "app/util.py"
        steps = [
            Step(
                reasoning=think,
                tool_calls=[("read", {"path": "app/util.py"}), ("grep", {"pattern": "def helper_1", "path": "app"})],
            )
        ]
    elif kind == 2:
        words, topic = f"Set SETTING_{turn} in app/config.py to {turn * 10}.", "app/config.py"
        steps = [
            Step(reasoning=think, tool_calls=[("read", {"path": "app/config.py"})]),
            Step(
                reasoning=think,
                tool_calls=[
                    (
                        "edit",
                        {
                            "path": "app/config.py",
                            "old_string": f"SETTING_{turn} = {turn}\n",
                            "new_string": f"SETTING_{turn} = {turn * 10}\n",
                        },
                    )
                ],
            ),
        ]
    elif kind == 3:
        words, topic = "Where are SETTING_1x used, and what is in app/models.py?", "the settings and the models"
        grep = ("grep", {"pattern": "SETTING_1", "path": "app"})
        steps = [
            Step(reasoning=think, tool_calls=[grep]),
            Step(reasoning=think, tool_calls=[grep, ("read", {"path": "app/models.py"})]),
        ]
    elif kind == 4:
        words, topic = "Check app/util.py again against docs/notes.md.", "app/util.py and the notes"
        steps = [
            Step(reasoning=think, tool_calls=[("read", {"path": "app/util.py"}), ("read", {"path": "docs/notes.md"})])
        ]
    else:
        words, topic = "Which Python files are there? Show me the first models.", "the Python files"
        steps = [
            Step(reasoning=think, tool_calls=[("glob", {"pattern": "**/*.py"})]),
            Step(reasoning=think, tool_calls=[("read", {"path": "app/models.py", "offset": 1, "limit": 12})]),
        ]
    if one_call:
        steps = [Step(reasoning=step.reasoning, tool_calls=[call]) for step in steps for call in step.tool_calls]
    steps.append(Step(reasoning=think, text=_reply(turn, topic)))
    return f"Turn {turn}: {words}", steps


def reference_actions(turns: int, *, one_call: bool = False) -> list[Action]:
    """The reference session: ``turns`` live turns, an undo of an edit turn, one compaction halfway."""
    from testing.scripted_server import Step

    undo_after = 3 if turns < 12 else 9
    compact_after = max(4, turns // 2)
    actions: list[Action] = []
    for turn in range(1, turns + 1):
        words, steps = turn_steps(turn, one_call=one_call)
        actions.append(Action("send", words, steps))
        if turn == undo_after:
            actions.append(Action("undo"))
            words, steps = turn_steps(turn, one_call=one_call)
            actions.append(Action("send", words.replace(f"Turn {turn}:", f"Turn {turn} again:"), steps))
        if turn == compact_after:
            summary = (
                f"Summary of turns 1-{turn}: the person had me read app/big.py (45 handlers answering through "
                "respond), app/util.py (10 helpers), app/models.py and docs/notes.md, grep for helpers and "
                "settings, and set several SETTING_n in app/config.py to ten times their value; one edit was "
                "taken back. Nothing is pending."
            )
            actions.append(Action("compact", steps=[Step(text=summary)]))
    return actions


def session_actions(turns: int) -> list[Action]:
    """A session of the alternation runs: sends only."""
    actions = []
    for turn in range(1, turns + 1):
        words, steps = turn_steps(turn)
        actions.append(Action("send", words, steps))
    return actions


# --- the scripted stage: Cachet's real loop and store ------------------------------------------------------


@dataclass
class Sent:
    """One request Cachet sent, with what a peer resending every tool result would have sent instead."""

    body: bytes
    request: dict[str, Any]
    peer_messages: list[Message]
    turn: int
    new_turn: bool
    clock: datetime


@dataclass
class Recorded:
    workspace: str
    sent: list[Sent]
    session_id: int = 0

    def by_turn(self) -> list[list[Sent]]:
        groups: list[list[Sent]] = []
        for sent in self.sent:
            if sent.new_turn or not groups:
                groups.append([])
            groups[-1].append(sent)
        return groups


def _removed(work: Path) -> None:
    """The run's folder gone, its embedded Postgres stopped first (removed under it, the server ran on)."""
    if "django" in sys.modules and os.environ.get("CACHET_DATA") == str(work / "data"):
        from django.db import connections

        from cachet.embedded_pg import embedded_stop

        connections.close_all()
        embedded_stop(work / "data")
    shutil.rmtree(work, ignore_errors=True)


def _setup_django(data: Path) -> None:
    os.environ["CACHET_DATA"] = str(data)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cachet.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def _full_tool_message(message: Message, session: ChatSession) -> Message:
    """A tool message as a peer sends it: a stub or ``Same result as`` answered with the text it stands for."""
    from sessions_app.models import Result, ResultKind

    result = Result.objects.get(session=session, call_id=message["tool_call_id"])
    if result.kind not in (ResultKind.STUB, ResultKind.SAME):
        return message
    bracket = result.inserted_text[: result.inserted_text.index("]") + 1]
    return {**message, "content": bracket + "\n" + result.full_text}


def _turn_messages(turn: Turn, session: ChatSession) -> list[Message]:
    """An earlier turn as a peer resends it: the person's message, then every step with its calls and results."""
    from sessions_app.selectors.requests import step_messages

    results = list(turn.results.order_by("number"))
    out: list[Message] = [{"role": "user", "content": turn.message}]
    for step in turn.steps.order_by("number"):
        for message in step_messages(step, [r for r in results if r.step_id == step.pk]):
            out.append(_full_tool_message(message, session) if message["role"] == "tool" else message)
    return out


def _peer_messages(messages: list[Message], earlier: Sequence[Turn], session: ChatSession) -> list[Message]:
    """Cachet's messages with each earlier turn's reply expanded into its steps and results, stubs in full."""
    out = [messages[0]]
    for position, turn in enumerate(earlier):
        user, assistant = messages[1 + 2 * position], messages[2 + 2 * position]
        if user != {"role": "user", "content": turn.message} or assistant["role"] != "assistant":
            raise RuntimeError(f"request layout: turn {turn.number} is not where expected")
        out.extend(_turn_messages(turn, session))
    for message in messages[1 + 2 * len(earlier) :]:
        out.append(_full_tool_message(message, session) if message["role"] == "tool" else message)
    return out


def record_session(work: Path, name: str, actions: Sequence[Action]) -> Recorded:
    """Run ``actions`` through the real reply loop against the scripted server; every request kept."""
    from django.contrib.auth import get_user_model

    from chat.agent.loop import ReplyLoop
    from chat.agent.model import Timeouts
    from chat.tools import tool_list
    from sessions_app.models import ModelEndpoint, Workspace
    from sessions_app.selectors.sessions import history_turns
    from sessions_app.services.sessions import session_start
    from testing.drive import run_to_end
    from testing.scripted_server import ScriptedServer

    folder = work / name
    make_workspace(folder)
    user, _ = get_user_model().objects.get_or_create(username="bench")
    sent: list[Sent] = []
    clock = datetime(2026, 11, 30, 9, 0)
    with ScriptedServer(model=MODEL) as server:
        workspace = Workspace.objects.create(name=name, folder=str(folder), open_to_everyone=True, from_shell=True)
        endpoint = ModelEndpoint.objects.create(
            name=f"scripted-{name}", base_url=server.base_url, model=MODEL, context_window=CTX
        )
        session = session_start(
            owner=user, workspace=workspace, endpoint=endpoint, model_name=MODEL, tools=tool_list(allow_commands=False)
        )
        # each action's steps script every request of its reply; a title's request (after the first reply, at no
        # cost to the prefix: tests/agent/test_loop_llama.py) would be one the scenario does not script
        timeouts = Timeouts(connect=10, first_token=60, between_chunks=60)
        loop = ReplyLoop(session, date=DATE, client_timeouts=timeouts, titles=False)
        for action in actions:
            before = len(server.requests)
            earlier = list(history_turns(loop.session))
            server.push(*action.steps)
            events: AsyncGenerator[Any, None]
            if action.kind == "send":
                events = loop.send(action.words)
                clock += timedelta(minutes=3)
            elif action.kind == "undo":
                events = loop.undo(restore=True)
            else:
                events = loop.compact()
            run_to_end(events)
            if server.remaining:
                raise RuntimeError(f"{name}: {action.kind} left {server.remaining} scripted steps unused")
            for position, body in enumerate(server.requests[before:]):
                request = json.loads(body)
                messages: list[Message] = request["messages"]
                turn_number = len(earlier) + 1
                sent.append(
                    Sent(
                        body=body,
                        request=request,
                        peer_messages=_peer_messages(messages, earlier, loop.session),
                        turn=turn_number,
                        new_turn=position == 0,
                        clock=clock,
                    )
                )
                clock += timedelta(seconds=20)
    return Recorded(workspace=name, sent=sent, session_id=loop.session.pk)


# --- the peers -------------------------------------------------------------------------------------------------


def _body(request: dict[str, Any], messages: list[Message]) -> bytes:
    out = {key: value for key, value in request.items() if key != "messages"}
    out["messages"] = messages
    return json.dumps(out, ensure_ascii=False, separators=(",", ":")).encode()


def resend_bodies(recorded: Recorded) -> list[bytes]:
    return [_body(sent.request, sent.peer_messages) for sent in recorded.sent]


def clock_bodies(recorded: Recorded) -> list[bytes]:
    bodies = []
    for sent in recorded.sent:
        system = sent.peer_messages[0]
        stamp = sent.clock.strftime("Current date and time: %Y-%m-%d %H:%M.\n")
        messages = [{**system, "content": stamp + system["content"]}, *sent.peer_messages[1:]]
        bodies.append(_body(sent.request, messages))
    return bodies


def date_bodies(recorded: Recorded) -> list[bytes]:
    """(a) with the day's date on the first line of the system prompt; the day changes halfway through."""
    turns = recorded.by_turn()
    change = len(turns) // 2
    bodies = []
    day = datetime.strptime(DATE, "%Y-%m-%d")
    for number, group in enumerate(turns):
        stamp = f"Today's date is {(day + timedelta(days=1 if number >= change else 0)):%Y-%m-%d}.\n"
        for sent in group:
            system = sent.peer_messages[0]
            messages = [{**system, "content": stamp + system["content"]}, *sent.peer_messages[1:]]
            bodies.append(_body(sent.request, messages))
    return bodies


def prune_bodies(recorded: Recorded) -> list[bytes]:
    bodies = []
    pruned: set[str] = set()
    for sent in recorded.sent:
        messages = sent.peer_messages
        if sent.new_turn:
            users = [index for index, message in enumerate(messages) if message["role"] == "user"]
            protected_from = users[-2] if len(users) >= 2 else 0
            older = [
                message
                for message in messages[:protected_from]
                if message["role"] == "tool" and message["tool_call_id"] not in pruned
            ]
            kept = 0
            candidates: list[Message] = []
            for message in reversed(older):
                if kept < PRUNE_PROTECT:
                    kept += len(message["content"])
                else:
                    candidates.append(message)
            if sum(len(message["content"]) for message in candidates) >= PRUNE_MINIMUM:
                pruned.update(message["tool_call_id"] for message in candidates)
        shown = [
            {**message, "content": PRUNED}
            if message["role"] == "tool" and message["tool_call_id"] in pruned
            else message
            for message in messages
        ]
        bodies.append(_body(sent.request, shown))
    return bodies


def before_item_1(recorded: Recorded) -> list[list[bytes]]:
    """The session's requests, turn by turn, with the old system prompt's first line naming workspace and model."""
    line = OLD_FIRST_LINE.format(workspace=recorded.workspace, model=MODEL)
    turns = []
    for group in recorded.by_turn():
        bodies = []
        for sent in group:
            messages: list[Message] = list(sent.request["messages"])
            rest = messages[0]["content"].split("\n", 1)[1]
            messages[0] = {**messages[0], "content": line + "\n" + rest}
            bodies.append(_body(sent.request, messages))
        turns.append(bodies)
    return turns


# --- llama.cpp -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Usage:
    prompt: int
    cached: int
    processed: int
    prompt_ms: float


@dataclass
class Totals:
    requests: int = 0
    prompt: int = 0
    cached: int = 0
    processed: int = 0
    prompt_ms: float = 0.0

    def add(self, usage: Usage) -> None:
        self.requests += 1
        self.prompt += usage.prompt
        self.cached += usage.cached
        self.processed += usage.processed
        self.prompt_ms += usage.prompt_ms

    @property
    def share(self) -> float:
        return self.cached / self.prompt if self.prompt else 0.0


def send(server: LlamaServer, body: bytes) -> Usage:
    """One request to llama.cpp; what it reports."""
    from chat.agent.model import Timeouts, stream_chat

    timeouts = Timeouts(connect=10, first_token=1800, between_chunks=600)
    completion = asyncio.run(
        stream_chat(base_url=server.base_url, api_key=None, body=body, timeouts=timeouts).complete()
    )
    timings = completion.timings or {}
    prompt = completion.prompt_tokens or 0
    cached = completion.cached_tokens or 0
    processed = timings.get("prompt_n")
    return Usage(
        prompt=prompt,
        cached=cached,
        processed=int(processed) if isinstance(processed, int) else prompt - cached,
        prompt_ms=float(timings.get("prompt_ms") or 0.0),
    )


@dataclass
class Shape:
    name: str
    template: str | None
    model: Path


class Servers:
    """Starts one llama.cpp server at a time on the bench model."""

    def __init__(self, model: Path, threads: int) -> None:
        self.model = model
        self.threads = threads

    def run(
        self,
        *,
        template: str | None = None,
        cache_ram_mib: int | None = None,
        model: Path | None = None,
        parallel: int = 1,
        slot_prompt_similarity: float | None = None,
        slot_save_path: Path | None = None,
        ctx_per_slot: int = CTX,
    ) -> LlamaServer:
        from testing.llama import LlamaServer

        return LlamaServer(
            model or self.model,
            ctx_size=ctx_per_slot * parallel,
            parallel=parallel,
            threads=self.threads,
            n_predict=1,
            verbosity=0,
            alias=MODEL,
            cache_ram_mib=cache_ram_mib,
            chat_template=template,
            slot_prompt_similarity=slot_prompt_similarity,
            slot_save_path=slot_save_path,
        ).start()


def replay(server: LlamaServer, bodies: Sequence[bytes]) -> list[Usage]:
    return [send(server, body) for body in bodies]


@dataclass(frozen=True)
class Minimum:
    tokens: int
    minimum: int
    template_lost: int
    template_lost_requests: int


def _shared(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def physical_minimum(server: LlamaServer, recorded: Recorded) -> Minimum:
    """Per request, the tokens not shared with the previous request's tokens (the server's template and tokenizer)."""
    from chat.agent.server_api import prompt_tokens

    previous: tuple[int, ...] = ()
    previous_messages: list[Message] = []
    total = minimum = lost = lost_requests = 0
    for sent in recorded.sent:
        messages: list[Message] = sent.request["messages"]
        tokens = prompt_tokens(server.base_url, messages, tools=sent.request.get("tools"))
        if tokens is None:
            raise RuntimeError("the server offers no /apply-template or /tokenize")
        shared = _shared(previous, tokens)
        total += len(tokens)
        minimum += len(tokens) - shared
        if previous and messages[: len(previous_messages)] == previous_messages and shared < len(previous):
            lost += len(previous) - shared
            lost_requests += 1
        previous, previous_messages = tokens, messages
    return Minimum(tokens=total, minimum=minimum, template_lost=lost, template_lost_requests=lost_requests)


# --- the runs ----------------------------------------------------------------------------------------------


def template_shapes(work: Path, model_shape: ModelShape, default_model: Path) -> tuple[list[Shape], str]:
    """The template shapes to run, each written into its own GGUF: cache10's ``TEMPLATE_SHAPES`` where present,
    else the generated model's own ChatML."""
    from testing import tiny_gguf

    try:
        chat_templates = importlib.import_module("testing.chat_templates")
    except ImportError:
        return [Shape("chatml (generated model's own)", None, default_model)], (
            "testing.chat_templates is not there yet: the generated model's ChatML only"
        )
    shapes: dict[str, str] = dict(chat_templates.TEMPLATE_SHAPES)
    specials: dict[str, tuple[str, ...]] = dict(getattr(chat_templates, "TEMPLATE_SPECIALS", {}))
    bos: dict[str, str] = dict(getattr(chat_templates, "TEMPLATE_BOS", {}))
    eos: dict[str, str] = dict(getattr(chat_templates, "TEMPLATE_EOS", {}))
    out = []
    for name, template in shapes.items():
        path = tiny_gguf.write_model(
            work / f"bench-{name}.gguf",
            model_shape,
            chat_template=template,
            specials=specials.get(name, ()),
            bos=bos.get(name, tiny_gguf.ENDOFTEXT),
            eos=eos.get(name, tiny_gguf.IM_END),
        )
        out.append(Shape(name, None, path))
    return out, "chat_templates.TEMPLATE_SHAPES, each written into the GGUF"


def _ms(value: float) -> str:
    return f"{value / 1000:.1f} s"


def run_reference(
    servers: Servers, recorded: Recorded, shapes: Sequence[Shape], one_call: Callable[[], Recorded]
) -> float:
    """Cachet and the peers on the first shape, then Cachet on every shape (on ``one_call()``'s session, one
    tool call a step, where the shape's template refuses several); the worst R."""
    from chat.agent.model import ModelHTTPError

    variants: dict[str, Callable[[Recorded], list[bytes]]] = {
        "cachet": lambda r: [sent.body for sent in r.sent],
        "(a) resend": resend_bodies,
        "(b) date": date_bodies,
        "(c) prune": prune_bodies,
        "clock (worst)": clock_bodies,
    }
    first = shapes[0]
    totals: dict[str, Totals] = {}
    for name, bodies_of in variants.items():
        server = servers.run(template=first.template, model=first.model)
        try:
            started = time.monotonic()
            totals[name] = Totals()
            for usage in replay(server, bodies_of(recorded)):
                totals[name].add(usage)
            wall = time.monotonic() - started
            if name == "cachet":
                first_minimum = physical_minimum(server, recorded)
        finally:
            server.stop()
        print(f"  replayed {name}: {totals[name].requests} requests in {wall:.0f} s", flush=True)
    base = totals["cachet"]
    print()
    print(f"Reference session, template {first.name}: {base.requests} requests")
    header = ("variant", "prompt tok", "processed", "cached", "prompt time", "processed/cachet", "time/cachet")
    print(f"{header[0]:<12}" + "".join(f"{h:>17}" for h in header[1:]))
    for name, fig in totals.items():
        print(
            f"{name:<12}{fig.prompt:>17,}{fig.processed:>17,}{fig.share:>17.1%}{_ms(fig.prompt_ms):>17}"
            f"{fig.processed / base.processed:>16.2f}x{fig.prompt_ms / base.prompt_ms:>16.2f}x"
        )
    print(
        f"cachet: {base.processed:,} processed, physical minimum {first_minimum.minimum:,} "
        f"(of {first_minimum.tokens:,} prompt tokens); lost to the template: {first_minimum.template_lost:,} tokens "
        f"in {first_minimum.template_lost_requests} requests"
    )
    print()
    print("Per template shape (Cachet's requests):")
    print(f"{'shape':<34}{'prompt tok':>12}{'processed':>12}{'minimum':>12}{'R':>8}{'template-lost':>15}")
    worst = 0.0
    for shape in shapes:
        if shape is first:
            processed, found = base.processed, first_minimum
            prompt = base.prompt
        else:
            label = shape.name
            for session in (recorded, None):
                if session is None:
                    session, label = one_call(), f"{shape.name} (one call a step)"
                server = servers.run(template=shape.template, model=shape.model)
                try:
                    shape_totals = Totals()
                    for usage in replay(server, [sent.body for sent in session.sent]):
                        shape_totals.add(usage)
                    found = physical_minimum(server, session)
                    break
                except ModelHTTPError as error:
                    if session is not recorded or error.status != 400:
                        raise
                    print(f"  {shape.name}: {str(error)[:160]}")
                finally:
                    server.stop()
            processed, prompt = shape_totals.processed, shape_totals.prompt
        ratio = processed / found.minimum if found.minimum else 0.0
        worst = max(worst, ratio)
        print(
            f"{(label if shape is not first else shape.name)[:33]:<34}{prompt:>12,}{processed:>12,}"
            f"{found.minimum:>12,}{ratio:>8.3f}"
            f"{found.template_lost:>15,}"
        )
    ratio_clock = totals["clock (worst)"].processed / base.processed
    ratio_c = totals["(c) prune"].processed / base.processed
    pruned = prune_bodies(recorded) != resend_bodies(recorded)
    fewer = all(base.processed < totals[name].processed for name in totals if name != "cachet")
    print(
        f"targets: R <= 1.02 on every shape: {'met' if worst <= 1.02 else 'MISSED'} ({worst:.3f}); "
        f"fewer than every peer: {'met' if fewer else 'MISSED'}; "
        f">= 5x fewer than the clock: {'met' if ratio_clock >= 5 else 'MISSED'} ({ratio_clock:.2f}x); "
        + (
            f">= 1.3x fewer than (c): {'met' if ratio_c >= 1.3 else 'MISSED'} ({ratio_c:.2f}x)"
            if pruned
            else f">= 1.3x fewer than (c): n/a, (c) pruned nothing in {len(recorded.by_turn())} turns ({ratio_c:.2f}x)"
        )
    )
    return worst


def run_alternation(servers: Servers, sessions: Sequence[Recorded], counts: Sequence[int]) -> float:
    """Sessions alternating turn by turn on one slot; the worst first-request cached share of a later session."""
    print()
    print("Sessions alternating turn by turn on one slot (processed tokens per session-turn):")
    header = ("sessions", "system prompt", "host cache", "processed", "per turn", "prompt time", "new session cached")
    print(
        f"{header[0]:>8}  {header[1]:<20}{header[2]:>11}"
        + "".join(f"{h:>14}" for h in header[3:6])
        + f"{header[6]:>20}"
    )
    worst_first = 1.0
    for count in counts:
        for prefix in ("one prefix (now)", "per-session line"):
            turns_of = (
                [[[sent.body for sent in group] for group in r.by_turn()] for r in sessions[:count]]
                if prefix.startswith("one")
                else [before_item_1(r) for r in sessions[:count]]
            )
            for cache in ("on", "off"):
                server = servers.run(cache_ram_mib=None if cache == "on" else 0)
                totals = Totals()
                firsts: list[float] = []
                session_turns = 0
                try:
                    for turn in range(max(len(t) for t in turns_of)):
                        for position, turns in enumerate(turns_of):
                            if turn >= len(turns):
                                continue
                            session_turns += 1
                            for index, body in enumerate(turns[turn]):
                                usage = send(server, body)
                                totals.add(usage)
                                if turn == 0 and index == 0 and position > 0:
                                    firsts.append(usage.cached / usage.prompt if usage.prompt else 0.0)
                finally:
                    server.stop()
                first = min(firsts) if firsts else 0.0
                if prefix.startswith("one"):
                    worst_first = min(worst_first, first)
                print(
                    f"{count:>8}  {prefix:<20}{cache:>11}{totals.processed:>14,}"
                    f"{totals.processed / session_turns:>14,.0f}{_ms(totals.prompt_ms):>14}{first:>20.1%}",
                    flush=True,
                )
    count = max(counts)
    server = servers.run()
    totals = Totals()
    try:
        for session in sessions[:count]:
            for sent in session.sent:
                totals.add(send(server, sent.body))
    finally:
        server.stop()
    turn_count = sum(len(session.by_turn()) for session in sessions[:count])
    print(
        f"{count:>8}  {'one after another':<20}{'on':>11}{totals.processed:>14,}"
        f"{totals.processed / turn_count:>14,.0f}{_ms(totals.prompt_ms):>14}{'':>20}",
        flush=True,
    )
    print(
        f"target: a new session's first request >= 80 % cached when another has run: "
        f"{'met' if worst_first >= 0.8 else 'MISSED'} ({worst_first:.1%})"
    )
    return worst_first


@dataclass(frozen=True)
class Scenario:
    """``sessions`` sessions taking turns on ``replicas`` llama.cpp servers of ``slots`` slots each."""

    sessions: int
    replicas: int
    slots: int

    @classmethod
    def parse(cls, text: str) -> Scenario:
        sessions, replicas, slots = (int(part) for part in text.lower().split("x"))
        return cls(sessions, replicas, slots)

    def __str__(self) -> str:
        return f"{self.sessions}x{self.replicas}x{self.slots}"


ALL_SCENARIOS = tuple(Scenario(n, r, k) for n in (2, 4, 8) for r in (1, 2) for k in (1, 2, 4))
TEAM_SCENARIOS = tuple(Scenario.parse(text) for text in ("2x1x1", "2x1x2", "4x1x2", "4x1x4", "8x1x4", "4x2x1", "8x2x2"))
TEAM_CTX = 2 * CTX  # per slot: a peer resending every result of 30 turns passes 65,536 bytes, on a byte vocabulary
TEAM_POLICIES = ("llama.cpp", "cachet", "cachet + saves", "(a) resend", "(b) date", "(c) prune")


@dataclass
class _Similarity:
    value: float | None = None  # the team's servers' --slot-prompt-similarity (None: llama.cpp's default, 0.1)


TEAM_SIMILARITY = _Similarity()


def _team_bodies(recorded: Recorded, policy: str) -> list[list[bytes]]:
    """A session's requests turn by turn, as Cachet sent them or as a peer policy would have."""
    bodies = {
        "(a) resend": resend_bodies,
        "(b) date": date_bodies,
        "(c) prune": prune_bodies,
    }.get(policy, lambda r: [sent.body for sent in r.sent])(recorded)
    turns: list[list[bytes]] = []
    position = 0
    for group in recorded.by_turn():
        turns.append(bodies[position : position + len(group)])
        position += len(group)
    return turns


def _team_run(
    servers: Servers, sessions: Sequence[Recorded], scenario: Scenario, policy: str
) -> tuple[int, float, float]:
    """One policy on one scenario: the sessions take turns, round robin, on the scenario's servers. Cachet's
    policies place each request with the reply loop's own ``place`` (replica, then slot, saving and restoring
    where the server saves slots); the others go to the replica of the session's number (a load balancer with
    session affinity, as Cachet spreads new sessions) and leave the slot to llama.cpp. Processed tokens, prompt
    milliseconds and wall seconds."""
    from chat.agent import placement
    from sessions_app.models import ChatSession, ModelEndpoint, ServerSlot, SlotSave

    saves = policy == "cachet + saves"
    folders = [Path(tempfile.mkdtemp(prefix="cachet-slots-")) if saves else None for _ in range(scenario.replicas)]
    running = [
        servers.run(
            parallel=scenario.slots,
            slot_save_path=folder,
            ctx_per_slot=TEAM_CTX,
            slot_prompt_similarity=TEAM_SIMILARITY.value,
        )
        for folder in folders
    ]
    placement.forget()
    ServerSlot.objects.all().delete()
    SlotSave.objects.all().delete()
    urls = [server.base_url for server in running]
    by_url = {server.base_url: server for server in running}
    rows: dict[int, ChatSession] = {}
    for recorded in sessions:
        session = ChatSession.objects.select_related("endpoint").get(pk=recorded.session_id)
        ModelEndpoint.objects.filter(pk=session.endpoint_id).update(base_url=urls[0], replica_urls="\n".join(urls[1:]))
        session.endpoint.refresh_from_db()
        rows[recorded.session_id] = session
    turns_of = [_team_bodies(recorded, policy) for recorded in sessions]
    totals = Totals()
    previous: dict[int, placement.Placed] = {}
    began = time.monotonic()
    try:
        for turn in range(max(len(turns) for turns in turns_of)):
            for recorded, turns in zip(sessions, turns_of, strict=True):
                if turn >= len(turns):
                    continue
                session = rows[recorded.session_id]
                for body in turns[turn]:
                    if not policy.startswith("cachet"):
                        totals.add(send(by_url[urls[session.pk % len(urls)]], body))
                        continue
                    placed = placement.place(session, previous=previous.get(session.pk))
                    usage: Usage | None = None
                    try:
                        usage = send(by_url[placed.url], placement.placed_body(body, placed))
                        totals.add(usage)
                        totals.processed += placed.handover_tokens
                    finally:
                        if placed.slot is not None:
                            placement.release_slot(
                                url=placed.url, slot=placed.slot, cached_tokens=usage.cached if usage else None
                            )
                    previous[session.pk] = placed
        wall = time.monotonic() - began
    finally:
        for server in running:
            server.stop()
        for folder in folders:
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
    return totals.processed, totals.prompt_ms, wall


def run_team(
    servers: Servers, sessions: Sequence[Recorded], scenarios: Sequence[Scenario], policies: Sequence[str]
) -> float:
    """Every scenario under every policy, each figure over the floor (each session alone on a server of its own,
    Cachet's requests); returns the worst processed/floor of Cachet's placement, on either flags."""
    alone: list[int] = []
    own_alone: dict[str, list[int]] = {policy: [] for policy in policies if policy.startswith("(")}
    for recorded in sessions[: max(scenario.sessions for scenario in scenarios)]:
        server = servers.run(ctx_per_slot=TEAM_CTX)
        try:
            alone.append(sum(send(server, sent.body).processed for sent in recorded.sent))
        finally:
            server.stop()
        for policy, sums in own_alone.items():  # a peer's own requests, alone: what it could not do better than
            server = servers.run(ctx_per_slot=TEAM_CTX)
            try:
                bodies = [body for turn in _team_bodies(recorded, policy) for body in turn]
                sums.append(sum(send(server, body).processed for body in bodies))
            finally:
                server.stop()
    turns = len(sessions[0].by_turn())
    print()
    print(
        f"A team: sessions of {turns} turns taking turns round robin on replicas x slots (llama.cpp, --cache-ram "
        "default); processed tokens over the floor (each session alone on a server of its own). llama.cpp and the "
        "peers: the server's own slot choice, default flags; cachet: its placement (id_slot), default flags; "
        "cachet + saves: the same with --slot-save-path (the flags docs/deployment.md recommends)."
    )
    print(f"{'scenario':<22}{'floor':>11}" + "".join(f"{policy:>16}" for policy in policies))
    worst = 0.0
    verdicts: list[str] = []
    for scenario in scenarios:
        chosen = sessions[: scenario.sessions]
        floor = sum(alone[: scenario.sessions])
        processed: dict[str, int] = {}
        wall: dict[str, float] = {}
        for policy in policies:
            processed[policy], _, wall[policy] = _team_run(servers, chosen, scenario, policy)
        label = f"{scenario.sessions} on {scenario.replicas}x{scenario.slots}"
        print(
            f"{label:<22}{floor:>11,}" + "".join(f"{processed[p] / floor:>15.2f}x" for p in policies),
            flush=True,
        )
        print(
            f"{'  processed, wall s':<22}{'':>11}" + "".join(f"{processed[p]:>10,} {wall[p]:>4.0f}s" for p in policies),
            flush=True,
        )
        own = {policy: sum(sums[: scenario.sessions]) for policy, sums in own_alone.items()}
        print(
            f"{'  over its own floor':<22}{'':>11}"
            + "".join(
                f"{processed[p] / own[p]:>15.2f}x" if p in own else f"{processed[p] / floor:>15.2f}x" for p in policies
            ),
            flush=True,
        )
        peers = [p for p in policies if p.startswith("(")]
        for policy, limit in (("cachet", 1.05), ("cachet + saves", 1.00)):
            if policy not in processed:
                continue
            ours = processed[policy]
            worst = max(worst, ours / floor)
            beaten = all(ours < processed[p] for p in peers)
            verdicts.append(
                f"{scenario} {policy}: <= {limit:.2f} x floor {'met' if ours <= limit * floor else 'MISSED'}"
                + (f", fewer than every peer {'met' if beaten else 'MISSED'}" if peers else "")
            )
    print("targets: " + "; ".join(verdicts))
    return worst


def main() -> None:
    sigterm_as_interrupt()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="6 turns, two alternating sessions of 2 turns, two sessions of 12 turns on a server of two slots",
    )
    parser.add_argument(
        "--scenarios",
        default=None,
        help="the team's scenarios, SESSIONSxREPLICASxSLOTS separated by commas, 'none', or 'all' (the 18 of 2, 4, 8 "
        f"sessions on 1, 2 replicas of 1, 2, 4 slots); default {','.join(map(str, TEAM_SCENARIOS))}; quick 2x1x2",
    )
    parser.add_argument("--turns", type=int, default=None, help="turns of the reference session (30; quick 6)")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--session-turns", type=int, default=None, help="turns of each session placed on slots (30; quick 12)"
    )
    parser.add_argument("--team-only", "--slots-only", action="store_true", help="only the team's scenarios")
    parser.add_argument(
        "--slot-prompt-similarity",
        type=float,
        default=None,
        help="the team's servers' --slot-prompt-similarity (default: llama.cpp's own, 0.1; 0 picks the least "
        "recently used slot and saves its prompt to the host-memory cache every time)",
    )
    parser.add_argument(
        "--policies",
        default=",".join(TEAM_POLICIES),
        help=f"the team's policies (default all: {', '.join(TEAM_POLICIES)})",
    )
    args = parser.parse_args()
    TEAM_SIMILARITY.value = args.slot_prompt_similarity
    turns = args.turns or (6 if args.quick else 30)
    alternation_turns = 2 if args.quick else 4
    slot_turns = args.session_turns or (12 if args.quick else 30)
    counts = (2,) if args.quick else (2, 4)
    if args.scenarios == "none":
        scenarios: Sequence[Scenario] = []
    elif args.scenarios == "all":
        scenarios = ALL_SCENARIOS
    elif args.scenarios:
        scenarios = [Scenario.parse(text) for text in args.scenarios.split(",")]
    else:
        scenarios = [Scenario(2, 1, 2)] if args.quick else TEAM_SCENARIOS

    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="cachet-cache-bench-"))
    try:
        _setup_django(work / "data")
        from testing.tiny_gguf import ModelShape, write_model

        shape = ModelShape(
            layers=args.layers, dim=args.dim, heads=max(1, args.dim // 64), ff=args.dim * 2, ctx=TEAM_CTX
        )
        model = write_model(work / "bench.gguf", shape)
        shapes, source = template_shapes(work, shape, model)
        print(f"model: {args.layers} layer(s) x {args.dim}, byte-level vocabulary; templates: {source}")
        servers = Servers(model, args.threads)

        def team() -> float:
            """The team's scenarios under every policy; the worst processed/floor of Cachet's placement."""
            if not scenarios:
                return 0.0
            letters = "abcdefghijklmnop"[: max(scenario.sessions for scenario in scenarios)]
            sessions = [record_session(work, f"team-{letter}", session_actions(slot_turns)) for letter in letters]
            print(f"recorded: {len(sessions)} sessions of {slot_turns} turns ({time.monotonic() - started:.0f} s)")
            policies = [policy.strip() for policy in args.policies.split(",") if policy.strip()]
            unknown = set(policies) - set(TEAM_POLICIES)
            if unknown:
                parser.error(f"unknown policies: {', '.join(sorted(unknown))}")
            return run_team(servers, sessions, scenarios, policies)

        if args.team_only:
            floor_ratio = team()
            print()
            print(f"cachet processed/floor = {floor_ratio:.3f}" if floor_ratio else "cachet processed/floor = n/a")
            print(f"(all in {time.monotonic() - started:.0f} s)")
            return
        others = [record_session(work, f"pair-{letter}", session_actions(alternation_turns)) for letter in "abcd"]
        reference = record_session(work, "reference", reference_actions(turns))
        print(
            f"recorded: reference session {turns} turns + 1 undone, {len(reference.sent)} requests; "
            f"{len(others)} sessions of {alternation_turns} turns ({time.monotonic() - started:.0f} s)",
            flush=True,
        )
        kept: list[Recorded] = []

        def one_call() -> Recorded:
            if not kept:
                kept.append(record_session(work, "reference-one-call", reference_actions(turns, one_call=True)))
            return kept[0]

        worst = run_reference(servers, reference, shapes, one_call)
        run_alternation(servers, others, counts)
        floor_ratio = team()
        print()
        print(f"cachet processed/floor = {floor_ratio:.3f}" if floor_ratio else "cachet processed/floor = n/a")
        print(f"cachet processed/minimum = {worst:.3f}")
        print(f"(all in {time.monotonic() - started:.0f} s)")
    finally:
        _removed(work)


if __name__ == "__main__":
    main()
