"""Benchmark: rendering a step's markdown while it streams, block by block (``blocks``, what the relay does)
against rendering the whole text so far each time (``whole``).

A reply of paragraphs, lists, a table, math and code blocks streams in pieces of ``--piece`` characters (one
piece per render: at most every 100 ms, a piece of 40 characters is about 100 tokens a second); after each
piece both ways render what came so far. Printed: CPU time per render (mean, 95th percentile, max), bytes of
page changes per render, and the ratios.

    python bench/live_render_bench.py [--repeat 3] [--piece 40] [--sections 12]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cachet.settings")


def reply(sections: int) -> str:
    parts = []
    for n in range(sections):
        parts.append(
            f"## Part {n}\n\nThe function `handle_{n}` reads the **configuration** and returns *early* when the "
            f"cache holds the key; its cost is $O(n \\log n)$ for $n$ entries, and\n\n$$\n\\sum_{{i=1}}^{{{n + 2}}} "
            f"i^2 = \\frac{{k(k+1)(2k+1)}}{{6}}\n$$\n\n- first, it checks the key\n- then it loads the file\n"
            f"- last, it writes the result\n\n| step | time |\n|---|---|\n| read | {n} ms |\n| write | 2 ms |\n\n"
            "```python\n"
            + "".join(
                f"def handle_{n}_{m}(key: str) -> str:\n    return cache.get(key) or load(key)\n\n" for m in range(8)
            )
            + "```\n\n"
        )
    return "".join(parts)


def measure(text: str, piece: int) -> dict[str, list[float]]:
    from chat.web.live_markdown import LiveMarkdown, piece_puts
    from chat.web.messages import pack
    from chat.web.rendering import render_markdown

    costs: dict[str, list[float]] = {"whole": [], "blocks": [], "whole_bytes": [], "blocks_bytes": []}
    live = LiveMarkdown()
    for end in range(piece, len(text) + piece, piece):
        so_far = text[:end]
        started = time.process_time()
        html = render_markdown(so_far)
        costs["whole"].append(time.process_time() - started)
        costs["whole_bytes"].append(len(html.encode()))
        started = time.process_time()
        rendered = live.advance(so_far)
        costs["blocks"].append(time.process_time() - started)
        costs["blocks_bytes"].append(sum(len(message.encode()) for message in pack(piece_puts(1, rendered))))
    return costs


def p95(values: list[float]) -> float:
    return sorted(values)[int(len(values) * 0.95)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--piece", type=int, default=40)
    parser.add_argument("--sections", type=int, default=12)
    args = parser.parse_args()
    import django

    django.setup()
    text = reply(args.sections)
    print(f"reply: {len(text):,} characters, {len(text) // args.piece + 1:,} renders of {args.piece}-character pieces")
    runs = [measure(text, args.piece) for _ in range(args.repeat)]
    best = min(runs, key=lambda run: sum(run["blocks"]) + sum(run["whole"]))
    rows = []
    for name in ("whole", "blocks"):
        ms = [value * 1000 for value in best[name]]
        sent = best[f"{name}_bytes"]
        rows.append((name, statistics.mean(ms), p95(ms), max(ms), sum(ms), statistics.mean(sent), max(sent)))
    print()
    print("| way | mean ms | p95 ms | max ms | total CPU s | mean bytes | max bytes |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, mean, pct, top, total, mean_bytes, max_bytes in rows:
        print(
            f"| {name} | {mean:.2f} | {pct:.2f} | {top:.2f} | {total / 1000:.2f} | {mean_bytes:,.0f} | {max_bytes:,} |"
        )
    whole, blocks = rows
    print()
    print(
        f"whole / blocks: mean CPU {whole[1] / blocks[1]:.1f}×, p95 {whole[2] / blocks[2]:.1f}×, "
        f"max {whole[3] / blocks[3]:.1f}×, bytes per render {whole[5] / blocks[5]:.1f}×"
    )


if __name__ == "__main__":
    main()
