"""Real documents of each kind Cachet reads as text, made by the libraries' own writers (reportlab for PDF)."""

from __future__ import annotations

import io


def pdf(pages: list[str], *, password: str | None = None) -> bytes:
    """A PDF with one page per text (each line of a text a line on its page), encrypted where ``password``."""
    from reportlab.lib.pagesizes import A4
    from reportlab.pdfgen import canvas

    out = io.BytesIO()
    drawing = canvas.Canvas(out, pagesize=A4, invariant=True)
    for text in pages:
        y = 800
        for line in text.splitlines():
            drawing.drawString(72, y, line)
            y -= 16
        drawing.showPage()
    drawing.save()
    if password is None:
        return out.getvalue()
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(out.getvalue())))
    writer.encrypt(user_password=password, owner_password=password, algorithm="AES-128")
    encrypted = io.BytesIO()
    writer.write(encrypted)
    return encrypted.getvalue()


def docx(title: str, paragraphs: list[str], table: list[list[str]] | None = None) -> bytes:
    import docx as python_docx

    document = python_docx.Document()
    document.add_heading(title, level=1)
    for text in paragraphs:
        document.add_paragraph(text)
    if table:
        grid = document.add_table(rows=len(table), cols=len(table[0]))
        for row, cells in zip(grid.rows, table, strict=True):
            for cell, text in zip(row.cells, cells, strict=True):
                cell.text = text
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def pptx(slides: list[tuple[str, str]], notes: str = "") -> bytes:
    from pptx import Presentation

    presentation = Presentation()
    for title, body in slides:
        slide = presentation.slides.add_slide(presentation.slide_layouts[1])
        slide.shapes.title.text = title
        slide.placeholders[1].text = body
        if notes:
            slide.notes_slide.notes_text_frame.text = notes
    out = io.BytesIO()
    presentation.save(out)
    return out.getvalue()


def xlsx(sheets: dict[str, list[list[object]]]) -> bytes:
    from openpyxl import Workbook

    workbook = Workbook()
    workbook.remove(workbook.active)
    for name, rows in sheets.items():
        sheet = workbook.create_sheet(name)
        for row in rows:
            sheet.append(row)
    out = io.BytesIO()
    workbook.save(out)
    return out.getvalue()


def odt(heading: str, paragraphs: list[str]) -> bytes:
    from odf.opendocument import OpenDocumentText
    from odf.text import H, P

    document = OpenDocumentText()
    document.text.addElement(H(outlinelevel=1, text=heading))
    for text in paragraphs:
        document.text.addElement(P(text=text))
    out = io.BytesIO()
    document.write(out)
    return out.getvalue()


def epub(title: str, chapters: list[tuple[str, str]]) -> bytes:
    from ebooklib import epub as ebook

    book = ebook.EpubBook()
    book.set_identifier("cachet-test-book")
    book.set_title(title)
    book.set_language("en")
    items = []
    for number, (heading, text) in enumerate(chapters, start=1):
        item = ebook.EpubHtml(title=heading, file_name=f"chapter{number}.xhtml", lang="en")
        item.content = f"<html><body><h1>{heading}</h1><p>{text}</p></body></html>"
        book.add_item(item)
        items.append(item)
    book.toc = items
    book.add_item(ebook.EpubNcx())
    book.add_item(ebook.EpubNav())
    book.spine = ["nav", *items]
    out = io.BytesIO()
    ebook.write_epub(out, book)
    return out.getvalue()
