"""``grep`` on ripgrep: linear time off the interpreter lock, ended by its time limit and by Stop, the
files rg skips skipped, and the result in the format of DESIGN.md."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from chat.tools import ToolContext, ToolError, call_tool, grep
from chat.tools.ripgrep import rg_error_line, rg_executable
from sessions_app.hygiene.outcomes import ErrorOutcome, ListingOutcome

pytestmark = pytest.mark.xdist_group("ripgrep")  # one test worker writes the 200 MB workspace, once

MIB = 1 << 20
PROSE = b"the quick brown fox jumps over the lazy dog 0123456789 and then some more words here\n"
CATASTROPHIC = "(a+)+$"
SLOW_FOR_RG = r"(\w+\s+){20}$"
"""Linear in rg too, but about 2 s per GB here: long enough for a time limit or a Stop to land."""


def body(outcome: object) -> str:
    assert isinstance(outcome, ListingOutcome)
    return outcome.body


def refusal(arguments: dict[str, object], ctx: ToolContext) -> str:
    with pytest.raises(ToolError) as caught:
        grep(arguments, ctx)
    return caught.value.message


def write_repeated(path: Path, line: bytes, size: int) -> None:
    """A file of about ``size`` bytes made of ``line`` again and again, written a MiB at a time."""
    chunk = line * (MIB // len(line))
    with path.open("wb") as handle:
        for _ in range(size // len(chunk)):
            handle.write(chunk)


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A 200 MB workspace: four 50 MB files of prose, one line of the last one holding a needle."""
    folder = tmp_path_factory.mktemp("big").resolve()
    for index in range(4):
        write_repeated(folder / f"part{index}.txt", PROSE, 50 * MIB)
    with (folder / "part3.txt").open("ab") as handle:
        handle.write(b"a needle in the hay\n")
    yield folder
    for path in folder.iterdir():
        path.unlink()


@pytest.fixture
def big_ctx(big: Path, make_ctx: Callable[..., ToolContext]) -> ToolContext:
    return make_ctx(root=big)


def test_the_catastrophic_pattern_answers(ws: Path, ctx: ToolContext) -> None:
    """Python's re never ends on this (bench/grep_bench.py measures both)."""
    (ws / "a.txt").write_text("a" * 40 + "!\n")
    assert body(grep({"pattern": CATASTROPHIC}, ctx)) == "No matches."
    assert body(grep({"pattern": "(a+)+!$"}, ctx)) == f"{ws}/a.txt:1: " + "a" * 40 + "!"


@pytest.mark.django_db
def test_a_grep_leaves_the_server_free_to_answer(
    ws: Path,
    ctx: ToolContext,
    client: Client,
    user: Any,
    rg_children: Callable[[], dict[int, str]],
    request: pytest.FixtureRequest,
) -> None:
    """While grep runs the catastrophic pattern over 90 MB of it, another person's GET / is answered."""
    (ws / "a.txt").write_text("a" * 40 + "!\n")
    write_repeated(ws / "many.txt", b"a" * 40 + b"!\n", 90 * MIB)
    request.addfinalizer((ws / "many.txt").unlink)
    client.force_login(user)
    assert client.get("/").status_code == 200
    outcome: list[object] = []
    grep_thread = threading.Thread(target=lambda: outcome.append(grep({"pattern": CATASTROPHIC}, ctx)))
    grep_thread.start()
    while not rg_children() and grep_thread.is_alive():
        time.sleep(0.001)
    answered_during: list[bool] = []  # for each page: was rg still running once it was answered?
    while grep_thread.is_alive():
        assert client.get("/").status_code == 200
        answered_during.append(bool(rg_children()))
    grep_thread.join(timeout=60)
    assert not grep_thread.is_alive()
    assert outcome and body(outcome[0]) == "No matches."
    assert answered_during, "the grep ended before a request could be made during it"
    assert any(answered_during), "a page was answered while the grep ran (Python's re would hold it for good)"


def test_a_200_mb_workspace_is_searched_without_loading_it(big: Path, big_ctx: ToolContext) -> None:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        result = body(grep({"pattern": "needle"}, big_ctx))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    needle_line = (big / "part3.txt").stat().st_size // len(PROSE) + 1
    assert result == f"{big}/part3.txt:{needle_line}: a needle in the hay"
    assert peak < 4 * MIB, f"grep held {peak} bytes of Python memory"


def test_the_time_limit_ends_a_grep_and_its_rg(
    big: Path, make_ctx: Callable[..., ToolContext], rg_children: Callable[[], dict[int, str]]
) -> None:
    ctx = make_ctx(root=big, grep_timeout=0.05)
    assert refusal({"pattern": SLOW_FOR_RG}, ctx) == (
        "grep stopped after 0.05 s, its time limit; search a smaller folder or narrow it with glob."
    )
    assert rg_children() == {}, "ended by the limit, with its rg"


def test_stop_ends_a_grep_and_its_rg(
    big: Path, make_ctx: Callable[..., ToolContext], rg_children: Callable[[], dict[int, str]]
) -> None:
    seen: dict[int, str] = {}

    def cancelled() -> bool:
        seen.update(rg_children())
        return bool(seen)

    ctx = make_ctx(root=big, cancelled=cancelled)
    _, outcome = call_tool("grep", json.dumps({"pattern": SLOW_FOR_RG}), ctx)
    assert outcome == ErrorOutcome("grep was stopped before it finished.")
    assert len(seen) == 1 and next(iter(seen.values())) in "RSD", f"rg was not running when stopped: {seen}"
    assert rg_children() == {}
    assert not any(Path(f"/proc/{pid}").exists() for pid in seen)


def test_matches_past_the_byte_bound_end_the_grep(
    big: Path, ws: Path, make_ctx: Callable[..., ToolContext], rg_children: Callable[[], dict[int, str]]
) -> None:
    assert refusal({"pattern": "fox"}, make_ctx(root=big, grep_max_bytes=1_000_000)) == (
        "grep stopped: its matches passed 1000000 bytes; narrow the pattern, the path or the glob."
    )
    assert rg_children() == {}
    (ws / "wide.txt").write_text("fox " * 50_000 + "\n")
    assert refusal({"pattern": "fox"}, make_ctx(grep_max_bytes=100_000)) == (
        "grep stopped: its matches passed 100000 bytes; narrow the pattern, the path or the glob."
    )
    assert body(grep({"pattern": "fox"}, make_ctx(grep_max_bytes=10_000_000))) == f"{ws}/wide.txt:1: " + "fox " * 50_000


def test_gitignored_files_are_skipped_in_a_git_repository(ws: Path, ctx: ToolContext) -> None:
    (ws / ".git").mkdir()
    (ws / ".gitignore").write_text("ignored.txt\nbuild/\n/src/gen.py\n")
    (ws / "src").mkdir()
    (ws / "build").mkdir()
    for name in ("kept.txt", "ignored.txt", "build/out.txt", "src/gen.py", "src/app.py"):
        (ws / name).write_text("hit\n")
    assert body(grep({"pattern": "hit"}, ctx)).split("\n") == [f"{ws}/kept.txt:1: hit", f"{ws}/src/app.py:1: hit"]
    assert body(grep({"pattern": "hit", "path": "src"}, ctx)) == f"{ws}/src/app.py:1: hit"
    assert body(grep({"pattern": "hit", "path": "ignored.txt"}, ctx)) == f"{ws}/ignored.txt:1: hit"


def test_ignore_files_outside_a_git_repository(ws: Path, ctx: ToolContext) -> None:
    """rg's own rule: ``.gitignore`` counts inside a git repository, ``.ignore`` anywhere."""
    (ws / ".gitignore").write_text("a.txt\n")
    (ws / ".ignore").write_text("b.txt\n")
    for name in ("a.txt", "b.txt", "c.txt"):
        (ws / name).write_text("hit\n")
    assert body(grep({"pattern": "hit"}, ctx)).split("\n") == [f"{ws}/a.txt:1: hit", f"{ws}/c.txt:1: hit"]


def test_hidden_files_and_folders_are_skipped(ws: Path, ctx: ToolContext) -> None:
    (ws / ".config").mkdir()
    (ws / ".config" / "settings.txt").write_text("hit\n")
    (ws / ".env").write_text("hit\n")
    (ws / "seen.txt").write_text("hit\n")
    assert body(grep({"pattern": "hit"}, ctx)) == f"{ws}/seen.txt:1: hit"
    assert body(grep({"pattern": "hit", "path": ".config"}, ctx)) == f"{ws}/.config/settings.txt:1: hit"


def test_binary_files_are_skipped_and_refused_when_named(ws: Path, ctx: ToolContext) -> None:
    (ws / "early.bin").write_bytes(b"hit\x00\x01")
    (ws / "late.bin").write_bytes(b"hit early\n" + b"x\n" * 200_000 + b"hit\x00late\n")
    (ws / "text.txt").write_text("hit\n")
    assert body(grep({"pattern": "hit"}, ctx)) == f"{ws}/text.txt:1: hit"
    assert refusal({"pattern": "hit", "path": "early.bin"}, ctx) == f"Refused: {ws}/early.bin is a binary file."
    assert refusal({"pattern": "hit", "path": "late.bin"}, ctx) == f"Refused: {ws}/late.bin is a binary file."


@pytest.mark.parametrize(
    ("pattern", "detail"),
    [
        ("(unclosed", "regex parse error: unclosed group"),
        ("x(?=y)", "regex parse error: look-around, including look-ahead and look-behind, is not supported"),
        (r"(a)\1", "regex parse error: backreferences are not supported"),
        (r"\p{Nope}", "regex parse error: Unicode property not found"),
        ("a{99999999}", "compiled regex exceeds size limit of 104857600"),
        ("a\x00b", "it holds a NUL character or text that is not valid Unicode"),
        ("a\ud800", "it holds a NUL character or text that is not valid Unicode"),
    ],
)
def test_an_invalid_pattern_answers_rgs_error_on_one_line(
    ws: Path, ctx: ToolContext, pattern: str, detail: str
) -> None:
    (ws / "a.txt").write_text("x\n")
    assert (
        refusal({"pattern": pattern}, ctx) == f"The pattern {pattern!r} is not a valid ripgrep (Rust) regex: {detail}"
    )


def test_an_invalid_glob_answers_rgs_error(ws: Path, ctx: ToolContext) -> None:
    (ws / "a.txt").write_text("x\n")
    assert refusal({"pattern": "x", "glob": "*.{py"}, ctx) == (
        "The glob '*.{py' is not valid: error parsing glob '*.{py': unclosed alternate group; missing '}' "
        "(maybe escape '{' with '[{]'?)"
    )


def test_rg_error_line() -> None:
    assert rg_error_line("rg: regex parse error:\n    (?:(a)\n    ^\nerror: unclosed group\n") == (
        "regex parse error: unclosed group"
    )
    assert rg_error_line("rg: compiled regex exceeds size limit of 10\n") == "compiled regex exceeds size limit of 10"
    assert rg_error_line("\n\n") == ""


def test_leading_dashes_are_a_pattern_not_an_option(ws: Path, ctx: ToolContext) -> None:
    (ws / "a.txt").write_text("x --files y\n")
    assert body(grep({"pattern": "--files"}, ctx)) == f"{ws}/a.txt:1: x --files y"


def test_ignore_case(ws: Path, ctx: ToolContext) -> None:
    (ws / "a.txt").write_text("Main\nmain\nMAIN\nother\n")
    assert body(grep({"pattern": "MAIN"}, ctx)) == f"{ws}/a.txt:3: MAIN"
    assert body(grep({"pattern": "MAIN", "ignore_case": True}, ctx)).split("\n") == [
        f"{ws}/a.txt:1: Main",
        f"{ws}/a.txt:2: main",
        f"{ws}/a.txt:3: MAIN",
    ]


@pytest.mark.parametrize(
    ("glob", "path", "expected"),
    [
        ("*.py", ".", ["a.py", "src/b.py", "src/deep/c.py"]),
        ("**/*.py", ".", ["a.py", "src/b.py", "src/deep/c.py"]),
        ("src/*.py", ".", ["src/b.py"]),
        ("src/**", ".", ["src/b.py", "src/deep/c.py", "src/notes.md"]),
        ("src/**/c.py", ".", ["src/deep/c.py"]),
        ("*.{md,txt}", ".", ["r.txt", "src/notes.md"]),
        ("[!a]*.py", ".", ["src/b.py", "src/deep/c.py"]),
        ("?.txt", ".", ["r.txt"]),
        ("!*.py", ".", ["r.txt", "src/notes.md"]),
        ("deep/*.py", "src", ["src/deep/c.py"]),
        ("*.py", "src", ["src/b.py", "src/deep/c.py"]),
    ],
)
def test_glob_filters_relative_to_the_searched_folder(
    ws: Path, ctx: ToolContext, glob: str, path: str, expected: list[str]
) -> None:
    (ws / "src" / "deep").mkdir(parents=True)
    for name in ("a.py", "r.txt", "src/b.py", "src/notes.md", "src/deep/c.py"):
        (ws / name).write_text("hit\n")
    result = body(grep({"pattern": "hit", "glob": glob, "path": path}, ctx))
    assert result == "\n".join(f"{ws}/{name}:1: hit" for name in expected)


def test_names_and_lines_rg_escapes_are_shown_as_the_rules_say(ws: Path, ctx: ToolContext) -> None:
    (ws / "a:1: b.txt").write_text("hit colon\n")
    (ws / "two\nlines.txt").write_text("hit newline\n")
    (ws / os.fsdecode(b"latin\xe9.txt")).write_bytes(b"hit caf\xe9\r\nhit crlf\r\n")
    (ws / "last.txt").write_bytes(b"no newline at the end hit")
    assert body(grep({"pattern": "hit"}, ctx)).split("\n") == [
        f"{ws}/a:1: b.txt:1: hit colon",
        f"{ws}/last.txt:1: no newline at the end hit",
        f"{ws}/latin\ufffd.txt:1: hit caf\ufffd",
        f"{ws}/latin\ufffd.txt:2: hit crlf",
        f"{ws}/two\\nlines.txt:1: hit newline",
    ]


def test_a_crlf_file_greps_like_an_lf_one(ws: Path, ctx: ToolContext) -> None:
    (ws / "dos.txt").write_bytes(b"Run main.\r\nsecond\r\n")
    assert body(grep({"pattern": r"main\.$"}, ctx)) == f"{ws}/dos.txt:1: Run main."


def test_rg_is_started_without_the_servers_environment(
    ws: Path, ctx: ToolContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "ripgreprc"
    config.write_text("--hidden\n--no-ignore\n")
    monkeypatch.setenv("RIPGREP_CONFIG_PATH", str(config))
    (ws / ".hidden.txt").write_text("hit\n")
    (ws / "seen.txt").write_text("hit\n")
    assert body(grep({"pattern": "hit"}, ctx)) == f"{ws}/seen.txt:1: hit"


def test_rg_is_the_one_next_to_python(monkeypatch: pytest.MonkeyPatch, ctx: ToolContext, tmp_path: Path) -> None:
    assert rg_executable(ctx) == str(Path(sys.executable).parent / "rg")
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setattr(sys, "executable", str(empty / "python"))
    monkeypatch.setattr("sysconfig.get_path", lambda name: str(empty))
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(ToolError) as caught:
        rg_executable(ctx)
    assert caught.value.message == (
        f"grep cannot run: ripgrep (rg) is neither in {empty} nor on PATH; install the Python package ripgrep."
    )
