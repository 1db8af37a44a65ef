from __future__ import annotations

import hashlib
import os
import tracemalloc
from pathlib import Path

import pytest

from chat.tools import ToolContext, ToolError, read
from sessions_app.hygiene.outcomes import ReadOutcome


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_window_format(ws: Path, ctx: ToolContext) -> None:
    data = b"".join(b"line %d\n" % number for number in range(1, 11))
    (ws / "ten.txt").write_bytes(data)
    outcome = read({"path": "ten.txt", "offset": 3, "limit": 4}, ctx)
    assert outcome == ReadOutcome(
        path="ten.txt",
        abs_path=str(ws / "ten.txt"),
        offset=3,
        limit=4,
        first_line=3,
        last_line=6,
        total_lines=10,
        sha256=sha(data),
        body="3: line 3\n4: line 4\n5: line 5\n6: line 6",
    )


def test_defaults_and_window_clipped_to_end(ws: Path, ctx: ToolContext) -> None:
    (ws / "a.txt").write_bytes(b"one\ntwo\nthree")
    outcome = read({"path": str(ws / "a.txt")}, ctx)
    assert isinstance(outcome, ReadOutcome)
    assert (outcome.path, outcome.offset, outcome.limit) == (str(ws / "a.txt"), 1, 2000)
    assert (outcome.first_line, outcome.last_line, outcome.total_lines) == (1, 3, 3)
    assert outcome.body == "1: one\n2: two\n3: three"
    tail = read({"path": "a.txt", "offset": 3}, ctx)
    assert isinstance(tail, ReadOutcome)
    assert (tail.first_line, tail.last_line, tail.body) == (3, 3, "3: three")


def test_limit_is_clamped_to_the_read_window(ws: Path, ctx: ToolContext) -> None:
    (ws / "big.txt").write_text("".join(f"{number}\n" for number in range(5000)))
    outcome = read({"path": "big.txt", "limit": 10_000}, ctx)
    assert isinstance(outcome, ReadOutcome)
    assert (outcome.limit, outcome.last_line, outcome.total_lines) == (2000, 2000, 5000)
    assert outcome.body.split("\n")[-1] == "2000: 1999"


def test_final_newline_adds_no_line_and_blank_lines_count(ws: Path, ctx: ToolContext) -> None:
    (ws / "b.txt").write_bytes(b"a\n\nb\n\n")
    outcome = read({"path": "b.txt"}, ctx)
    assert isinstance(outcome, ReadOutcome)
    assert outcome.total_lines == 4
    assert outcome.body == "1: a\n2: \n3: b\n4: "


def test_empty_file(ws: Path, ctx: ToolContext) -> None:
    (ws / "empty.txt").write_bytes(b"")
    outcome = read({"path": "empty.txt", "offset": 5}, ctx)
    assert outcome == ReadOutcome("empty.txt", str(ws / "empty.txt"), 5, 2000, 0, 0, 0, sha(b""), "")


def test_offset_past_end(ws: Path, ctx: ToolContext) -> None:
    (ws / "c.txt").write_text("x\ny\n")
    with pytest.raises(ToolError) as caught:
        read({"path": "c.txt", "offset": 3}, ctx)
    assert caught.value.message == f"Offset 3 is past the end of {ws}/c.txt (2 lines)."


def test_crlf_invalid_utf8_and_long_lines(ws: Path, ctx: ToolContext) -> None:
    long_line = "z" * 50_000
    (ws / "d.txt").write_bytes(b"dos\r\nbad \xff byte\n" + long_line.encode() + b"\nend")
    outcome = read({"path": "d.txt"}, ctx)
    assert isinstance(outcome, ReadOutcome)
    lines = outcome.body.split("\n")
    assert lines[:2] == ["1: dos", "2: bad \ufffd byte"]
    assert lines[2] == "3: " + long_line, "reads are not capped: a long line is shown whole"
    assert lines[3] == "4: end"
    assert outcome.total_lines == 4


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"text\x00more", "Refused: {path} is a binary file."),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "Refused: {path} is a binary file."),
    ],
)
def test_binary_is_refused(ws: Path, ctx: ToolContext, content: bytes, message: str) -> None:
    (ws / "bin.dat").write_bytes(content)
    with pytest.raises(ToolError) as caught:
        read({"path": "bin.dat"}, ctx)
    assert caught.value.message == message.format(path=ws / "bin.dat")


def test_folder_missing_and_fifo(ws: Path, ctx: ToolContext) -> None:
    (ws / "sub").mkdir()
    with pytest.raises(ToolError) as caught:
        read({"path": "sub"}, ctx)
    assert caught.value.message == f"{ws}/sub is a folder, not a file; use list to see what it holds."
    with pytest.raises(ToolError) as caught:
        read({"path": "nope.txt"}, ctx)
    assert caught.value.message == f"No such file or folder: {ws}/nope.txt"
    with pytest.raises(ToolError) as caught:
        read({"path": "sub/nope/deeper.txt"}, ctx)
    assert caught.value.message == f"No such file or folder: {ws}/sub/nope/deeper.txt"
    os.mkfifo(ws / "pipe")
    with pytest.raises(ToolError) as caught:
        read({"path": "pipe"}, ctx)
    assert caught.value.message == f"Refused: {ws}/pipe is not a regular file."


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "The call to read lacks the argument path."),
        ({"path": 3}, "The argument path of read must be a string."),
        ({"path": "a", "offset": 0}, "offset must be a whole number of at least 1, not 0."),
        ({"path": "a", "limit": "ten"}, "limit must be a whole number of at least 1, not 'ten'."),
        ({"path": "a", "offset": True}, "offset must be a whole number of at least 1, not True."),
        ({"path": "a", "offset": 1.5}, "offset must be a whole number of at least 1, not 1.5."),
    ],
)
def test_argument_errors(ctx: ToolContext, arguments: dict[str, object], message: str) -> None:
    with pytest.raises(ToolError) as caught:
        read(arguments, ctx)
    assert caught.value.message == message


def test_numbers_given_as_strings_or_floats(ws: Path, ctx: ToolContext) -> None:
    (ws / "e.txt").write_text("1\n2\n3\n")
    outcome = read({"path": "e.txt", "offset": "2", "limit": 1.0}, ctx)
    assert isinstance(outcome, ReadOutcome)
    assert outcome.body == "2: 2"


def test_huge_file_is_streamed(ws: Path, ctx: ToolContext) -> None:
    line = b"0123456789" * 9 + b"abcdefghi\n"
    block = line * 10_000
    path = ws / "huge.log"
    digest = hashlib.sha256()
    with path.open("wb") as handle:
        for _ in range(200):
            handle.write(block)
            digest.update(block)
        handle.write(b"last line without newline")
        digest.update(b"last line without newline")
    assert path.stat().st_size > 200_000_000
    total = 2_000_001
    tracemalloc.start()
    try:
        outcome = read({"path": "huge.log", "offset": 1_999_990}, ctx)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(outcome, ReadOutcome)
    assert (outcome.first_line, outcome.last_line, outcome.total_lines) == (1_999_990, total, total)
    assert outcome.sha256 == digest.hexdigest()
    assert outcome.body.split("\n")[-1] == f"{total}: last line without newline"
    assert outcome.body.split("\n")[0] == f"1999990: {line.decode().rstrip()}"
    assert peak < 20_000_000  # how long it takes: bench/bounds_bench.py
    middle = read({"path": "huge.log", "offset": 1_000_000, "limit": 3}, ctx)
    assert isinstance(middle, ReadOutcome)
    assert middle.body.split("\n")[0].startswith("1000000: 0123")
    assert middle.last_line == 1_000_002


def test_one_huge_line_is_shown_whole(ws: Path, ctx: ToolContext) -> None:
    with (ws / "one.min.js").open("wb") as handle:
        for _ in range(8):
            handle.write(b"x" * 1_000_000)
        handle.write(b"\nsecond\n")
    outcome = read({"path": "one.min.js"}, ctx)
    assert isinstance(outcome, ReadOutcome)
    assert outcome.body == "1: " + "x" * 8_000_000 + "\n2: second"
