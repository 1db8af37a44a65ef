"""Benchmark: inputs built to be slow, and how long Cachet takes on each. The tests run the same inputs and
check what comes out; how long that takes is measured here, against the bound each test asserted before the
suite ran in parallel on loaded machines (issue 23).

- ``cap``: ``cap_text`` of 100 MB of lines, then of one line of 100 MB (bound 10 s for both);
- ``math``: ``render_markdown`` of deeply nested or repeated TeX (bound 5 s each);
- ``read``: ``read`` of the last lines of a 200 MB file, and of three in its middle (bound 20 s).

    python bench/bounds_bench.py

Exits 1 when a figure is over its bound.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testing.interrupts import sigterm_as_interrupt  # noqa: E402

MATH = {
    "left-right x300": "\\left(" * 300 + "x" + "\\right)" * 300,
    "big x800": "\\big(" * 800,
    "Bigg x600": "\\Bigg(" * 600,
    "braces x1999": "{" * 1999 + "x" + "}" * 1999,
    "sqrt x600": "\\sqrt{" * 600 + "x" + "}" * 600,
}


def timed(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def cap() -> float:
    from sessions_app.hygiene import cap_text
    from sessions_app.hygiene.config import context_config

    config = context_config(json.loads((ROOT / "prompts" / "loop.json").read_text(encoding="utf-8"))["context"])
    lines = ("x" * 99 + "\n") * 1_000_000
    one_line = "y" * 100_000_000
    return timed(
        lambda: [cap_text(body, full_id="#0020", limits=config.cap, config=config) for body in (lines, one_line)]
    )


def read(folder: Path) -> float:
    from chat.tools import TOOLS, ToolContext
    from chat.tools.read import read as read_tool
    from sessions_app.hygiene.config import context_config

    config = context_config(json.loads((ROOT / "prompts" / "loop.json").read_text(encoding="utf-8"))["context"])
    block = (b"0123456789" * 9 + b"abcdefghi\n") * 10_000
    with (folder / "huge.log").open("wb") as handle:
        for _ in range(200):
            handle.write(block)
        handle.write(b"last line without newline")
    ctx = ToolContext(
        root=folder,
        config=config,
        mode="full",
        tools=tuple(tool.name for tool in TOOLS),
        allow_commands=False,
        last_seen_sha=lambda path: None,
        recall=lambda number: None,
    )
    return timed(
        lambda: (
            read_tool({"path": "huge.log", "offset": 1_999_990}, ctx),
            read_tool({"path": "huge.log", "offset": 1_000_000, "limit": 3}, ctx),
        )
    )


def main() -> int:
    sigterm_as_interrupt()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cachet.settings")
    with tempfile.TemporaryDirectory(prefix="cachet-bounds-") as data:
        os.environ.setdefault("CACHET_DATA", data)
        import django

        django.setup()
        from chat.web.rendering import render_markdown

        figures = [("cap 100 MB of lines and one 100 MB line", cap(), 10.0)]
        figures += [
            (f"math {name}", timed(functools.partial(render_markdown, f"$${source}$$")), 5.0)
            for name, source in MATH.items()
        ]
        folder = Path(data) / "ws"
        folder.mkdir()
        figures.append(("read the end and the middle of 200 MB", read(folder.resolve()), 20.0))
    over = 0
    for name, seconds, bound in figures:
        over += seconds > bound
        print(f"{name:45s} {seconds:7.3f} s  (bound {bound:g} s){'  OVER' if seconds > bound else ''}")
    return 1 if over else 0


if __name__ == "__main__":
    raise SystemExit(main())
