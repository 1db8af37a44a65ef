"""Stress harness: the tools racing a workspace folder that is swapped for a symlink to an outside folder.

A workspace holds a real folder ``sub`` and a symlink ``.parked`` to a folder outside the workspace.
An attacker exchanges the two names atomically, again and again (``renameat2(RENAME_EXCHANGE)``), while
the tools work on paths below ``sub``: read, write (new files, some in new folders), edit, list, glob
and apply_patch (add, update, delete). The outside folder mirrors ``sub``'s names and every outside file
holds a marker string (one is named after it), so any outside content in a result is seen. It prints
the operations run per tool with their rate, and the escapes: results holding the marker, and files
created, changed or deleted outside.

Run it against this tree or another checkout of Cachet (e.g. ``git archive main`` unpacked), with or
without the attacker:

    python bench/path_race.py [--operations 20000] [--src DIR] [--swapper process|thread|none]
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

MARKER = "OUTSIDE-MARKER-7f3a91"
FILES = 16
RENAME_EXCHANGE = 2
AT_FDCWD = -100
SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276}
SCHEDULE = ("read", "write", "edit", "list", "read", "glob", "apply_patch", "write")
Call = Callable[[str, str], object]

_SWAPPER = """
import ctypes, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
a, b, number = sys.argv[1].encode(), sys.argv[2].encode(), int(sys.argv[3])
swaps = 0
def stop(*_):
    print(swaps, flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
while True:
    if libc.syscall(number, -100, a, -100, b, 2) == 0:
        swaps += 1
"""


@dataclass(frozen=True)
class Layout:
    """The folders of one run: the workspace, its swapped folder and its parked symlink, and the outside."""

    base: Path
    workspace: Path
    outside: Path

    @property
    def folder(self) -> Path:
        return self.workspace / "sub"

    @property
    def parked(self) -> Path:
        return self.workspace / ".parked"


@dataclass
class Tally:
    """What a run did: operations and seconds per tool, and the results that held outside content."""

    operations: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    leaked: list[str] = field(default_factory=list)
    refused: int = 0
    failed: int = 0

    @property
    def total(self) -> int:
        return sum(self.operations.values())

    def rate(self, tool: str) -> float:
        seconds = self.seconds.get(tool, 0.0)
        return self.operations.get(tool, 0) / seconds if seconds else 0.0

    def cpu_micros(self, tool: str) -> float:
        """CPU time (user and system, of the calling thread) per call: steadier than the rate on a busy box."""
        operations = self.operations.get(tool, 0)
        return self.cpu_seconds.get(tool, 0.0) * 1e6 / operations if operations else 0.0


@dataclass(frozen=True)
class OutsideChanges:
    """How the outside folder differs from its snapshot taken before the run."""

    created: list[str]
    changed: list[str]
    deleted: list[str]

    @property
    def total(self) -> int:
        return len(self.created) + len(self.changed) + len(self.deleted)


def make_layout(base: Path) -> Layout:
    """The workspace and the outside folder of a run, below ``base``."""
    workspace, outside = base / "ws", base / "outside"
    layout = Layout(base, workspace, outside)
    for folder in (layout.folder / "deep", layout.folder / "made", outside / "deep", outside / "made"):
        folder.mkdir(parents=True)
    for index in range(FILES):
        (layout.folder / f"r{index}.txt").write_text(f"inside {index}\n" * 20)
        (layout.folder / f"e{index}.txt").write_text("value: \n")
        (layout.folder / f"g{index}.txt").write_text("start\n")
        (outside / f"r{index}.txt").write_text(f"{MARKER} {index}\n" * 20)
        (outside / f"e{index}.txt").write_text(f"value: \n{MARKER}\n")
        (outside / f"g{index}.txt").write_text(f"{MARKER}\n")
    (outside / f"leak-{MARKER}.txt").write_text(MARKER + "\n")
    (outside / "deep" / f"{MARKER}.md").write_text(MARKER + "\n")
    layout.parked.symlink_to(outside)
    return layout


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every entry below ``folder``: a file's bytes, ``None`` for anything else."""
    found: dict[str, bytes | None] = {}
    for path in sorted(folder.rglob("*")):
        found[str(path.relative_to(folder))] = path.read_bytes() if path.is_file() else None
    return found


def outside_changes(before: dict[str, bytes | None], folder: Path) -> OutsideChanges:
    """What was created, changed or deleted in ``folder`` since ``before``."""
    after = snapshot(folder)
    return OutsideChanges(
        created=sorted(set(after) - set(before)),
        changed=sorted(name for name in set(after) & set(before) if after[name] != before[name]),
        deleted=sorted(set(before) - set(after)),
    )


def renameat2_number() -> int | None:
    """The syscall number of ``renameat2`` on this machine, or ``None`` where it is not known."""
    return SYS_RENAMEAT2.get(platform.machine())


def exchange(first: Path, second: Path) -> None:
    """Swap two names atomically (``renameat2(RENAME_EXCHANGE)``); ``OSError`` where the kernel cannot."""
    number = renameat2_number()
    if number is None:
        raise OSError(errno.ENOSYS, "renameat2 is not known on " + platform.machine())
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, AT_FDCWD, os.fsencode(first), AT_FDCWD, os.fsencode(second), RENAME_EXCHANGE) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def can_exchange(folder: Path) -> bool:
    """Whether ``renameat2(RENAME_EXCHANGE)`` works in ``folder``."""
    first, second = folder / ".probe-a", folder / ".probe-b"
    first.mkdir()
    second.symlink_to(first)
    try:
        exchange(first, second)
    except OSError:
        return False
    finally:
        for path in (first, second):
            if path.is_symlink():
                path.unlink()
            elif path.exists():
                path.rmdir()
    return True


@contextmanager
def swapping(layout: Layout, mode: str) -> Iterator[list[int]]:
    """Keep exchanging ``sub`` and ``.parked`` while the block runs (``mode``: thread, process or none).

    Yields a list holding the number of swaps made, filled in at the end, when the real folder is named
    ``sub`` again.
    """
    swaps = [0]
    stop = threading.Event()
    worker: threading.Thread | None = None
    process: subprocess.Popen[str] | None = None
    if mode == "thread":

        def loop() -> None:
            while not stop.is_set():
                exchange(layout.folder, layout.parked)
                swaps[0] += 1

        worker = threading.Thread(target=loop, daemon=True)
        worker.start()
    elif mode == "process":
        arguments = [str(layout.folder), str(layout.parked), str(renameat2_number())]
        process = subprocess.Popen([sys.executable, "-c", _SWAPPER, *arguments], stdout=subprocess.PIPE, text=True)
        assert process.stdout is not None
        process.stdout.readline()
    try:
        yield swaps
    finally:
        stop.set()
        if worker is not None:
            worker.join()
        if process is not None:
            process.terminate()
            output, _ = process.communicate()
            swaps[0] = int(output.strip() or 0)
        if layout.folder.is_symlink():
            exchange(layout.folder, layout.parked)


class Operations:
    """The calls of a run, in a fixed schedule: paths below ``sub``, new names numbered by the operation."""

    def __init__(self) -> None:
        self.added: list[str] = []

    def next(self, number: int) -> tuple[str, dict[str, object]]:
        tool = SCHEDULE[number % len(SCHEDULE)]
        index = number % FILES
        if tool == "read":
            return tool, {"path": f"sub/r{index}.txt"}
        if tool == "write":
            path = f"sub/made/n{number}/w.txt" if number % 3 == 0 else f"sub/deep/w{number}.txt"
            return tool, {"path": path, "content": f"written {number}\n"}
        if tool == "edit":
            return tool, {"path": f"sub/e{index}.txt", "old_string": "value: ", "new_string": "value: x"}
        if tool == "list":
            return tool, {"path": "sub"}
        if tool == "glob":
            return tool, {"pattern": "*.txt" if number % 2 else "*/*.md", "path": "sub"}
        return tool, {"patch": self._patch(number, index)}

    def _patch(self, number: int, index: int) -> str:
        kind = number % 3
        if kind == 0:
            name = f"sub/deep/p{number}.txt"
            self.added.append(name)
            body = f"*** Add File: {name}\n+patched {number}"
        elif kind == 1 and self.added:
            body = f"*** Delete File: {self.added.pop(0)}"
        else:
            body = f"*** Update File: sub/g{index}.txt\n@@\n+line {number}"
        return f"*** Begin Patch\n{body}\n*** End Patch"


def run_operations(call: Call, operations: int, seconds: float | None = None) -> Tally:
    """Run ``operations`` calls (or as many as fit in ``seconds``), timing each tool and keeping leaks."""
    tally = Tally()
    schedule = Operations()
    deadline = None if seconds is None else time.monotonic() + seconds
    for number in range(operations):
        if deadline is not None and time.monotonic() > deadline:
            break
        tool, arguments = schedule.next(number)
        started, cpu_started = time.perf_counter(), time.thread_time()
        outcome = call(tool, json.dumps(arguments))
        tally.seconds[tool] = tally.seconds.get(tool, 0.0) + time.perf_counter() - started
        tally.cpu_seconds[tool] = tally.cpu_seconds.get(tool, 0.0) + time.thread_time() - cpu_started
        tally.operations[tool] = tally.operations.get(tool, 0) + 1
        text = repr(outcome)
        if text.startswith("ErrorOutcome("):
            tally.failed += 1
        if "outside the workspace" in text:
            tally.refused += 1
        if MARKER in text:
            tally.leaked.append(f"{tool} {json.dumps(arguments)}: {text[:300]}")
    return tally


def tool_caller(workspace: Path) -> Call:
    """A function running one tool call of the Cachet found on ``sys.path`` in ``workspace``."""
    from chat.tools import TOOLS, ToolContext, call_tool
    from sessions_app.hygiene.config import context_config

    root = Path(sys.modules["chat"].__file__ or ".").resolve().parent.parent
    with (root / "prompts" / "loop.json").open(encoding="utf-8") as handle:
        config = context_config(json.load(handle)["context"])
    context = ToolContext(
        root=workspace,
        config=config,
        mode="edit",
        tools=tuple(tool.name for tool in TOOLS if tool.category != "command"),
        allow_commands=False,
        last_seen_sha=lambda path: None,
        recall=lambda number: None,
    )

    def call(tool: str, arguments: str) -> object:
        return call_tool(tool, arguments, context)[1]

    return call


def race(base: Path, operations: int, swapper: str, seconds: float | None = None) -> tuple[Tally, OutsideChanges, int]:
    """One run in a fresh layout below ``base``: (what the tools did, what changed outside, swaps made)."""
    layout = make_layout(base)
    before = snapshot(layout.outside)
    call = tool_caller(layout.workspace.resolve())
    with swapping(layout, swapper) as swaps:
        tally = run_operations(call, operations, seconds)
    return tally, outside_changes(before, layout.outside), swaps[0]


def _report(label: str, tally: Tally, changes: OutsideChanges, swaps: int, source: str) -> None:
    print(
        f"{label}: {tally.total} operations on {source}, {swaps} swaps; "
        f"{tally.total - tally.failed} succeeded, {tally.refused} refused as outside"
    )
    for tool in sorted(tally.operations):
        print(
            f"  {tool:<12} {tally.operations[tool]:>7} ops  {tally.rate(tool):>9.0f} ops/s"
            f"  {tally.cpu_micros(tool):>7.0f} µs CPU/op"
        )
    escapes = len(tally.leaked) + changes.total
    print(
        f"  escapes: {escapes} of {tally.total} operations — results with outside content {len(tally.leaked)}, "
        f"files created outside {len(changes.created)}, changed {len(changes.changed)}, deleted {len(changes.deleted)}"
    )
    for line in tally.leaked[:3]:
        print("    leaked:", line)
    for name in changes.created[:3]:
        print("    created outside:", name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--operations", type=int, default=20_000)
    parser.add_argument("--seconds", type=float, default=None, help="stop earlier when this time is up")
    parser.add_argument("--src", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--swapper", choices=("process", "thread", "none", "both"), default="both")
    options = parser.parse_args()
    source = options.src.resolve()
    sys.path.insert(0, str(source))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cachet.settings")
    modes = ("none", "process") if options.swapper == "both" else (options.swapper,)
    with tempfile.TemporaryDirectory(prefix="cachet-race-") as scratch:
        base = Path(scratch).resolve()
        if "none" not in modes and not can_exchange(base):
            print("renameat2(RENAME_EXCHANGE) is not available here: nothing to race.")
            return
        for mode in modes:
            run_base = base / mode
            run_base.mkdir()
            tally, changes, swaps = race(run_base, options.operations, mode, options.seconds)
            label = "quiet (no swapping)" if mode == "none" else f"racing ({mode} swapper)"
            _report(label, tally, changes, swaps, str(source))


if __name__ == "__main__":
    main()
