"""A workspace's disk quota, for Cachet's own writes and for commands; and whose the files Cachet writes are."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from chat.tools import ToolContext, call_tool
from chat.tools import quota as quota_module
from chat.tools import sandbox as sandbox_module
from sessions_app.hygiene.outcomes import ErrorOutcome, OutputOutcome
from tests.sandbox_kit import for_commands, sandbox_ids

MB = 1024 * 1024


def called(ctx: ToolContext, tool: str, **arguments: object) -> str:
    _, outcome = call_tool(tool, json.dumps(arguments), ctx)
    if isinstance(outcome, ErrorOutcome):
        return f"error: {outcome.message}"
    assert isinstance(outcome, OutputOutcome) or hasattr(outcome, "changes")
    return getattr(outcome, "text", "written")


def fill(folder: Path, megabytes: int) -> None:
    with (folder / "filler.bin").open("wb") as handle:
        handle.write(os.urandom(megabytes * MB))
    for_commands(folder)


def usage(folder: Path) -> int:
    fd = os.open(folder, os.O_PATH | os.O_DIRECTORY)
    try:
        return quota_module.disk_usage(fd)
    finally:
        os.close(fd)


def test_disk_usage_counts_blocks_once_per_file_and_follows_no_link(ws: Path, tmp_path: Path) -> None:
    fill(ws, 2)
    os.link(ws / "filler.bin", ws / "again.bin")
    (ws / "elsewhere").symlink_to(tmp_path)
    (tmp_path / "outside.bin").write_bytes(b"x" * (3 * MB))
    used = usage(ws)
    assert 2 * MB <= used < 2 * MB + 64 * 1024


def test_sizes_read_as_people_read_them() -> None:
    assert [quota_module.size_text(n) for n in (5, 2048, 3 * MB + MB // 2, 150 * MB, 10 * 1024 * MB)] == [
        "5 bytes",
        "2.0 KB",
        "3.5 MB",
        "150 MB",
        "10.0 GB",
    ]


def test_a_write_past_the_quota_is_refused_and_writes_nothing(ws: Path, make_ctx: Callable[..., ToolContext]) -> None:
    fill(ws, 2)
    ctx = make_ctx(disk_quota=3 * MB)
    assert called(ctx, "write", path="small.txt", content="fits\n") == "written"
    answer = called(ctx, "write", path="big.txt", content="x" * (2 * MB))
    used = quota_module.size_text(usage(ws))
    assert answer == (
        f"error: Refused: writing {ws}/big.txt (2.0 MB more) would take the workspace past its disk quota "
        f"({used} of 3.0 MB used)."
    )
    assert not (ws / "big.txt").exists()
    assert called(make_ctx(disk_quota=None), "write", path="big.txt", content="x" * (2 * MB)) == "written"


def test_a_command_in_a_full_workspace_may_free_space_and_write_nothing_more(
    ws: Path, make_ctx: Callable[..., ToolContext]
) -> None:
    """Over its quota, a command still runs: one that frees space is never refused; a file it writes gets no
    further than the space left (none), and the workspace is never taken past what it held."""
    fill(ws, 2)
    ctx = make_ctx(disk_quota=1 * MB)
    output = called(ctx, "run", command="head -c 200000 /dev/zero > more.bin; echo $?; ls")
    assert output.splitlines()[0] != "0" and "File too large" in output, output
    assert (ws / "more.bin").stat().st_size <= sandbox_module.FILE_MAX_FLOOR
    assert called(ctx, "run", command="rm filler.bin && echo freed") == "freed\n"
    assert usage(ws) < 1 * MB


def test_a_file_a_command_writes_stops_at_the_space_the_quota_leaves(
    ws: Path, make_ctx: Callable[..., ToolContext]
) -> None:
    """The audit's probe: a 900 MB file was written whole into a 60 MB quota before the command was stopped. Now
    the file-size limit is the space left, so the write fails there (measured here at 3 MB for speed)."""
    fill(ws, 1)
    ctx = make_ctx(disk_quota=3 * MB)
    output = called(ctx, "run", command="head -c 50000000 /dev/zero > big.bin; echo exit=$?", timeout=60)
    assert "File too large" in output and "exit=1" in output, output
    assert 1.9 * MB <= (ws / "big.bin").stat().st_size <= 2 * MB + 64 * 1024
    assert usage(ws) <= 3 * MB + 128 * 1024


def test_a_command_that_fills_the_workspace_is_stopped(ws: Path, make_ctx: Callable[..., ToolContext]) -> None:
    ctx = make_ctx(disk_quota=2 * MB)
    command = (
        "i=0; while [ $i -lt 400 ]; do head -c 100000 /dev/zero > f$i || exit 9; i=$((i + 1)); sleep 0.02; done; "
        "echo finished"
    )
    output = called(ctx, "run", command=command, timeout=60)
    assert "finished" not in output
    assert output.startswith("[stopped: the workspace holds ") and output.endswith(
        ", more than its disk quota of 2.0 MB]"
    ), output
    assert usage(ws) > 2 * MB


def test_as_root_what_cachet_writes_stays_the_sandbox_users(ws: Path, ctx: ToolContext) -> None:
    ids = sandbox_ids()
    if ids is None:
        pytest.skip("only root writes files for another user")
    assert called(ctx, "write", path="deep/er/new.txt", content="one\n") == "written"
    for path in (ws / "deep", ws / "deep" / "er", ws / "deep" / "er" / "new.txt"):
        assert (path.stat().st_uid, path.stat().st_gid) == ids
    assert called(ctx, "edit", path="deep/er/new.txt", old_string="one", new_string="two") == "written"
    assert ((ws / "deep/er/new.txt").stat().st_uid, (ws / "deep/er/new.txt").stat().st_gid) == ids
    assert called(ctx, "run", command="echo three >> deep/er/new.txt && cat deep/er/new.txt") == "two\nthree\n"
    mine = ws / "mine"
    mine.mkdir()
    assert called(ctx, "write", path="mine/root.txt", content="root's\n") == "written"
    assert (mine / "root.txt").stat().st_uid == 0


def test_space_a_command_frees_counts_for_the_next_write_at_once(
    ws: Path, make_ctx: Callable[..., ToolContext]
) -> None:
    """The audit's write right after a ``run`` that deleted files was refused for the measure taken before the
    command (kept 10 s): the workspace is measured again as a command ends."""
    fill(ws, 5)
    ctx = make_ctx(disk_quota=3 * MB)
    assert called(ctx, "write", path="small.txt", content="x").startswith("error: Refused")
    assert called(ctx, "run", command="rm filler.bin && echo removed") == "removed\n"
    assert called(ctx, "write", path="small.txt", content="x" * 1024) == "written"
