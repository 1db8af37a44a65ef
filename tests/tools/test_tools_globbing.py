from __future__ import annotations

from chat.tools.globbing import expand_braces


def test_expand_braces() -> None:
    assert expand_braces("*.{py,md}") == ["*.py", "*.md"]
    assert expand_braces("{a,b}/{c,d}") == ["a/c", "a/d", "b/c", "b/d"]
    assert expand_braces("plain[ab]") == ["plain[ab]"]
    assert len(expand_braces("{a,b}" * 10)) <= 64
