from __future__ import annotations

from collections.abc import Callable

from sessions_app.hygiene import ContextConfig, TableRead, compaction_table, system_prompt_with_summary

SHA = "1c9e04ab" + "0" * 56
EMPTY = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

HEAD = (
    "## Files read before this summary\n"
    "Read a file again for its content; recall shows a result by its id.\n"
    "| Path | Lines | sha | Result |\n"
    "|---|---|---|---|\n"
)


def test_no_reads_no_table(config: ContextConfig) -> None:
    assert compaction_table([], config=config) == ""


def test_spec_example(config: ContextConfig) -> None:
    reads = [TableRead(0x12, "src/app.ts", "/ws/src/app.ts", 1, 200, 340, SHA)]
    assert compaction_table(reads, config=config) == HEAD + "| src/app.ts | 1-200 of 340 | 1c9e04ab | #0012 |"


def test_a_path_with_a_bar_or_line_breaks_stays_one_row_of_four_columns(config: ContextConfig) -> None:
    reads = [
        TableRead(1, "a|b.ts", "/ws/a|b.ts", 1, 2, 2, SHA),
        TableRead(2, "c\nd\r.ts", "/ws/c\nd\r.ts", 1, 0, 0, EMPTY),
    ]
    rows = compaction_table(reads, config=config).removeprefix(HEAD).split("\n")
    assert rows == ["| a\\|b.ts | 1-2 of 2 | 1c9e04ab | #0001 |", "| c\\nd\\r.ts | empty | e3b0c442 | #0002 |"]


def test_newest_read_per_file_newest_last(config: ContextConfig) -> None:
    reads = [
        TableRead(1, "a.ts", "/ws/a.ts", 1, 10, 10, SHA),
        TableRead(2, "notes.txt", "/ws/notes.txt", 1, 0, 0, EMPTY),
        TableRead(3, "./a.ts", "/ws/a.ts", 5, 10, 10, SHA),
        TableRead(4, "b.ts", "/ws/b.ts", 1, 2, 2, SHA),
    ]
    assert compaction_table(reads, config=config) == HEAD + (
        "| notes.txt | empty | e3b0c442 | #0002 |\n"
        "| ./a.ts | 5-10 of 10 | 1c9e04ab | #0003 |\n"
        "| b.ts | 1-2 of 2 | 1c9e04ab | #0004 |"
    )


def test_at_most_rows_dropping_the_oldest(make_config: Callable[..., ContextConfig]) -> None:
    config = make_config(compaction={"rows": 2})
    reads = [TableRead(n, f"f{n}", f"/ws/f{n}", 1, 1, 1, SHA) for n in range(1, 5)]
    reads.append(TableRead(5, "f1", "/ws/f1", 1, 1, 1, SHA))
    table = compaction_table(reads, config=config)
    assert table.split("\n")[4:] == [
        "| f4 | 1-1 of 1 | 1c9e04ab | #0004 |",
        "| f1 | 1-1 of 1 | 1c9e04ab | #0005 |",
    ]


def test_system_prompt_with_summary(config: ContextConfig) -> None:
    table = compaction_table([TableRead(0x12, "a.ts", "/ws/a.ts", 1, 2, 2, SHA)], config=config)
    prompt = system_prompt_with_summary("You are Cachet.\n", summary="  Did things.\n", table=table, config=config)
    assert prompt == (
        "You are Cachet.\n\n## Summary of the conversation so far\n\nDid things.\n\n"
        + HEAD
        + "| a.ts | 1-2 of 2 | 1c9e04ab | #0012 |"
    )
    assert system_prompt_with_summary("Base", summary="S", table="", config=config) == (
        "Base\n\n## Summary of the conversation so far\n\nS"
    )
