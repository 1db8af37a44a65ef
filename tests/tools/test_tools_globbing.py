from __future__ import annotations

import pytest

from chat.tools.globbing import expand_braces, path_regex


def test_expand_braces() -> None:
    assert expand_braces("*.{py,md}") == ["*.py", "*.md"]
    assert expand_braces("{a,b}/{c,d}") == ["a/c", "a/d", "b/c", "b/d"]
    assert expand_braces("plain[ab]") == ["plain[ab]"]
    assert len(expand_braces("{a,b}" * 10)) <= 64


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("*.py", "a.py", True),
        ("*.py", "src/a.py", False),
        ("**/*.py", "a.py", True),
        ("**/*.py", "src/deep/a.py", True),
        ("src/**", "src/deep/a.py", True),
        ("src/**/a.py", "src/a.py", True),
        ("?.py", "ab.py", False),
        ("[!a]*.py", "b.py", True),
        ("[!a]*.py", "a.py", False),
        ("[a-c].txt", "b.txt", True),
        ("a+b(c).txt", "a+b(c).txt", True),
        ("./x//y", "x/y", True),
        ("*", "x/y", False),
    ],
)
def test_path_regex(pattern: str, path: str, matches: bool) -> None:
    assert bool(path_regex(pattern).fullmatch(path)) is matches
