"""Benchmark: what it costs to know a request's size in tokens before sending it, and how far the estimate is off.

A request grows as a reply does: Cachet's system prompt and tools, a message, then steps that each read a
source file of this project, until the prompt reaches about 10k, 50k and 100k tokens. For each size it prints
the time to count the request with the server's own chat template and tokenizer (``/apply-template`` then
``/tokenize``, as ``chat.agent.budget.RequestCounter`` asks them, nothing kept between runs) and the time of
the estimate (the last request's usage plus the new bytes at the session's measured bytes per token), in ms
per request, and the estimate's error against the server's count: for the next step of the reply (the
estimate as Cachet makes it, knowing the previous request's usage) and cold (the default bytes per token,
before any usage). Two tokenizers: the real llama.cpp server (xllamacpp) on the generated model, whose
vocabulary is byte-level, and the scripted server's word-like one.

    python bench/count_bench.py [--sizes 10000,50000,100000] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testing.interrupts import sigterm_as_interrupt  # noqa: E402


def _setup_django(data: Path) -> None:
    os.environ["CACHET_DATA"] = str(data)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cachet.settings")
    import django

    django.setup()


def _sources() -> Iterator[tuple[str, str]]:
    """This project's Python files, as a read shows them, again and again."""
    files = sorted(
        path for folder in ("chat", "sessions_app", "cachet", "tests") for path in (ROOT / folder).rglob("*.py")
    )
    while True:
        for path in files:
            text = path.read_text(encoding="utf-8")
            lines = text.split("\n")[:400]
            yield str(path.relative_to(ROOT)), "\n".join(f"{number}: {line}" for number, line in enumerate(lines, 1))


@dataclass
class Request:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    body: bytes


def growing_requests(limit_bytes: int) -> Iterator[Request]:
    """The requests of one reply, one step more each, up to ``limit_bytes``."""
    from chat.tools import tool_list
    from sessions_app import prompts
    from sessions_app.selectors.requests import dumps

    tools = tool_list(allow_commands=True)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": prompts.system_prompt()},
        {"role": "user", "content": "Read the project's sources and tell me how requests are built."},
    ]
    head = {"model": "tiny", "stream": True, "stream_options": {"include_usage": True}, "tools": tools}
    for step, (path, shown) in enumerate(_sources(), start=1):
        body = dumps({**head, "messages": messages}).encode()
        yield Request(list(messages), tools, body)
        if len(body) > limit_bytes:
            return
        call = {
            "id": f"call_{step}",
            "type": "function",
            "function": {"name": "read", "arguments": dumps({"path": path})},
        }
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{step}", "content": f"[#{step:04x} {path}]\n{shown}"})


def _ms(action: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        action()
        times.append(1000 * (time.perf_counter() - started))
    return statistics.median(times)


@dataclass
class Row:
    tokenizer: str
    tokens: int
    server_ms: float
    template_ms: float
    estimate_ms: float
    next_error: float
    cold_error: float
    bytes_per_token: float


def measure(name: str, base_url: str, *, sizes: list[int], bytes_per_token_guess: float, runs: int) -> list[Row]:
    from chat.agent import server_api
    from chat.agent.budget import estimate_tokens
    from sessions_app import prompts

    default_ratio = prompts.loop_settings().bytes_per_token_before_usage

    def server_count(request: Request) -> int:
        prompt = server_api.apply_template(base_url, request.messages, tools=request.tools, timeout=120)
        assert prompt is not None, f"{base_url} offers no /apply-template"
        tokens = server_api.tokenize(base_url, prompt, timeout=120)
        assert tokens is not None, f"{base_url} offers no /tokenize"
        return len(tokens)

    rows = []
    for size in sizes:
        requests = list(growing_requests(int(size * bytes_per_token_guess)))
        counted = [server_count(request) for request in requests]
        bytes_seen = tokens_seen = 0
        errors = []
        for previous, current, previous_tokens, current_tokens in zip(
            requests, requests[1:], counted, counted[1:], strict=False
        ):
            bytes_seen += len(previous.body)
            tokens_seen += previous_tokens
            guess = estimate_tokens(
                current.body,
                last_body=previous.body,
                last_tokens=previous_tokens,
                bytes_per_token=bytes_seen / tokens_seen,
            )
            errors.append((guess - current_tokens) / current_tokens)
        last, before = requests[-1], requests[-2]
        ratio = bytes_seen / tokens_seen
        cold = estimate_tokens(last.body, last_body=b"", last_tokens=0, bytes_per_token=default_ratio)

        def estimate(
            last: Request = last, before: Request = before, tokens: int = counted[-2], ratio: float = ratio
        ) -> int:
            return estimate_tokens(last.body, last_body=before.body, last_tokens=tokens, bytes_per_token=ratio)

        rows.append(
            Row(
                tokenizer=name,
                tokens=counted[-1],
                server_ms=_ms(lambda last=last: server_count(last), runs),  # type: ignore[misc]
                template_ms=_ms(
                    lambda last=last: server_api.apply_template(  # type: ignore[misc]
                        base_url, last.messages, tools=last.tools, timeout=120
                    ),
                    runs,
                ),
                estimate_ms=_ms(estimate, runs * 20),
                next_error=errors[-1],
                cold_error=(cold - counted[-1]) / counted[-1],
                bytes_per_token=len(last.body) / counted[-1],
            )
        )
        worst = max(errors, key=abs)
        print(
            f"  {name}: {len(requests)} requests up to {counted[-1]:,} tokens; next-step estimate error over the "
            f"reply: mean {statistics.mean(abs(e) for e in errors):.2%}, worst {worst:+.2%}",
            flush=True,
        )
    return rows


def main() -> None:
    sigterm_as_interrupt()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,50000,100000", help="prompt sizes in tokens, comma-separated")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per count (the median is shown)")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]

    with tempfile.TemporaryDirectory(prefix="count-bench-") as scratch:
        data = Path(scratch)
        _setup_django(data)
        from testing.llama import LlamaServer
        from testing.scripted_server import ScriptedServer
        from testing.tiny_gguf import ModelShape, write_model

        model = write_model(data / "tiny.gguf", ModelShape(ctx=4096))
        rows: list[Row] = []
        print("counting on the real llama.cpp server (byte-level vocabulary) …", flush=True)
        with LlamaServer(model, ctx_size=4096, n_predict=1, alias="tiny", verbosity=0) as llama:
            rows += measure("llama.cpp", llama.base_url, sizes=sizes, bytes_per_token_guess=1.0, runs=args.runs)
        print("counting on the scripted server (word-like tokens) …", flush=True)
        with ScriptedServer(n_ctx=10**9) as scripted:
            rows += measure("scripted", scripted.base_url, sizes=sizes, bytes_per_token_guess=3.6, runs=args.runs)

    print()
    header = (
        f"{'tokenizer':<10} {'prompt tokens':>13} {'bytes/token':>11} {'server count ms':>15} {'of it template':>14} "
        f"{'estimate ms':>11} "
        f"{'server/estimate':>15} {'next-step error':>15} {'cold error':>10}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        ratio = row.server_ms / row.estimate_ms if row.estimate_ms else float("inf")
        print(
            f"{row.tokenizer:<10} {row.tokens:>13,} {row.bytes_per_token:>11.2f} {row.server_ms:>15.1f} "
            f"{row.template_ms:>14.1f} {row.estimate_ms:>11.3f} {ratio:>14.0f}x {row.next_error:>+15.2%} "
            f"{row.cold_error:>+10.1%}"
        )
    print(json.dumps({"rows": [row.__dict__ for row in rows]}))


if __name__ == "__main__":
    main()
