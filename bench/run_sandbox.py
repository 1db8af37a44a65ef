"""Benchmark: what the sandbox costs one ``run("true")``.

Runs ``true`` through the real ``run`` tool (``call_tool``), side by side in one run:

- ``unsandboxed``: what ``run`` did before the sandbox: ``/bin/sh -c`` as the server's user, in the
  workspace, its output read from a pipe;
- ``sandboxed``: ``run`` as it is, with no network (a new network namespace);
- ``sandboxed, network``: ``run`` in a workspace that allows the network (the server's namespace).

The first sandboxed call of a process also tries bubblewrap once (``--help`` and a trivial sandbox);
that call is timed on its own. Prints the median, mean and 90th percentile in milliseconds, and how
the process limit is applied here (a cgroup, or RLIMIT_NPROC), and who commands run as (as root, the sandbox
user, through ``setpriv``).

    python bench/run_sandbox.py [--calls 200]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chat.tools import (  # noqa: E402
    ToolContext,
    call_tool,
    sandbox,
)
from chat.tools.context import Sandbox  # noqa: E402
from sessions_app.hygiene.config import context_config  # noqa: E402
from sessions_app.hygiene.outcomes import ErrorOutcome, OutputOutcome  # noqa: E402


def unsandboxed_true(ctx: ToolContext) -> str:
    """``run("true")`` as it was before the sandbox, minus nothing but the sandbox."""
    root = str(ctx.root)
    environment = {"PATH": os.environ.get("PATH", os.defpath), "HOME": root, "TERM": "dumb", "PWD": root}
    done = subprocess.run(
        ["/bin/sh", "-c", "true"],
        cwd=root,
        env=environment,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        check=False,
    )
    return done.stdout.decode("utf-8", "replace")


def sandboxed_true(ctx: ToolContext) -> str:
    _, outcome = call_tool("run", json.dumps({"command": "true"}), ctx)
    if isinstance(outcome, ErrorOutcome):
        return outcome.message
    assert isinstance(outcome, OutputOutcome)
    return outcome.text


def timed(call: Callable[[], str], calls: int) -> list[float]:
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        answer = call()
        times.append((time.perf_counter() - started) * 1000)
        assert answer == "", answer
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    options = parser.parse_args()
    with (ROOT / "prompts" / "loop.json").open(encoding="utf-8") as handle:
        config = context_config(json.load(handle)["context"])
    with tempfile.TemporaryDirectory(prefix="cachet-bench-") as folder:
        os.chmod(folder, 0o711)
        settings = Sandbox(user=os.environ.get("CACHET_SANDBOX_USER") or "cachet-sandbox")
        who = sandbox.give_to_commands(folder, settings, config)
        base = ToolContext(
            root=Path(folder).resolve(),
            sandbox=settings,
            config=config,
            mode="full",
            tools=("run",),
            allow_commands=True,
            last_seen_sha=lambda path: None,
            recall=lambda number: None,
        )
        networked = ToolContext(**{**base.__dict__, "allow_network": True})
        started = time.perf_counter()
        sandboxed_true(base)
        first = (time.perf_counter() - started) * 1000
        rows = {
            "unsandboxed": timed(lambda: unsandboxed_true(base), options.calls),
            "sandboxed": timed(lambda: sandboxed_true(base), options.calls),
            "sandboxed, network": timed(lambda: sandboxed_true(networked), options.calls),
        }
    bases = sandbox.cgroup_bases(base.sandbox.cgroup_root)
    limit = ", ".join(f"cgroup v{b.version} {'+'.join(sorted(b.controllers))} in {b.path}" for b in bases)
    print(f"run('true'), {options.calls} calls each, uid {os.getuid()}, {os.cpu_count()} CPUs, load {os.getloadavg()}")
    print("commands run as:", who.user if who else "the server's own user")
    print(f"limits: {limit or 'RLIMIT_NPROC and RLIMIT_DATA (no writable cgroup)'}")
    print(f"first sandboxed call of the process (tries bubblewrap once): {first:.1f} ms")
    print(f"{'variant':<20} {'median ms':>10} {'mean ms':>10} {'p90 ms':>10} {'vs unsandboxed':>15}")
    reference = statistics.median(rows["unsandboxed"])
    for name, times in rows.items():
        median = statistics.median(times)
        p90 = statistics.quantiles(times, n=10)[-1]
        print(f"{name:<20} {median:>10.2f} {statistics.fmean(times):>10.2f} {p90:>10.2f} {median / reference:>14.1f}×")


if __name__ == "__main__":
    main()
