"""Benchmark: ``grep`` on ripgrep (``new``) against the Python-``re`` grep Cachet ran before (``old``).

Each measurement runs in a fresh Python process, so that a search that never ends can be killed (the old
grep ran in the server process, where nothing could end it) and peak memory is that run's own. A second
thread in that process wakes every 10 ms; its longest wait is how long the grep kept the interpreter lock
from everyone else in the server (another person's page, the reply loops).

- ``catastrophic``: ``(a+)+$`` over one file holding ``"a" * N + "!"``, for several N.
- ``200 MB``: a workspace of 200 files of 1 MB of source lines, one pattern with 200 matches.

    python bench/grep_bench.py [--timeout 30] [--lengths 20,24,27,40] [--megabytes 200]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CATASTROPHIC = "(a+)+$"
HANDLER_PATTERN = r"def \w+_handler\("


def old_grep(root: str, pattern: str) -> list[str]:
    """The grep Cachet ran before ripgrep (commit cb2dbf4): every file below ``root`` (symlinks not
    entered), binary ones (a NUL in the first 8 KiB) skipped, each line decoded and searched with ``re``."""
    regex = re.compile(pattern)
    found: list[str] = []
    for path in sorted(_files_below(root)):
        with open(path, "rb") as handle:
            if b"\x00" in handle.read(8192):
                continue
            handle.seek(0)
            for number, raw in enumerate(handle, start=1):
                line = raw.removesuffix(b"\n")
                if regex.search(line.removesuffix(b"\r").decode("utf-8", "replace")):
                    found.append(f"{path}:{number}: {line.decode('utf-8', 'replace')}")
    return found


def _files_below(folder: str) -> Iterator[str]:
    pending = [folder]
    while pending:
        with os.scandir(pending.pop()) as listing:
            for entry in listing:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    yield entry.path


def new_grep(root: str, pattern: str) -> list[str]:
    """Cachet's ``grep`` tool as the model calls it."""
    from chat.tools import ToolContext, grep
    from sessions_app.hygiene.config import context_config

    with (ROOT / "prompts" / "loop.json").open(encoding="utf-8") as handle:
        config = context_config(json.load(handle)["context"])
    ctx = ToolContext(
        root=Path(root),
        config=config,
        mode="plan",
        tools=("grep",),
        allow_commands=False,
        last_seen_sha=lambda path: None,
        recall=lambda number: None,
        grep_timeout=3600,
    )
    body: str = getattr(grep({"pattern": pattern}, ctx), "body", "")
    return [] if body == config.text("no_matches") else body.split("\n")


def worker(variant: str, root: str, pattern: str) -> None:
    """Run one grep in this process and print its figures as JSON."""
    if variant == "new":
        import chat.tools  # noqa: F401  (imported before the baseline, like in the server)
    longest_stall = 0.0
    rg_peak_kb = 0
    done = threading.Event()

    def ticker() -> None:
        nonlocal longest_stall, rg_peak_kb
        while not done.is_set():
            before = time.monotonic()
            time.sleep(0.01)
            longest_stall = max(longest_stall, time.monotonic() - before - 0.01)
            rg_peak_kb = max(rg_peak_kb, _children_peak_kb())

    thread = threading.Thread(target=ticker, daemon=True)
    thread.start()
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    lines = (old_grep if variant == "old" else new_grep)(root, pattern)
    seconds = time.monotonic() - started
    done.set()
    thread.join()
    print(
        json.dumps(
            {
                "seconds": seconds,
                "matches": len(lines),
                "python_growth_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - baseline,
                "python_peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                "rg_peak_kb": rg_peak_kb,
                "longest_stall": longest_stall,
            }
        )
    )


def _children_peak_kb() -> int:
    """The largest peak resident size (``VmHWM``) among this process's running ``rg`` children."""
    peak = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            if name != "rg" or int(stat[stat.rindex(")") + 2 :].split()[1]) != os.getpid():
                continue
            status = (entry / "status").read_text()
        except (OSError, ValueError):
            continue
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                peak = max(peak, int(line.split()[1]))
    return peak


def measure(variant: str, root: Path, pattern: str, timeout: float) -> dict[str, float] | None:
    """One worker's figures, or ``None`` when it was still searching after ``timeout`` seconds."""
    command = [sys.executable, __file__, "--worker", variant, "--root", str(root), "--pattern", pattern]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=True)
    except subprocess.TimeoutExpired:
        return None
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def make_source_workspace(folder: Path, megabytes: int) -> None:
    """``megabytes`` files of about 1 MB of Python-like lines; one line of each file defines a handler."""
    lines = [f"    value_{n} = compute(value_{n - 1}, factor={n % 7})  # step {n}\n" for n in range(1, 400)]
    block = "".join(lines).encode()
    for index in range(megabytes):
        with (folder / f"module_{index:03d}.py").open("wb") as handle:
            handle.write(f"def on_{index}_handler(event):\n".encode())
            for _ in range((1 << 20) // len(block)):
                handle.write(block)


def _seconds(figures: dict[str, float] | None, timeout: float) -> str:
    return f"> {timeout:g} s" if figures is None else f"{figures['seconds']:.3f} s"


def _stall(figures: dict[str, float] | None, timeout: float) -> str:
    return f"> {timeout:g} s" if figures is None else f"{figures['longest_stall']:.3f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds before a search is called endless")
    parser.add_argument("--lengths", default="20,24,27,40", help="the N of the catastrophic files")
    parser.add_argument("--megabytes", type=int, default=200)
    parser.add_argument("--worker", choices=["old", "new"], help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--pattern", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.worker:
        worker(options.worker, options.root, options.pattern)
        return
    timeout = options.timeout
    with tempfile.TemporaryDirectory(prefix="grep-bench-") as scratch:
        print(f"catastrophic: {CATASTROPHIC} over one file holding 'a' * N + '!'")
        print("| N | old (Python re) | new (ripgrep) | old: longest stall of another thread | new: longest stall |")
        print("| ---: | ---: | ---: | ---: | ---: |")
        for length in (int(item) for item in options.lengths.split(",")):
            folder = Path(scratch) / f"catastrophic_{length}"
            folder.mkdir()
            (folder / "a.txt").write_text("a" * length + "!\n")
            old = measure("old", folder, CATASTROPHIC, timeout)
            new = measure("new", folder, CATASTROPHIC, timeout)
            print(
                f"| {length} | {_seconds(old, timeout)} | {_seconds(new, timeout)} "
                f"| {_stall(old, timeout)} | {_stall(new, timeout)} |"
            )
        folder = Path(scratch) / "source"
        folder.mkdir()
        make_source_workspace(folder, options.megabytes)
        size = sum(path.stat().st_size for path in folder.iterdir())
        print()
        print(f"workspace: {len(list(folder.iterdir()))} files, {size / 1e6:.0f} MB; pattern {HANDLER_PATTERN}")
        print("| variant | time | matches | Python peak RSS | its growth during grep | rg peak RSS | longest stall |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for variant, label in (("old", "old (Python re)"), ("new", "new (ripgrep)")):
            figures = measure(variant, folder, HANDLER_PATTERN, max(timeout, 600))
            if figures is None:
                print(f"| {label} | > {max(timeout, 600):g} s | | | | | |")
                continue
            rg_peak = f"{figures['rg_peak_kb'] / 1024:.1f} MB" if figures["rg_peak_kb"] else "—"
            print(
                f"| {label} | {figures['seconds']:.2f} s | {figures['matches']:.0f} "
                f"| {figures['python_peak_kb'] / 1024:.1f} MB | {figures['python_growth_kb'] / 1024:.1f} MB "
                f"| {rg_peak} | {figures['longest_stall']:.3f} s |"
            )


if __name__ == "__main__":
    main()
