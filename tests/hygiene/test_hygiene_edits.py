from __future__ import annotations

import hashlib
from collections.abc import Callable

from sessions_app.hygiene import (
    ContextConfig,
    EditOutcome,
    FileChange,
    Kind,
    Outcome,
    PriorResult,
    ReadOutcome,
    Rendered,
    last_seen_sha,
    render_result,
)

SHA_A = "1c9e04ab" + "0" * 56
SHA_B = "7d0a91c3" + "1" * 56
SHA_C = "52b6e3a0" + "2" * 56
DIFF = "@@ -12,3 +12,3 @@\n a\n-b\n+B\n c\n"


def read(path: str, sha: str, first: int = 1, last: int = 20, total: int = 340) -> ReadOutcome:
    return ReadOutcome(path, "/ws/" + path, first, 2000, first, last, total, sha, "1: x")


def update(path: str, sha: str, diff: str = DIFF) -> FileChange:
    return FileChange(path, "/ws/" + path, "update", sha, diff=diff)


def create(path: str, sha: str, lines: int) -> FileChange:
    return FileChange(path, "/ws/" + path, "create", sha, lines=lines)


def delete(path: str) -> FileChange:
    return FileChange(path, "/ws/" + path, "delete", "")


class Reply:
    def __init__(self, config: ContextConfig) -> None:
        self.config = config
        self.table: list[PriorResult] = []

    def call(self, number: int, outcome: Outcome) -> Rendered:
        tool = "read" if isinstance(outcome, ReadOutcome) else "edit"
        rendered = render_result(
            number=number, tool=tool, args_key="{}", outcome=outcome, table=self.table, config=self.config
        )
        self.table.append(rendered.as_prior(tool, "{}"))
        return rendered


def test_update_answers_the_diff_under_the_new_sha(config: ContextConfig) -> None:
    rendered = Reply(config).call(0x22, EditOutcome((update("src/app.ts", SHA_B),)))
    assert rendered.inserted_text == "[#0022 src/app.ts sha 7d0a91c3]\n@@ -12,3 +12,3 @@\n a\n-b\n+B\n c"
    assert rendered.full_text == "@@ -12,3 +12,3 @@\n a\n-b\n+B\n c"
    assert rendered.kind == Kind.EDIT and rendered.changed_files == (("/ws/src/app.ts", SHA_B),)


def test_create_and_delete(config: ContextConfig) -> None:
    reply = Reply(config)
    created = reply.call(0x23, EditOutcome((create("docs/new.md", SHA_C, 14),)))
    assert created.inserted_text == "[#0023 docs/new.md sha 52b6e3a0] Created, 14 lines."
    assert created.full_text == "Created, 14 lines."
    deleted = reply.call(0x24, EditOutcome((delete("old.md"),)))
    assert deleted.inserted_text == "[#0024 old.md deleted]" and deleted.full_text == ""


def test_paths_with_line_breaks_keep_every_bracket_one_line(config: ContextConfig) -> None:
    reply = Reply(config)
    updated = reply.call(1, EditOutcome((update("a\nb.ts", SHA_B),)))
    assert updated.inserted_text.split("\n")[0] == "[#0001 a\\nb.ts sha 7d0a91c3]"
    created = reply.call(2, EditOutcome((create("new\r\n.md", SHA_C, 2),)))
    assert created.inserted_text == "[#0002 new\\r\\n.md sha 52b6e3a0] Created, 2 lines."
    deleted = reply.call(3, EditOutcome((delete("old\n.md"),)))
    assert deleted.inserted_text == "[#0003 old\\n.md deleted]"
    several = reply.call(4, EditOutcome((update("a\nb.ts", SHA_A), create("c|\n", SHA_C, 1), delete("d\r")), True))
    assert several.inserted_text == (
        "[#0004]\n[a\\nb.ts sha 1c9e04ab]\n@@ -12,3 +12,3 @@\n a\n-b\n+B\n c\n"
        "[c|\\n sha 52b6e3a0] Created, 1 lines.\n[d\\r deleted]"
    )
    assert several.full_text == several.inserted_text.removeprefix("[#0004]\n"), "recall shows the same brackets"


def test_the_stale_notice_follows_the_created_line(config: ContextConfig) -> None:
    reply = Reply(config)
    reply.call(1, read("docs/new.md", SHA_A))
    created = reply.call(2, EditOutcome((create("docs/new.md", SHA_C, 14),)))
    assert created.inserted_text == (
        "[#0002 docs/new.md sha 52b6e3a0] Created, 14 lines.\nEarlier reads of this file are stale: #0001."
    )
    assert created.full_text == "Created, 14 lines.\nEarlier reads of this file are stale: #0001."


def test_unchanged_content_is_the_bracket_alone(config: ContextConfig) -> None:
    reply = Reply(config)
    reply.call(1, read("a.ts", SHA_A))
    rendered = reply.call(2, EditOutcome((update("a.ts", SHA_A, diff=""),)))
    assert rendered.inserted_text == "[#0002 a.ts sha 1c9e04ab]" and rendered.stale == ()
    later = reply.call(3, EditOutcome((update("a.ts", SHA_B),)))
    assert later.inserted_text.endswith("\nEarlier reads of this file are stale: #0001.")


def test_several_files_in_the_patch_order(config: ContextConfig) -> None:
    patch = EditOutcome(
        (
            update("src/a.ts", SHA_B, "@@ -1,2 +1,2 @@\n-a\n+b\n x\n"),
            create("docs/new.md", SHA_C, 14),
            delete("old.md"),
        ),
        several=True,
    )
    rendered = Reply(config).call(0x25, patch)
    assert rendered.inserted_text == (
        "[#0025]\n[src/a.ts sha 7d0a91c3]\n@@ -1,2 +1,2 @@\n-a\n+b\n x\n"
        "[docs/new.md sha 52b6e3a0] Created, 14 lines.\n[old.md deleted]"
    )
    assert rendered.full_text == rendered.inserted_text.removeprefix("[#0025]\n")
    assert rendered.changed_files == (("/ws/src/a.ts", SHA_B), ("/ws/docs/new.md", SHA_C), ("/ws/old.md", ""))


def test_stale_notice_names_reads_and_stubs_once(config: ContextConfig) -> None:
    reply = Reply(config)
    reply.call(0x12, read("src/app.ts", SHA_A, 1, 200))
    stub = reply.call(0x19, read("src/app.ts", SHA_A, 50, 80))
    assert stub.kind == "stub"
    reply.call(0x1A, read("other.ts", SHA_A))
    first = reply.call(0x22, EditOutcome((update("src/app.ts", SHA_B),)))
    assert first.inserted_text == (
        "[#0022 src/app.ts sha 7d0a91c3]\n@@ -12,3 +12,3 @@\n a\n-b\n+B\n c\n"
        "Earlier reads of this file are stale: #0012, #0019."
    )
    assert first.stale == (0x12, 0x19)
    assert first.full_text.endswith("c\nEarlier reads of this file are stale: #0012, #0019.")
    second = reply.call(0x23, EditOutcome((update("src/app.ts", SHA_C),)))
    assert "stale" not in second.inserted_text and second.stale == ()
    reply.call(0x24, read("src/app.ts", SHA_C, 1, 200))
    third = reply.call(0x25, EditOutcome((delete("src/app.ts"),)))
    assert third.inserted_text == "[#0025 src/app.ts deleted]\nEarlier reads of this file are stale: #0024."
    assert third.full_text == "Earlier reads of this file are stale: #0024."


def test_stale_notice_in_a_several_file_patch(config: ContextConfig) -> None:
    reply = Reply(config)
    reply.call(1, read("a.ts", SHA_A))
    reply.call(2, read("b.ts", SHA_A))
    patch = EditOutcome((update("a.ts", SHA_B, "@@ -1 +1 @@\n-a\n+b\n"), delete("b.ts")), several=True)
    rendered = reply.call(3, patch)
    assert rendered.inserted_text == (
        "[#0003]\n[a.ts sha 7d0a91c3]\n@@ -1 +1 @@\n-a\n+b\n"
        "Earlier reads of this file are stale: #0001.\n"
        "[b.ts deleted]\nEarlier reads of this file are stale: #0002."
    )
    assert rendered.stale == (1, 2)


def test_capped_diff_keeps_the_notice(make_config: Callable[..., ContextConfig]) -> None:
    config = make_config(cap={"max_lines": 4, "head_lines": 2, "tail_lines": 1})
    diff = "@@ -1,6 +1,6 @@\n" + "".join(f"-{n}\n+{n}!\n" for n in range(1, 4))
    reply = Reply(config)
    reply.call(1, read("a.ts", SHA_A))
    rendered = reply.call(2, EditOutcome((update("a.ts", SHA_B, diff),)))
    assert rendered.inserted_text == (
        "[#0002 a.ts sha 7d0a91c3]\n@@ -1,6 +1,6 @@\n-1\n[4 lines elided, full output #0002]\n+3!\n"
        "Earlier reads of this file are stale: #0001."
    )
    assert rendered.full_text == diff + "Earlier reads of this file are stale: #0001."


def test_last_seen_sha(config: ContextConfig) -> None:
    reply = Reply(config)
    assert last_seen_sha(reply.table, "/ws/a.ts") is None
    reply.call(1, read("a.ts", SHA_A))
    assert last_seen_sha(reply.table, "/ws/a.ts") == SHA_A
    reply.call(2, EditOutcome((update("a.ts", SHA_B),)))
    assert last_seen_sha(reply.table, "/ws/a.ts") == SHA_B
    reply.call(3, read("a.ts", SHA_C))
    assert last_seen_sha(reply.table, "/ws/a.ts") == SHA_C
    reply.call(4, read("a.ts", SHA_C, 5, 6))
    assert reply.table[-1].kind == "stub" and last_seen_sha(reply.table, "/ws/a.ts") == SHA_C
    reply.call(5, EditOutcome((update("b.ts", SHA_A), delete("a.ts")), several=True))
    assert last_seen_sha(reply.table, "/ws/a.ts") == ""
    assert last_seen_sha(reply.table, "/ws/b.ts") == SHA_A


def test_sha_of_real_content_is_shortened(config: ContextConfig) -> None:
    sha = hashlib.sha256(b"x\n").hexdigest()
    rendered = Reply(config).call(1, EditOutcome((create("x.txt", sha, 1),)))
    assert rendered.inserted_text == f"[#0001 x.txt sha {sha[:8]}] Created, 1 lines."
