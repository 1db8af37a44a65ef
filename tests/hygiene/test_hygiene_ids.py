from __future__ import annotations

import pytest

from sessions_app.hygiene import args_key, format_id, parse_id


@pytest.mark.parametrize(
    ("number", "expected"),
    [(1, "#0001"), (2, "#0002"), (10, "#000a"), (0x12, "#0012"), (0xFFFF, "#ffff"), (65536, "#10000")],
)
def test_format_id(number: int, expected: str) -> None:
    assert format_id(number, 4) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", 1),
        ("0001", 1),
        ("#0001", 1),
        (" #0001 ", 1),
        ("#A", 10),
        ("a", 10),
        ("#000a", 10),
        ("ffff", 65535),
        ("#10000", 65536),
        ("", None),
        ("#", None),
        ("0", 0),
        ("#0000", 0),
        ("0000", 0),
        ("xyz", None),
        ("##1", None),
        ("# 1", None),
        ("-1", None),
        ("1_0", None),
        ("0x10", None),
    ],
)
def test_parse_id(text: str, expected: int | None) -> None:
    assert parse_id(text) == expected


def test_args_key_sorts_keys_and_keeps_unicode() -> None:
    assert args_key({"path": "é", "a": [1, {"z": 1, "b": 2}]}) == '{"a":[1,{"b":2,"z":1}],"path":"é"}'
    assert args_key({"b": 1, "a": 2}) == args_key({"a": 2, "b": 1})
