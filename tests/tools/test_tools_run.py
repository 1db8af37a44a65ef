from __future__ import annotations

import os
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from chat.tools import ToolContext, ToolError, run
from chat.tools import run as run_module_function
from sessions_app.hygiene.outcomes import OutputOutcome

RUN_MODULE = __import__("chat.tools.run", fromlist=["execute"])


def text(outcome: object) -> str:
    assert isinstance(outcome, OutputOutcome)
    return outcome.text


def group_gone(pgid: int, within: float = 5.0) -> bool:
    """Whether no process of the group is left; a killed process may take a moment to be reaped."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("echo hi", "hi\n"),
        ("echo hi; exit 3", "hi\n[exit 3]"),
        ("printf partial; exit 2", "partial\n[exit 2]"),
        ("exit 1", "[exit 1]"),
        ("true", ""),
        ("echo out; echo err >&2; echo out again", "out\nerr\nout again\n"),
        ("cat; echo done", "done\n"),
        ("kill -9 $$", "[exit 137]"),
        ("printf 'bad \\377 byte\\n'", "bad \ufffd byte\n"),
    ],
)
def test_output_and_exit_line(ctx: ToolContext, command: str, expected: str) -> None:
    assert text(run({"command": command}, ctx)) == expected


def test_runs_in_the_workspace_with_a_clean_environment(
    ws: Path, ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CACHET_TEST_SECRET", "hunter2")
    assert text(run({"command": 'pwd; echo "[$CACHET_TEST_SECRET]"'}, ctx)) == f"{ws}\n[]\n"


def test_timeout_kills_the_whole_process_group(ctx: ToolContext) -> None:
    started = time.monotonic()
    output = text(run({"command": "echo $$; sleep 1000 & sleep 1000", "timeout": 1}, ctx))
    assert time.monotonic() - started < 10
    pid_line, trailer = output.split("\n")
    assert trailer == "[timed out after 1 s]"
    assert group_gone(int(pid_line))


def test_a_group_that_ignores_sigterm_is_killed(ctx: ToolContext, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(RUN_MODULE, "KILL_GRACE", 0.3)
    output = text(run({"command": "trap '' TERM; echo $$; sleep 1000 & wait", "timeout": 1}, ctx))
    pid_line, trailer = output.split("\n")
    assert trailer == "[timed out after 1 s]"
    assert group_gone(int(pid_line))


def test_what_a_command_leaves_running_is_killed(ctx: ToolContext) -> None:
    output = text(run({"command": "echo $$; (sleep 1000 &); exit 0"}, ctx))
    assert group_gone(int(output.strip()))


def test_timeout_is_capped(make_ctx: Callable[..., ToolContext]) -> None:
    ctx = make_ctx(run_max_timeout=1, run_timeout=1)
    assert text(run({"command": "sleep 30", "timeout": 99999}, ctx)) == "[timed out after 1 s]"
    assert text(run({"command": "sleep 30"}, ctx)) == "[timed out after 1 s]"


def test_argument_errors(ctx: ToolContext) -> None:
    with pytest.raises(ToolError) as caught:
        run({"command": "true", "timeout": 0}, ctx)
    assert caught.value.message == "timeout must be a whole number of at least 1, not 0."
    with pytest.raises(ToolError) as caught:
        run({}, ctx)
    assert caught.value.message == "The call to run lacks the argument command."


def test_a_command_that_cannot_start(tmp_path: Path, make_ctx: Callable[..., ToolContext]) -> None:
    ctx = make_ctx(root=tmp_path / "gone")
    with pytest.raises(ToolError) as caught:
        run({"command": "true"}, ctx)
    assert caught.value.message == "The command could not be started: No such file or directory"


def test_output_goes_to_a_spool_file_while_it_runs(ctx: ToolContext) -> None:
    output = text(run({"command": "head -c 5000 /dev/zero | tr '\\0' a; stat -L -c '%F %s' /proc/self/fd/1"}, ctx))
    assert output == "a" * 5000 + "regular file 5000\n"


def test_hundred_megabytes_of_output(tmp_path: Path, make_ctx: Callable[..., ToolContext]) -> None:
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    ctx = make_ctx(spool_dir=spool_dir)
    command = "head -c 100000000 /dev/zero | tr '\\0' a; exit 4"
    with tempfile.TemporaryFile(dir=spool_dir) as spool:
        tracemalloc.start()
        try:
            code = RUN_MODULE.execute(command, 60, spool, ctx)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert code == 4
        assert spool.seek(0, os.SEEK_END) == 100_000_000
    assert peak < 5_000_000
    output = text(run_module_function({"command": command}, ctx))
    assert len(output) == 100_000_000 + len("\n[exit 4]")
    assert output.endswith("a\n[exit 4]")
    assert output.count("a") == 100_000_000
    assert os.listdir(spool_dir) == []
