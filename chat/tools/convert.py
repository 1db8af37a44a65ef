"""The text of a document, converted in a process of its own: ``python -I chat/tools/convert.py KIND MAX_PAGES
MAX_CHARS MEMORY_BYTES CPU_SECONDS`` reads the file's bytes from standard input and writes one JSON object to
standard output: ``{"text": …}``, or ``{"error": "encrypted" | "corrupt" | "pages" | "chars", "detail": …}``.

The process limits itself before it reads anything (address space, CPU time, the size of what it writes), so a file made
to exhaust a parser ends this process, never the worker that asked. It imports no Django and reads no setting.
"""

from __future__ import annotations

import io
import json
import re
import resource
import sys
from collections.abc import Callable
from html.parser import HTMLParser
from typing import Any


class Refused(Exception):
    """A document this converter will not turn into text: ``reason`` is the error's key."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


class Bounds:
    """What one conversion may produce: pages (or slides, sheets, chapters) and characters."""

    def __init__(self, max_pages: int, max_chars: int) -> None:
        self.max_pages = max_pages
        self.max_chars = max_chars
        self.chars = 0

    def pages(self, count: int) -> None:
        if count > self.max_pages:
            raise Refused("pages", str(count))

    def count(self, chars: int) -> None:
        self.chars += chars
        if self.chars > self.max_chars:
            raise Refused("chars", str(self.max_chars))

    def add(self, parts: list[str], text: str) -> None:
        self.count(len(text) + 1)
        parts.append(text)


def _clean(text: str) -> str:
    return re.sub(r"[ \t]+\n", "\n", text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")).strip()


def pdf_text(data: bytes, bounds: Bounds) -> str:
    from pypdf import PdfReader
    from pypdf.errors import FileNotDecryptedError

    reader = PdfReader(io.BytesIO(data))
    if reader.is_encrypted and not reader.decrypt(""):
        raise Refused("encrypted")
    try:
        pages = reader.pages
        bounds.pages(len(pages))
        parts: list[str] = []
        for number, page in enumerate(pages, start=1):
            bounds.add(parts, f"## Page {number}\n\n{_clean(page.extract_text() or '')}".rstrip())
    except FileNotDecryptedError:
        raise Refused("encrypted") from None
    return "\n\n".join(parts)


def docx_text(data: bytes, bounds: Bounds) -> str:
    import docx
    from docx.table import Table
    from docx.text.paragraph import Paragraph

    document = docx.Document(io.BytesIO(data))
    parts: list[str] = []
    for block in document.iter_inner_content():
        if isinstance(block, Paragraph):
            text = _clean(block.text)
            if not text:
                continue
            style = (block.style.name if block.style is not None else "") or ""
            heading = re.fullmatch(r"Heading (\d)", style)
            if style == "Title":
                text = f"# {text}"
            elif heading:
                text = "#" * min(6, int(heading.group(1)) + 1) + " " + text
            elif style.startswith("List"):
                text = f"- {text}"
            bounds.add(parts, text)
        elif isinstance(block, Table):
            bounds.add(parts, _table([[cell.text for cell in row.cells] for row in block.rows]))
    return "\n\n".join(parts)


def pptx_text(data: bytes, bounds: Bounds) -> str:
    from pptx import Presentation

    presentation = Presentation(io.BytesIO(data))
    slides = list(presentation.slides)
    bounds.pages(len(slides))
    parts: list[str] = []
    for number, slide in enumerate(slides, start=1):
        texts = [f"## Slide {number}"]
        for shape in slide.shapes:
            if shape.has_text_frame and _clean(shape.text_frame.text):
                texts.append(_clean(shape.text_frame.text))
            elif getattr(shape, "has_table", False):
                texts.append(_table([[cell.text for cell in row.cells] for row in shape.table.rows]))
        if slide.has_notes_slide and slide.notes_slide.notes_text_frame is not None:
            notes = _clean(slide.notes_slide.notes_text_frame.text)
            if notes:
                texts.append(f"Notes: {notes}")
        bounds.add(parts, "\n\n".join(texts))
    return "\n\n".join(parts)


def xlsx_text(data: bytes, bounds: Bounds) -> str:
    from openpyxl import load_workbook

    workbook = load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    bounds.pages(len(workbook.worksheets))
    parts: list[str] = []
    for sheet in workbook.worksheets:
        rows: list[list[str]] = []
        for row in sheet.iter_rows(values_only=True):
            cells = ["" if value is None else str(value) for value in row]
            while cells and not cells[-1]:
                cells.pop()
            if cells:
                bounds.count(sum(len(cell) + 3 for cell in cells))
                rows.append(cells)
        width = max((len(cells) for cells in rows), default=0)
        table = _table([cells + [""] * (width - len(cells)) for cells in rows])
        parts.append(f"## Sheet {sheet.title}" + (f"\n\n{table}" if table else ""))
    workbook.close()
    return "\n\n".join(parts)


def odt_text(data: bytes, bounds: Bounds) -> str:
    from odf import teletype
    from odf.namespaces import TABLENS, TEXTNS
    from odf.opendocument import load

    document = load(io.BytesIO(data))
    parts: list[str] = []

    def walk(element: Any) -> None:
        for child in element.childNodes:
            kind = getattr(child, "qname", None)
            if kind == (TEXTNS, "h"):
                level = int(child.getAttribute("outlinelevel") or 1)
                bounds.add(parts, "#" * min(6, level + 1) + " " + _clean(teletype.extractText(child)))
            elif kind == (TEXTNS, "p"):
                text = _clean(teletype.extractText(child))
                if text:
                    bounds.add(parts, text)
            elif kind == (TEXTNS, "list-item"):
                text = _clean(teletype.extractText(child))
                if text:
                    bounds.add(parts, f"- {text}")
            elif kind == (TABLENS, "table"):
                rows = [
                    [_clean(teletype.extractText(cell)) for cell in row.getElementsByType(_odf_cell())]
                    for row in child.getElementsByType(_odf_row())
                ]
                bounds.add(parts, _table(rows))
            elif getattr(child, "childNodes", None):
                walk(child)

    walk(document.text)
    return "\n\n".join(parts)


def _odf_row() -> Any:
    from odf.table import TableRow

    return TableRow


def _odf_cell() -> Any:
    from odf.table import TableCell

    return TableCell


class _HtmlText(HTMLParser):
    """The text of (X)HTML: a blank line between blocks, headings as markdown's, scripts and styles left out."""

    BLOCKS = {"p", "div", "br", "li", "tr", "section", "article", "blockquote", "pre", "table", "ul", "ol", "hr"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in {"script", "style", "head"}:
            self.skipping += 1
        elif re.fullmatch(r"h[1-6]", tag):
            self.parts.append("\n\n" + "#" * int(tag[1]) + " ")
        elif tag == "li":
            self.parts.append("\n- ")
        elif tag in self.BLOCKS:
            self.parts.append("\n\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in {"script", "style", "head"}:
            self.skipping = max(0, self.skipping - 1)
        elif re.fullmatch(r"h[1-6]", tag) or tag in self.BLOCKS:
            self.parts.append("\n\n")

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            self.parts.append(re.sub(r"\s+", " ", data))

    def text(self) -> str:
        joined = "".join(self.parts)
        lines = [re.sub(r"^- +", "- ", line.strip()) for line in joined.split("\n")]
        return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def html_text(markup: str) -> str:
    parser = _HtmlText()
    parser.feed(markup)
    parser.close()
    return parser.text()


def epub_text(data: bytes, bounds: Bounds) -> str:
    import ebooklib
    from ebooklib import epub

    book = epub.read_epub(io.BytesIO(data), {"ignore_ncx": True})
    chapters = [book.get_item_with_id(idref) for idref, _ in book.spine]
    documents = [
        item
        for item in chapters
        if item is not None
        and item.get_type() == ebooklib.ITEM_DOCUMENT
        and getattr(item, "is_chapter", lambda: True)()
    ]
    bounds.pages(len(documents))
    parts: list[str] = []
    for item in documents:
        text = html_text(item.get_content().decode("utf-8", "replace"))
        if text:
            bounds.add(parts, text)
    return "\n\n".join(parts)


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(_clean(cell).replace("|", "\\|").replace("\n", " ") for cell in cells) + " |"


def _table(rows: list[list[str]]) -> str:
    lines = [_row(row) for row in rows]
    if len(lines) > 1:
        lines.insert(1, "|" + "---|" * len(rows[0]))
    return "\n".join(lines)


CONVERTERS: dict[str, Callable[[bytes, Bounds], str]] = {
    "PDF": pdf_text,
    "DOCX": docx_text,
    "PPTX": pptx_text,
    "XLSX": xlsx_text,
    "ODT": odt_text,
    "EPUB": epub_text,
}
OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"


def convert(kind: str, data: bytes, bounds: Bounds) -> dict[str, str]:
    """The answer for ``data`` as a document of ``kind``."""
    if kind in {"DOCX", "PPTX", "XLSX"} and data.startswith(OLE_MAGIC):
        return {"error": "encrypted", "detail": ""}  # Office wraps an encrypted file in an OLE container
    try:
        return {"text": CONVERTERS[kind](data, bounds)}
    except Refused as refused:
        return {"error": refused.reason, "detail": refused.detail}
    except MemoryError:
        return {"error": "memory", "detail": ""}
    except Exception as error:  # whatever a malformed file makes a parser raise
        return {"error": "corrupt", "detail": _detail(error)}


def _detail(error: BaseException) -> str:
    text = " ".join(str(error).split())[:200]
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _limited(memory_bytes: int, cpu_seconds: int, max_chars: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    written = max_chars * 6 + (1 << 20)  # the answer's JSON at most (a character escaped as \\uXXXX), in any file
    resource.setrlimit(resource.RLIMIT_FSIZE, (written, written))


def main(argv: list[str]) -> int:
    kind, max_pages, max_chars, memory_bytes, cpu_seconds = argv
    _limited(int(memory_bytes), int(cpu_seconds), int(max_chars))
    data = sys.stdin.buffer.read()
    answer = convert(kind, data, Bounds(int(max_pages), int(max_chars)))
    sys.stdout.write(json.dumps(answer))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
