"""Benchmark: what keeping the prefix byte-stable saves on a real llama.cpp server.

Runs one conversation three ways, side by side in one run, each against its own llama.cpp server
(xllamacpp, in-process) loading the same generated model:

- ``cachet``: the real reply loop and store; every request continues the one before.
- ``clock``: the same requests, but the system prompt starts with the time of the request
  (what the spec's §10 forbids: a clock in the system prompt).
- ``prune``: the same requests, but person messages older than two turns are cut to their first
  line (an in-place "hygiene" measure that rewrites what was already sent).

It prints, per variant, prompt tokens, cached tokens, prompt-processing milliseconds (llama.cpp's
``timings.prompt_ms``) and time to first token, and the ratios against ``cachet``.

    python bench/prefix_bench.py [--turns 8] [--layers 4] [--dim 512] [--paste 1500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testing.interrupts import sigterm_as_interrupt  # noqa: E402


@dataclass
class Figures:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    prompt_ms: float = 0.0
    ttft: list[float] = field(default_factory=list)

    def add(self, *, prompt: int | None, cached: int | None, prompt_ms: float | None, ttft: float | None) -> None:
        self.prompt_tokens += prompt or 0
        self.cached_tokens += cached or 0
        self.prompt_ms += prompt_ms or 0.0
        if ttft is not None:
            self.ttft.append(ttft)

    @property
    def mean_ttft_ms(self) -> float:
        return 1000 * sum(self.ttft) / len(self.ttft) if self.ttft else 0.0


def _setup_django(data: Path) -> None:
    os.environ["CACHET_DATA"] = str(data)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cachet.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def _paste(turn: int, size: int) -> str:
    lines: list[str] = []
    number = 1
    while sum(len(line) + 1 for line in lines) < size:
        lines.append(f"{number}: def handler_{turn}_{number}(request): return respond(request, code={number})")
        number += 1
    return "\n".join(lines)


def _rewrite(body: bytes, variant: str) -> bytes:
    request: dict[str, Any] = json.loads(body)
    messages = request["messages"]
    if variant == "clock":
        messages[0]["content"] = (
            f"Current time: {time.strftime('%H:%M:%S')}.{time.monotonic_ns() % 1000:03d}\n" + (messages[0]["content"])
        )
    elif variant == "prune":
        users = [index for index, message in enumerate(messages) if message["role"] == "user"]
        for index in users[:-2]:
            messages[index]["content"] = messages[index]["content"].split("\n", 1)[0] + " [older content pruned]"
    return json.dumps(request, ensure_ascii=False, separators=(",", ":")).encode()


def main() -> None:
    sigterm_as_interrupt()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--paste", type=int, default=1500, help="bytes of file text pasted in each message")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="cachet-bench-"))
    _setup_django(work / "data")

    from django.contrib.auth import get_user_model

    from chat.agent.loop import ReplyLoop
    from chat.agent.model import Timeouts, stream_chat
    from chat.tools import tool_list
    from sessions_app.models import LastRequest, ModelEndpoint, ModelRequest, Workspace
    from sessions_app.services.sessions import session_start
    from testing.drive import run_to_end
    from testing.llama import LlamaServer
    from testing.tiny_gguf import ModelShape, write_model

    shape = ModelShape(layers=args.layers, dim=args.dim, heads=max(1, args.dim // 64), ff=args.dim * 2, ctx=65536)
    model = write_model(work / "bench.gguf", shape)
    timeouts = Timeouts(connect=10, first_token=900, between_chunks=300)
    ctx = 65536
    print(f"model: {args.layers} layers x {args.dim}, {model.stat().st_size / 1e6:.1f} MB; turns: {args.turns}")

    servers = {
        name: LlamaServer(model, ctx_size=ctx, n_predict=2, threads=args.threads)
        for name in ("cachet", "clock", "prune")
    }
    for server in servers.values():
        server.start()
        warmup = b'{"model":"bench","messages":[{"role":"user","content":"warm up"}],"stream":true}'
        asyncio.run(stream_chat(base_url=server.base_url, api_key=None, body=warmup, timeouts=timeouts).complete())
    try:
        user, _ = get_user_model().objects.get_or_create(username="bench")
        folder = work / "ws"
        folder.mkdir()
        workspace = Workspace.objects.create(
            name=f"bench-{work.name}", folder=str(folder), open_to_everyone=True, from_shell=True
        )
        endpoint = ModelEndpoint.objects.create(
            name=f"bench-{work.name}", base_url=servers["cachet"].base_url, model="bench", context_window=ctx
        )
        session = session_start(
            owner=user,
            workspace=workspace,
            endpoint=endpoint,
            model_name="bench",
            tools=tool_list(allow_commands=False),
        )
        loop = ReplyLoop(session, client_timeouts=timeouts)
        figures = {name: Figures() for name in servers}
        header = f"{'turn':>4} | " + " | ".join(f"{name:>7} prompt/cached/ms" for name in servers)
        print(header)
        for turn in range(1, args.turns + 1):
            run_to_end(loop.send(f"Turn {turn}: look at this code and say what it does.\n{_paste(turn, args.paste)}"))
            request = ModelRequest.objects.filter(session=session).order_by("-id").first()
            assert request is not None
            body = bytes(LastRequest.objects.get(session=session).body)
            row = {"cachet": (request.prompt_tokens, request.cached_tokens, (request.timings or {}).get("prompt_ms"))}
            figures["cachet"].add(
                prompt=request.prompt_tokens,
                cached=request.cached_tokens,
                prompt_ms=(request.timings or {}).get("prompt_ms"),
                ttft=request.time_to_first_token,
            )
            for variant in ("clock", "prune"):
                answer = stream_chat(
                    base_url=servers[variant].base_url, api_key=None, body=_rewrite(body, variant), timeouts=timeouts
                )
                completion = asyncio.run(answer.complete())
                prompt_ms = (completion.timings or {}).get("prompt_ms")
                figures[variant].add(
                    prompt=completion.prompt_tokens,
                    cached=completion.cached_tokens,
                    prompt_ms=prompt_ms,
                    ttft=completion.time_to_first_token,
                )
                row[variant] = (completion.prompt_tokens, completion.cached_tokens, prompt_ms)
            print(
                f"{turn:>4} | " + " | ".join(f"{p or 0:>7}/{c or 0:>6}/{(ms or 0):>7.0f}" for p, c, ms in row.values())
            )
        print()
        base = figures["cachet"]
        columns = ("prompt tok", "cached tok", "cache hit", "prompt ms", "mean TTFT ms", "prompt ms ratio")
        widths = (11, 11, 9, 10, 13, 16)
        print(f"{'variant':>8} " + " ".join(f"{c:>{w}}" for c, w in zip(columns, widths, strict=True)))
        for name, fig in figures.items():
            hit = fig.cached_tokens / fig.prompt_tokens if fig.prompt_tokens else 0.0
            ratio = fig.prompt_ms / base.prompt_ms if base.prompt_ms else 0.0
            print(
                f"{name:>8} {fig.prompt_tokens:>11} {fig.cached_tokens:>11} {hit:>9.1%} {fig.prompt_ms:>10.0f} "
                f"{fig.mean_ttft_ms:>13.0f} {ratio:>15.2f}x"
            )
    finally:
        for server in servers.values():
            server.stop()


if __name__ == "__main__":
    main()
