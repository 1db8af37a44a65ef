from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import replace

from sessions_app.hygiene import (
    ContextConfig,
    ErrorOutcome,
    Kind,
    ListingOutcome,
    Outcome,
    OutputOutcome,
    PriorResult,
    ReadOutcome,
    Rendered,
    args_key,
    render_result,
)

BIG = "".join(f"line {n}\n" for n in range(1, 341))
BIG_SHA = hashlib.sha256(BIG.encode()).hexdigest()
SHA8 = BIG_SHA[:8]


def read_of(text: str, first: int, limit: int, *, path: str = "big.txt", abs_path: str = "/ws/big.txt") -> ReadOutcome:
    lines = text.removesuffix("\n").split("\n") if text else []
    last = min(len(lines), first + limit - 1)
    body = "\n".join(f"{n}: {lines[n - 1]}" for n in range(first, last + 1))
    return ReadOutcome(
        path=path,
        abs_path=abs_path,
        offset=first,
        limit=limit,
        first_line=first if lines else 1,
        last_line=last,
        total_lines=len(lines),
        sha256=hashlib.sha256(text.encode()).hexdigest(),
        body=body,
    )


class Reply:
    """A reply's dedupe table, grown one result at a time as the store would."""

    def __init__(self, config: ContextConfig, first_number: int = 1) -> None:
        self.config = config
        self.number = first_number
        self.table: list[PriorResult] = []

    def call(self, tool: str, arguments: object, outcome: Outcome) -> Rendered:
        key = args_key(arguments)
        rendered = render_result(
            number=self.number, tool=tool, args_key=key, outcome=outcome, table=self.table, config=self.config
        )
        self.table.append(rendered.as_prior(tool, key))
        self.number += 1
        return rendered

    def skip_to(self, number: int) -> None:
        self.number = number


def test_read_bracket_and_body(config: ContextConfig) -> None:
    rendered = Reply(config, 0x12).call(
        "read", {"path": "src/app.ts"}, read_of("import a\nexport b\n", 1, 2000, path="src/app.ts")
    )
    sha = hashlib.sha256(b"import a\nexport b\n").hexdigest()
    assert rendered.inserted_text == f"[#0012 src/app.ts lines 1-2 of 2 sha {sha[:8]}]\n1: import a\n2: export b"
    assert rendered.full_text == "1: import a\n2: export b"
    assert rendered.kind == "read" and rendered.kind is Kind.READ
    assert rendered.sha256 == sha and rendered.abs_path == "/ws/big.txt"


def test_a_documents_text_says_so_in_its_bracket_and_its_stub(config: ContextConfig) -> None:
    reply = Reply(config)
    text = "## Page 1\n\nMinutes\n"
    outcome = replace(read_of(text, 1, 2000, path="m.pdf", abs_path="/ws/m.pdf"), sha256="ab" * 32, converted="PDF")
    full = reply.call("read", {"path": "m.pdf"}, outcome)
    assert full.inserted_text == "[#0001 m.pdf lines 1-3 of 3 sha abababab text of PDF]\n1: ## Page 1\n2: \n3: Minutes"
    again = replace(read_of(text, 3, 1, path="m.pdf", abs_path="/ws/m.pdf"), sha256="ab" * 32, converted="PDF")
    assert reply.call("read", {"path": "m.pdf", "offset": 3}, again).inserted_text.split("\n") == [
        "[#0002 m.pdf lines 3-3 of 3 sha abababab text of PDF]",
        "Unchanged since #0001, which already shows lines 1-3.",
    ]
    empty = replace(read_of("", 1, 2000, path="scan.pdf", abs_path="/ws/scan.pdf"), converted="PDF")
    assert (
        reply.call("read", {"path": "scan.pdf"}, empty).inserted_text
        == "[#0003 scan.pdf empty sha e3b0c442 text of PDF]"
    )


def test_a_path_with_line_breaks_keeps_the_bracket_one_line(config: ContextConfig) -> None:
    reply = Reply(config)
    text = "x\n"
    sha8 = hashlib.sha256(text.encode()).hexdigest()[:8]
    full = reply.call("read", {"path": "a\nb|c\r.txt"}, read_of(text, 1, 2000, path="a\nb|c\r.txt"))
    assert full.inserted_text == f"[#0001 a\\nb|c\\r.txt lines 1-1 of 1 sha {sha8}]\n1: x"
    stub = reply.call("read", {"path": "a\nb|c\r.txt", "limit": 1}, read_of(text, 1, 1, path="a\nb|c\r.txt"))
    assert stub.inserted_text.split("\n") == [
        f"[#0002 a\\nb|c\\r.txt lines 1-1 of 1 sha {sha8}]",
        "Unchanged since #0001, which already shows lines 1-1.",
    ]
    empty = reply.call("read", {"path": "e\n"}, read_of("", 1, 2000, path="e\n", abs_path="/ws/e\n"))
    assert empty.inserted_text == "[#0003 e\\n empty sha e3b0c442]"


def test_conformance_example_stub(config: ContextConfig) -> None:
    reply = Reply(config)
    first = reply.call("read", {"path": "big.txt", "limit": 200}, read_of(BIG, 1, 200))
    assert first.inserted_text.split("\n")[0] == f"[#0001 big.txt lines 1-200 of 340 sha {SHA8}]"
    assert first.inserted_text.split("\n")[-1] == "200: line 200"
    second = reply.call("read", {"path": "big.txt", "offset": 50, "limit": 31}, read_of(BIG, 50, 31))
    assert second.inserted_text == (
        f"[#0002 big.txt lines 50-80 of 340 sha {SHA8}]\nUnchanged since #0001, which already shows lines 1-200."
    )
    assert second.kind == "stub" and second.refers_to == 1
    assert second.full_text == read_of(BIG, 50, 31).body


def test_stub_names_the_newest_containing_read_never_a_stub(config: ContextConfig) -> None:
    reply = Reply(config)
    reply.call("read", {}, read_of(BIG, 1, 200))
    reply.call("read", {}, read_of(BIG, 100, 2000))
    third = reply.call("read", {}, read_of(BIG, 150, 10))
    assert third.inserted_text.endswith("Unchanged since #0002, which already shows lines 100-340.")
    fourth = reply.call("read", {}, read_of(BIG, 50, 10))
    assert fourth.inserted_text.endswith("Unchanged since #0001, which already shows lines 1-200.")
    fifth = reply.call("read", {}, read_of(BIG, 152, 2))
    assert fifth.inserted_text == (
        f"[#0005 big.txt lines 152-153 of 340 sha {SHA8}]\nUnchanged since #0002, which already shows lines 100-340."
    )
    assert [entry.kind for entry in reply.table] == ["read", "read", "stub", "stub", "stub"]


def test_window_clipped_to_the_end_is_covered(config: ContextConfig) -> None:
    reply = Reply(config)
    reply.call("read", {}, read_of(BIG, 300, 2000))
    again = reply.call("read", {}, read_of(BIG, 320, 500))
    assert again.inserted_text == (
        f"[#0002 big.txt lines 320-340 of 340 sha {SHA8}]\nUnchanged since #0001, which already shows lines 300-340."
    )


def test_a_range_reaching_past_or_changed_content_or_another_file_is_read_in_full(
    config: ContextConfig,
) -> None:
    reply = Reply(config)
    reply.call("read", {}, read_of(BIG, 1, 200))
    assert reply.call("read", {}, read_of(BIG, 150, 100)).kind == "read"
    changed = BIG.replace("line 7\n", "line seven\n")
    assert reply.call("read", {}, read_of(changed, 10, 5)).kind == "read"
    assert reply.call("read", {}, read_of(BIG, 1, 5, abs_path="/ws/other.txt")).kind == "read"
    assert reply.call("read", {}, read_of(BIG, 1, 5)).refers_to == 1
    assert reply.call("read", {}, read_of(BIG, 160, 5)).refers_to == 2


def test_empty_file_is_its_bracket_alone_and_never_a_stub(config: ContextConfig) -> None:
    reply = Reply(config, 0x13)
    outcome = read_of("", 1, 2000, path="notes.txt", abs_path="/ws/notes.txt")
    first = reply.call("read", {"path": "notes.txt"}, outcome)
    assert first.inserted_text == "[#0013 notes.txt empty sha e3b0c442]"
    assert first.full_text == "" and first.kind == "read"
    again = reply.call("read", {"path": "notes.txt"}, outcome)
    assert again.inserted_text == "[#0014 notes.txt empty sha e3b0c442]" and again.kind == "read"


def test_reads_are_never_capped(make_config: Callable[..., ContextConfig]) -> None:
    config = make_config(cap={"max_lines": 10, "head_lines": 2, "tail_lines": 2})
    rendered = Reply(config).call("read", {}, read_of(BIG, 1, 2000))
    assert len(rendered.inserted_text.split("\n")) == 341


def test_same_result_names_the_newest_full_listing(config: ContextConfig) -> None:
    reply = Reply(config, 0x26)
    listing = ListingOutcome("/ws/a.ts\n/ws/src/")
    first = reply.call("list", {"path": "."}, listing)
    assert first.inserted_text == "[#0026]\n/ws/a.ts\n/ws/src/" and first.kind == "listing"
    second = reply.call("list", {"path": "."}, listing)
    assert second.inserted_text == "[#0027] Same result as #0026."
    assert second.kind == "same" and second.refers_to == 0x26 and second.full_text == listing.body
    third = reply.call("list", {"path": "."}, listing)
    assert third.inserted_text == "[#0028] Same result as #0026."
    changed = reply.call("list", {"path": "."}, ListingOutcome("/ws/a.ts"))
    assert changed.inserted_text == "[#0029]\n/ws/a.ts"
    back = reply.call("list", {"path": "."}, listing)
    assert back.inserted_text == "[#002a] Same result as #0026."
    again_changed = reply.call("list", {"path": "."}, ListingOutcome("/ws/a.ts"))
    assert again_changed.inserted_text == "[#002b] Same result as #0029."


def test_same_result_needs_same_tool_and_arguments(config: ContextConfig) -> None:
    reply = Reply(config)
    reply.call("grep", {"pattern": "x", "path": "."}, ListingOutcome("No matches."))
    assert reply.call("grep", {"path": ".", "pattern": "x"}, ListingOutcome("No matches.")).kind == "same"
    assert reply.call("grep", {"pattern": "y", "path": "."}, ListingOutcome("No matches.")).kind == "listing"
    assert reply.call("glob", {"pattern": "x", "path": "."}, ListingOutcome("No matches.")).kind == "listing"


def test_listing_of_a_tool_outside_dedupe_by_result_is_never_deduplicated(
    make_config: Callable[..., ContextConfig],
) -> None:
    config = make_config(dedupe={"by_result": ["grep"]})
    reply = Reply(config)
    reply.call("list", {}, ListingOutcome("/ws/a"))
    assert reply.call("list", {}, ListingOutcome("/ws/a")).inserted_text == "[#0002]\n/ws/a"


def test_listing_is_capped_and_compared_in_full(make_config: Callable[..., ContextConfig]) -> None:
    config = make_config(cap={"max_lines": 3, "head_lines": 1, "tail_lines": 1})
    body = "\n".join(f"/ws/f{n}" for n in range(1, 6))
    reply = Reply(config)
    first = reply.call("glob", {"pattern": "*"}, ListingOutcome(body))
    assert first.inserted_text == "[#0001]\n/ws/f1\n[3 lines elided, full output #0001]\n/ws/f5"
    assert first.full_text == body
    assert reply.call("glob", {"pattern": "*"}, ListingOutcome(body)).inserted_text == "[#0002] Same result as #0001."


def test_output_is_capped_and_never_deduplicated(make_config: Callable[..., ContextConfig]) -> None:
    config = make_config(cap={"max_lines": 3, "head_lines": 1, "tail_lines": 1})
    reply = Reply(config, 0x20)
    text = "a\nb\nc\nd\n[exit 1]\n"
    first = reply.call("run", {"command": "x"}, OutputOutcome(text))
    assert first.inserted_text == "[#0020]\na\n[3 lines elided, full output #0020]\n[exit 1]"
    assert first.full_text == text and first.kind == "output"
    second = reply.call("run", {"command": "x"}, OutputOutcome("ok\n"))
    third = reply.call("run", {"command": "x"}, OutputOutcome("ok\n"))
    assert (second.inserted_text, third.inserted_text) == ("[#0021]\nok\n", "[#0022]\nok\n")


def test_error_is_one_short_line(config: ContextConfig) -> None:
    rendered = Reply(config, 7).call("read", {"path": "x"}, ErrorOutcome("No such file or folder: /ws/x"))
    assert rendered.inserted_text == "[#0007] No such file or folder: /ws/x"
    assert rendered.full_text == "No such file or folder: /ws/x" and rendered.kind == "error"


def test_as_prior_keeps_the_facts(config: ContextConfig) -> None:
    rendered = Reply(config).call("read", {}, read_of(BIG, 1, 10))
    prior = rendered.as_prior("read", "{}")
    assert prior == PriorResult(
        number=1,
        tool="read",
        args_key="{}",
        kind="read",
        full_text=rendered.full_text,
        abs_path="/ws/big.txt",
        sha256=BIG_SHA,
        first_line=1,
        last_line=10,
    )
