from __future__ import annotations

import os
from pathlib import Path

import pytest

from chat.tools import ToolContext, ToolError, glob, grep, list_
from sessions_app.hygiene.outcomes import ListingOutcome


@pytest.fixture
def tree(ws: Path) -> Path:
    (ws / "src" / "pkg").mkdir(parents=True)
    (ws / "docs").mkdir()
    (ws / "empty").mkdir()
    (ws / "src" / "app.py").write_text("import os\n\ndef main():\n    return os.getcwd()\n")
    (ws / "src" / "pkg" / "util.py").write_text("def helper():\n    return 'Main'\n")
    (ws / "src" / "pkg" / "data.bin").write_bytes(b"main\x00\x01\x02")
    (ws / "docs" / "guide.md").write_text("# Guide\nRun main.\r\n")
    (ws / "README.md").write_text("main readme\n")
    (ws / ".hidden").write_text("main hidden\n")
    return ws


def body(outcome: object) -> str:
    assert isinstance(outcome, ListingOutcome)
    return outcome.body


def test_list(tree: Path, ctx: ToolContext) -> None:
    assert body(list_({}, ctx)) == "\n".join(
        [
            f"{tree}/.hidden",
            f"{tree}/README.md",
            f"{tree}/docs/",
            f"{tree}/empty/",
            f"{tree}/src/",
        ]
    )
    assert body(list_({"path": "src"}, ctx)) == f"{tree}/src/app.py\n{tree}/src/pkg/"
    assert body(list_({"path": "empty"}, ctx)) == "No matches."


def test_list_errors(tree: Path, ctx: ToolContext) -> None:
    with pytest.raises(ToolError) as caught:
        list_({"path": "README.md"}, ctx)
    assert caught.value.message == f"{tree}/README.md is not a folder."
    with pytest.raises(ToolError) as caught:
        list_({"path": "nothing"}, ctx)
    assert caught.value.message == f"No such file or folder: {tree}/nothing"


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("*.md", ".", ["README.md"]),
        ("**/*.py", ".", ["src/app.py", "src/pkg/util.py"]),
        ("src/*.py", ".", ["src/app.py"]),
        ("**/*.{md,py}", ".", ["README.md", "docs/guide.md", "src/app.py", "src/pkg/util.py"]),
        ("**", "src", ["src/app.py", "src/pkg/data.bin", "src/pkg/util.py"]),
        ("pkg/**/u?il.py", "src", ["src/pkg/util.py"]),
        ("[!a]*.py", "src", []),
        ("*", "docs", ["docs/guide.md"]),
        (".*", ".", [".hidden"]),
        ("nothing*", ".", []),
    ],
)
def test_glob(tree: Path, ctx: ToolContext, pattern: str, path: str, expected: list[str]) -> None:
    result = body(glob({"pattern": pattern, "path": path}, ctx))
    assert result == ("\n".join(f"{tree}/{item}" for item in expected) if expected else "No matches.")


def test_glob_absolute_pattern_inside(tree: Path, ctx: ToolContext) -> None:
    assert body(glob({"pattern": f"{tree}/src/*.py"}, ctx)) == f"{tree}/src/app.py"
    assert body(glob({"pattern": "../*.md", "path": "src"}, ctx)) == f"{tree}/README.md"


def test_grep(tree: Path, ctx: ToolContext) -> None:
    assert body(grep({"pattern": "main"}, ctx)) == "\n".join(
        [
            f"{tree}/README.md:1: main readme",
            f"{tree}/docs/guide.md:2: Run main.",
            f"{tree}/src/app.py:3: def main():",
        ]
    )
    assert body(grep({"pattern": "main", "ignore_case": True, "glob": "*.{py,md}"}, ctx)) == "\n".join(
        [
            f"{tree}/README.md:1: main readme",
            f"{tree}/docs/guide.md:2: Run main.",
            f"{tree}/src/app.py:3: def main():",
            f"{tree}/src/pkg/util.py:2:     return 'Main'",
        ]
    )
    assert body(grep({"pattern": r"^\s+return", "path": "src", "glob": "pkg/*.py"}, ctx)) == (
        f"{tree}/src/pkg/util.py:2:     return 'Main'"
    )
    assert body(grep({"pattern": "os", "path": "src/app.py"}, ctx)) == (
        f"{tree}/src/app.py:1: import os\n{tree}/src/app.py:4:     return os.getcwd()"
    )
    assert body(grep({"pattern": "zzz"}, ctx)) == "No matches."
    assert body(grep({"pattern": "main", "path": ".hidden"}, ctx)) == f"{tree}/.hidden:1: main hidden"


def test_grep_sorts_by_path_then_line(ws: Path, ctx: ToolContext) -> None:
    (ws / "b").mkdir()
    (ws / "b" / "x.txt").write_text("hit\nhit\n")
    (ws / "a.txt").write_text("\n" * 9 + "hit\n")
    (ws / "b.txt").write_text("hit\n")
    assert body(grep({"pattern": "hit"}, ctx)).split("\n") == [
        f"{ws}/a.txt:10: hit",
        f"{ws}/b.txt:1: hit",
        f"{ws}/b/x.txt:1: hit",
        f"{ws}/b/x.txt:2: hit",
    ]


def test_grep_errors(tree: Path, ctx: ToolContext) -> None:
    with pytest.raises(ToolError) as caught:
        grep({"pattern": "(unclosed"}, ctx)
    assert caught.value.message == (
        "The pattern '(unclosed' is not a valid ripgrep (Rust) regex: regex parse error: unclosed group"
    )
    with pytest.raises(ToolError) as caught:
        grep({"pattern": "main", "path": "src/pkg/data.bin"}, ctx)
    assert caught.value.message == f"Refused: {tree}/src/pkg/data.bin is a binary file."
    with pytest.raises(ToolError) as caught:
        grep({"pattern": "main", "ignore_case": "sometimes"}, ctx)
    assert caught.value.message == "The argument ignore_case of grep must be true or false."


def test_grep_skips_unreadable_and_special_files(tree: Path, ctx: ToolContext) -> None:
    os.mkfifo(tree / "docs" / "pipe")
    assert body(grep({"pattern": "Guide", "path": "docs"}, ctx)) == f"{tree}/docs/guide.md:1: # Guide"


def test_grep_long_line_is_searched_and_shown_whole(ws: Path, ctx: ToolContext) -> None:
    (ws / "long.txt").write_text("a" * 45_000 + "needle\nshort needle\n")
    assert body(grep({"pattern": "needle"}, ctx)).split("\n") == [
        f"{ws}/long.txt:1: " + "a" * 45_000 + "needle",
        f"{ws}/long.txt:2: short needle",
    ]
