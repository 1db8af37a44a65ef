from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sessions_app.hygiene import CapLimits, ContextConfig, cap_text

ID = "#0020"


def numbered(count: int, pattern: str = "line {n}") -> str:
    return "".join(pattern.format(n=n) + "\n" for n in range(1, count + 1))


def limits(
    max_lines: int = 5,
    max_chars: int = 10_000,
    head_lines: int = 2,
    head_chars: int = 10_000,
    tail_lines: int = 3,
    tail_chars: int = 10_000,
) -> CapLimits:
    return CapLimits(max_lines, max_chars, head_lines, head_chars, tail_lines, tail_chars)


def test_within_the_cap_is_unchanged(config: ContextConfig) -> None:
    body = numbered(400)
    assert cap_text(body, full_id=ID, limits=config.cap, config=config) == body
    assert cap_text("", full_id=ID, limits=config.cap, config=config) == ""


def test_over_max_lines_keeps_head_and_tail_with_the_elided_count(config: ContextConfig) -> None:
    body = numbered(1534)
    capped = cap_text(body, full_id=ID, limits=config.cap, config=config)
    lines = capped.split("\n")
    assert len(lines) == 301
    assert lines[:200] == [f"line {n}" for n in range(1, 201)]
    assert lines[200] == "[1234 lines elided, full output #0020]"
    assert lines[201:] == [f"line {n}" for n in range(1435, 1535)]


def test_401_lines_is_over_and_400_is_not(config: ContextConfig) -> None:
    capped = cap_text(numbered(401), full_id=ID, limits=config.cap, config=config)
    assert "[101 lines elided, full output #0020]" in capped.split("\n")


def test_small_limits_exact(config: ContextConfig) -> None:
    capped = cap_text(numbered(10), full_id="#0003", limits=limits(), config=config)
    assert capped == "line 1\nline 2\n[5 lines elided, full output #0003]\nline 8\nline 9\nline 10"


def test_final_newline_adds_no_line(config: ContextConfig) -> None:
    five = "a\nb\nc\nd\ne"
    assert cap_text(five, full_id=ID, limits=limits(), config=config) == five
    assert cap_text(five + "\n", full_id=ID, limits=limits(), config=config) == five + "\n"
    six = five + "\nf\n"
    assert cap_text(six, full_id=ID, limits=limits(), config=config) == (
        "a\nb\n[1 lines elided, full output #0020]\nd\ne\nf"
    )


def test_over_max_chars_alone(config: ContextConfig) -> None:
    body = "0123456789\n" * 4
    assert cap_text(body, full_id=ID, limits=limits(max_lines=100, max_chars=44), config=config) == body
    capped = cap_text(
        body,
        full_id=ID,
        limits=limits(max_lines=100, max_chars=43, head_lines=1, tail_lines=1),
        config=config,
    )
    assert capped == "0123456789\n[2 lines elided, full output #0020]\n0123456789"


def test_chars_without_final_newline_count_the_last_line_newline(config: ContextConfig) -> None:
    body = "0123456789"
    assert cap_text(body, full_id=ID, limits=limits(max_chars=11), config=config) == body
    capped = cap_text(body, full_id=ID, limits=limits(max_chars=10, head_chars=5), config=config)
    assert capped == "01234 […cut]\n[0 lines elided, full output #0020]"


def test_head_chars_limit_counts_each_newline(config: ContextConfig) -> None:
    body = numbered(10)
    capped = cap_text(body, full_id=ID, limits=limits(head_lines=5, head_chars=14, tail_chars=15), config=config)
    assert capped == "line 1\nline 2\n[6 lines elided, full output #0020]\nline 9\nline 10"
    capped = cap_text(body, full_id=ID, limits=limits(head_lines=5, head_chars=13, tail_chars=14), config=config)
    assert capped == "line 1\n[8 lines elided, full output #0020]\nline 10"


def test_tail_stops_at_the_first_line_that_does_not_fit(config: ContextConfig) -> None:
    body = "a\nb\nc\nd\ne\n" + "x" * 50 + "\nz\n"
    capped = cap_text(body, full_id=ID, limits=limits(tail_chars=10), config=config)
    assert capped == "a\nb\n[4 lines elided, full output #0020]\nz"


def test_tail_never_overlaps_the_head(config: ContextConfig) -> None:
    body = "a\nb\nc"
    capped = cap_text(body, full_id=ID, limits=limits(max_chars=5, head_lines=2, tail_lines=5), config=config)
    assert capped == "a\nb\n[0 lines elided, full output #0020]\nc"


def test_long_first_line_is_cut_and_followed_by_a_zero_count(config: ContextConfig) -> None:
    capped = cap_text("x" * 50_000, full_id="#0001", limits=config.cap, config=config)
    assert capped == "x" * 20_000 + " […cut]\n[0 lines elided, full output #0001]"


def test_cut_first_line_with_tail(config: ContextConfig) -> None:
    body = "x" * 30 + "\nshort\n"
    capped = cap_text(body, full_id="#0001", limits=limits(max_chars=20, head_chars=10), config=config)
    assert capped == "xxxxxxxxxx […cut]\n[0 lines elided, full output #0001]\nshort"
    body = "x" * 30 + "\n" + numbered(9)
    capped = cap_text(body, full_id="#0001", limits=limits(head_chars=10), config=config)
    assert capped == "xxxxxxxxxx […cut]\n[6 lines elided, full output #0001]\nline 7\nline 8\nline 9"


def test_a_first_line_of_exactly_head_chars_is_shown_whole_without_the_cut_mark(config: ContextConfig) -> None:
    """ "Over" is the line's own characters, its newline not counted: only a longer first line is cut."""
    body = "0123456789\nb\nc\nd\ne\nf\n"
    capped = cap_text(body, full_id=ID, limits=limits(head_chars=10), config=config)
    assert capped == "0123456789\n[2 lines elided, full output #0020]\nd\ne\nf"
    exact = "x" * 20_000 + "\n" + "y" * 30_000
    capped = cap_text(exact, full_id=ID, limits=config.cap, config=config)
    assert capped == "x" * 20_000 + "\n[1 lines elided, full output #0020]"
    capped = cap_text("x" + exact, full_id=ID, limits=config.cap, config=config)
    assert capped == "x" * 20_000 + " […cut]\n[1 lines elided, full output #0020]"


def test_unicode_counts_code_points(config: ContextConfig) -> None:
    body = "éé\n" * 3
    assert cap_text(body, full_id=ID, limits=limits(max_chars=9), config=config) == body
    capped = cap_text(body, full_id=ID, limits=limits(max_chars=8, head_lines=1, tail_lines=1), config=config)
    assert capped == "éé\n[1 lines elided, full output #0020]\néé"


def test_a_hundred_megabytes_is_capped(config: ContextConfig) -> None:
    """How long it takes is measured by ``bench/bounds_bench.py``."""
    body = ("x" * 99 + "\n") * 1_000_000
    capped = cap_text(body, full_id=ID, limits=config.cap, config=config)
    lines = capped.split("\n")
    assert len(lines) == 301 and lines[200] == "[999700 lines elided, full output #0020]"
    one_line = "y" * 100_000_000
    capped = cap_text(one_line, full_id=ID, limits=config.cap, config=config)
    assert capped == "y" * 20_000 + " […cut]\n[0 lines elided, full output #0020]"


# Properties. With E the elided line and C the cut marker, a capped text has at most
# head_lines + tail_lines + 1 lines and, as a string, at most head_chars + tail_chars + len(E)
# characters, or head_chars + len(C) + 1 + tail_chars + len(E) when its first line is cut, or one more
# than the first bound when its first line is exactly head_chars characters, shown whole:
# the whole head lines sum (len + 1) <= head_chars and give len - 1 of text before the "\n" to E;
# the tail likewise; so head + "\n" + E + "\n" + tail is Σhead + len(E) + Σtail.

line_text = st.text(alphabet="abé ", max_size=12)
bodies = st.tuples(st.lists(line_text, max_size=30), st.booleans()).map(
    lambda parts: "\n".join(parts[0]) + ("\n" if parts[0] and parts[1] else "")
)
cap_limits = st.builds(
    CapLimits,
    max_lines=st.integers(0, 30),
    max_chars=st.integers(0, 300),
    head_lines=st.integers(0, 10),
    head_chars=st.integers(0, 60),
    tail_lines=st.integers(0, 10),
    tail_chars=st.integers(0, 60),
)


def split_lines(body: str) -> list[str]:
    if not body:
        return []
    return body.removesuffix("\n").split("\n")


def weight(lines: list[str]) -> int:
    return sum(len(line) + 1 for line in lines)


@settings(max_examples=600, deadline=None)
@given(body=bodies, cap=cap_limits)
def test_cap_properties(config: ContextConfig, body: str, cap: CapLimits) -> None:
    capped = cap_text(body, full_id=ID, limits=cap, config=config)
    lines = split_lines(body)
    if len(lines) <= cap.max_lines and weight(lines) <= cap.max_chars:
        assert capped == body
        return
    cut_marker = config.text("cut")
    out = capped.split("\n")
    elided_at = next(index for index, line in enumerate(out) if line.startswith("["))
    head, elided, tail = out[:elided_at], out[elided_at], out[elided_at + 1 :]
    cut = bool(head) and head[0].endswith(cut_marker) and head[0] != lines[0]
    whole_first = not cut and bool(head) and weight(head) > cap.head_chars
    if cut:
        assert head == [lines[0][: cap.head_chars] + cut_marker]
        assert len(lines[0]) > cap.head_chars and cap.head_lines >= 1
    elif whole_first:  # a first line of exactly head_chars is not over it: shown whole, with no cut mark
        assert head == lines[:1] and len(lines[0]) == cap.head_chars
    else:
        assert head == lines[: len(head)]
        assert weight(head) <= cap.head_chars and len(head) <= cap.head_lines
        next_fits = len(head) < min(len(lines), cap.head_lines) and (weight(lines[: len(head) + 1]) <= cap.head_chars)
        assert not next_fits
        assert head or cap.head_lines == 0 or not lines
    shown_head = len(head)
    assert len(tail) <= len(lines) - shown_head
    if tail:
        assert tail == lines[len(lines) - len(tail) :]
    assert weight(tail) <= cap.tail_chars and len(tail) <= cap.tail_lines
    room = len(lines) - shown_head - len(tail)
    tail_could_grow = (
        len(tail) < cap.tail_lines and room > 0 and (weight(lines[len(lines) - len(tail) - 1 :]) <= cap.tail_chars)
    )
    assert not tail_could_grow
    assert elided == config.text("elided", count=room, id=ID)
    assert len(out) <= cap.head_lines + cap.tail_lines + 1
    bound = cap.head_chars + cap.tail_chars + len(elided)
    assert len(capped) <= bound + (len(cut_marker) + 1 if cut else 1 if whole_first else 0)
    assert len(capped) <= bound + len(cut_marker) + 1
