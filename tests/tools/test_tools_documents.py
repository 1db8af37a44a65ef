from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from chat.tools import ToolContext, ToolError, read
from chat.tools import documents as documents_module
from chat.tools.context import Documents
from chat.tools.search import grep
from sessions_app.hygiene.outcomes import ListingOutcome, ReadOutcome
from tests import document_kit as kit

KINDS: dict[str, tuple[str, Callable[[], bytes], list[str]]] = {
    "PDF": ("report.pdf", lambda: kit.pdf(["Quarterly report", "Revenue grew by forty percent"]), ["## Page 2"]),
    "DOCX": (
        "memo.docx",
        lambda: kit.docx("Memo", ["Revenue grew by forty percent."], [["region", "sales"], ["north", "12"]]),
        ["## Memo", "| north | 12 |"],
    ),
    "PPTX": ("deck.pptx", lambda: kit.pptx([("Results", "Revenue grew by forty percent")]), ["## Slide 1"]),
    "XLSX": (
        "sheet.xlsx",
        lambda: kit.xlsx({"Sales": [["item", "note"], ["widgets", "Revenue grew by forty percent"]]}),
        ["## Sheet Sales", "| widgets | Revenue grew by forty percent |"],
    ),
    "ODT": ("letter.odt", lambda: kit.odt("Letter", ["Revenue grew by forty percent."]), ["## Letter"]),
    "EPUB": (
        "book.epub",
        lambda: kit.epub("Book", [("Chapter One", "Revenue grew by forty percent.")]),
        ["# Chapter One"],
    ),
}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_reads_as_its_text_with_the_sha_of_its_bytes(kind: str, ws: Path, ctx: ToolContext) -> None:
    name, make, expected = KINDS[kind]
    data = make()
    (ws / name).write_bytes(data)
    outcome = read({"path": name}, ctx)
    assert isinstance(outcome, ReadOutcome)
    assert outcome.converted == kind
    assert outcome.sha256 == sha(data)
    assert outcome.first_line == 1 and outcome.total_lines == outcome.last_line > 1
    assert "Revenue grew by forty percent" in outcome.body
    for text in expected:
        assert text in outcome.body
    assert outcome.body.startswith("1: ")


def test_a_window_of_a_documents_text(ws: Path, ctx: ToolContext) -> None:
    (ws / "long.pdf").write_bytes(kit.pdf(["\n".join(f"row {n}" for n in range(1, 31))]))
    outcome = read({"path": "long.pdf", "offset": 5, "limit": 3}, ctx)
    assert isinstance(outcome, ReadOutcome)
    assert (outcome.first_line, outcome.last_line, outcome.total_lines) == (5, 7, 32)
    assert outcome.body == "5: row 3\n6: row 4\n7: row 5"


def test_a_long_document_more_than_a_pipe_holds_each_way_converts(ws: Path, ctx: ToolContext) -> None:
    lines = range(40)
    pages = ["\n".join(f"page {page} line {line} about topic {page * line}" for line in lines) for page in range(150)]
    data = kit.pdf(pages)
    assert len(data) > 128 * 1024
    (ws / "long.pdf").write_bytes(data)
    outcome = read({"path": "long.pdf", "offset": 6000}, ctx)  # the text is over 200 KB
    assert isinstance(outcome, ReadOutcome)
    assert (outcome.first_line, outcome.last_line, outcome.total_lines) == (6000, 6449, 150 * 43 - 1)
    assert outcome.body.endswith("6449: page 149 line 39 about topic 5811")


def test_a_file_named_like_a_document_that_is_not_one_reads_as_text(ws: Path, ctx: ToolContext) -> None:
    (ws / "notes.pdf").write_text("just text\n")
    outcome = read({"path": "notes.pdf"}, ctx)
    assert isinstance(outcome, ReadOutcome)
    assert (outcome.converted, outcome.body) == ("", "1: just text")


def test_an_encrypted_pdf_and_office_file_are_refused_in_one_line(ws: Path, ctx: ToolContext) -> None:
    (ws / "secret.pdf").write_bytes(kit.pdf(["the secret"], password="hunter2"))
    with pytest.raises(ToolError) as refused:
        read({"path": "secret.pdf"}, ctx)
    assert str(refused.value) == (
        f"Refused: {ws / 'secret.pdf'} is an encrypted PDF; its text cannot be read without its password."
    )
    (ws / "locked.docx").write_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\0" * 600)  # Office's encrypted container
    with pytest.raises(ToolError, match=r"locked\.docx is an encrypted DOCX"):
        read({"path": "locked.docx"}, ctx)


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("cut.pdf", kit.pdf(["a page"])[:400]),
        ("broken.docx", b"PK\x03\x04" + b"not a zip at all" * 40),
        ("broken.xlsx", kit.xlsx({"S": [["x"]]})[:900]),
    ],
)
def test_a_corrupt_document_is_refused_and_says_so(name: str, data: bytes, ws: Path, ctx: ToolContext) -> None:
    (ws / name).write_bytes(data)
    with pytest.raises(ToolError) as refused:
        read({"path": name}, ctx)
    message = str(refused.value)
    assert message.startswith(f"Refused: {ws / name} could not be read as a ")
    assert "it is damaged or not one (" in message and "\n" not in message


def test_limits_of_size_pages_memory_and_time(ws: Path, make_ctx: Callable[..., ToolContext]) -> None:
    data = kit.pdf(["one", "two", "three"])
    (ws / "three.pdf").write_bytes(data)
    small = make_ctx(documents=Documents(max_bytes=len(data) - 1))
    with pytest.raises(
        ToolError, match=rf"three\.pdf is {len(data)} bytes; a PDF is read as text up to {len(data) - 1}"
    ):
        read({"path": "three.pdf"}, small)
    with pytest.raises(
        ToolError, match=r"three\.pdf has 3 pages, slides, sheets or chapters; a PDF is read as text up to 2\."
    ):
        read({"path": "three.pdf"}, make_ctx(documents=Documents(max_pages=2)))
    with pytest.raises(ToolError, match=r"needed more than 31457280 bytes of memory"):
        read({"path": "three.pdf"}, make_ctx(documents=Documents(memory_bytes=30 * 1024**2)))
    with pytest.raises(ToolError, match=r"took longer than 0.01 s, its time limit"):
        read({"path": "three.pdf"}, make_ctx(documents=Documents(timeout=0.01)))
    with pytest.raises(ToolError, match=r"Reading .*three\.pdf as text was stopped"):
        read({"path": "three.pdf"}, make_ctx(cancelled=lambda: True))


def test_text_is_kept_by_sha_so_a_file_converts_once(
    ws: Path, tmp_path: Path, make_ctx: Callable[..., ToolContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = make_ctx(documents=Documents(cache=tmp_path / "documents"))
    data = kit.docx("Kept", ["converted once"])
    (ws / "a.docx").write_bytes(data)
    (ws / "copy.docx").write_bytes(data)
    first = read({"path": "a.docx"}, ctx)
    assert len(list((tmp_path / "documents").rglob("*.txt"))) == 1
    monkeypatch.setattr(documents_module, "CONVERTER", tmp_path / "missing.py")  # no conversion can run now
    again = read({"path": "copy.docx"}, ctx)
    assert isinstance(first, ReadOutcome) and isinstance(again, ReadOutcome)
    assert (again.body, again.sha256) == (first.body, first.sha256)
    (ws / "a.docx").write_bytes(kit.docx("Changed", ["a new version"]))
    with pytest.raises(ToolError, match="could not be read as a DOCX"):  # changed bytes: converted again
        read({"path": "a.docx"}, ctx)


def test_grep_searches_documents_text_in_a_folder_and_alone(ws: Path, ctx: ToolContext) -> None:
    (ws / "docs").mkdir()
    (ws / "docs" / "plan.pdf").write_bytes(kit.pdf(["Intro", "the budget is tight"]))
    (ws / "docs" / "notes.txt").write_text("budget notes\n")
    (ws / "docs" / "memo.DOCX").write_bytes(kit.docx("Memo", ["no budget here", "other words"]))
    (ws / "docs" / "fake.pdf").write_text("a budget in a text file named .pdf\n")
    (ws / "docs" / "secret.pdf").write_bytes(kit.pdf(["budget"], password="pw"))  # skipped, as binary files are
    outcome = grep({"pattern": "budget", "path": "docs"}, ctx)
    assert isinstance(outcome, ListingOutcome)
    assert outcome.body.splitlines() == [
        f"{ws}/docs/fake.pdf:1: a budget in a text file named .pdf",
        f"{ws}/docs/memo.DOCX:3: no budget here",
        f"{ws}/docs/notes.txt:1: budget notes",
        f"{ws}/docs/plan.pdf:7: the budget is tight",
    ]
    only_pdf = grep({"pattern": "budget", "path": "docs", "glob": "*.pdf"}, ctx)
    assert isinstance(only_pdf, ListingOutcome)
    assert [line.split(":")[0] for line in only_pdf.body.splitlines()] == [
        f"{ws}/docs/fake.pdf",
        f"{ws}/docs/plan.pdf",
    ]
    no_docs = grep({"pattern": "budget", "path": "docs", "glob": "*.txt"}, ctx)
    assert isinstance(no_docs, ListingOutcome) and no_docs.body == f"{ws}/docs/notes.txt:1: budget notes"
    alone = grep({"pattern": "tight", "path": "docs/plan.pdf"}, ctx)
    assert isinstance(alone, ListingOutcome) and alone.body == f"{ws}/docs/plan.pdf:7: the budget is tight"
    with pytest.raises(ToolError, match="encrypted PDF"):
        grep({"pattern": "budget", "path": "docs/secret.pdf"}, ctx)


def test_a_document_behind_a_symlink_out_of_the_workspace_is_refused(
    ws: Path, tmp_path: Path, ctx: ToolContext
) -> None:
    outside = tmp_path / "outside.pdf"
    outside.write_bytes(kit.pdf(["private"]))
    (ws / "link.pdf").symlink_to(outside)
    with pytest.raises(ToolError, match="outside the workspace"):
        read({"path": "link.pdf"}, ctx)
    outcome = grep({"pattern": "private", "path": "."}, ctx)
    assert isinstance(outcome, ListingOutcome) and "private" not in outcome.body
