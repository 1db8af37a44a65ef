"""Documents read as text: a PDF, DOCX, PPTX, XLSX, ODT or EPUB file is converted (``chat.tools.convert``, in a
process of its own with its limits), and the text is kept by the SHA-256 of the file's bytes, so a file is
converted once however often it is read or searched."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import BinaryIO

from .context import Documents, ToolContext
from .errors import ToolError, shown

KINDS = {".pdf": "PDF", ".docx": "DOCX", ".pptx": "PPTX", ".xlsx": "XLSX", ".odt": "ODT", ".epub": "EPUB"}
"""The documents read as text, by the file name's suffix (any case)."""

CONVERTER_VERSION = "1"
"""Part of a cached text's name: a converter that writes other text changes it."""

CONVERTER = Path(__file__).with_name("convert.py")
"""Run as a script, so that nothing of Cachet is imported with it."""

_POLL_SECONDS = 0.05


def document_kind(name: str, head: bytes) -> str | None:
    """The kind of document a file named ``name`` whose first bytes are ``head`` is: its suffix names one and
    its bytes begin as that kind's do (a PDF's ``%PDF``, a ZIP's ``PK``; an OLE container for an Office file,
    as Office encrypts one); else ``None``, and the file is read as any other."""
    kind = KINDS.get(os.path.splitext(name)[1].lower())
    if kind == "PDF":
        return kind if b"%PDF-" in head[:1024] else None
    if kind is not None and (head.startswith(b"PK\x03\x04") or head.startswith(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1")):
        return kind
    return None


def document_bytes(handle: BinaryIO, *, kind: str, path: str | Path, ctx: ToolContext) -> bytes:
    """The bytes of the document open as ``handle``, from its start; refused when there are more than a document
    may have."""
    limit = ctx.documents.max_bytes
    handle.seek(0)
    data = handle.read(limit + 1)
    if len(data) > limit:
        size = os.fstat(handle.fileno()).st_size
        raise ToolError(ctx.config.error("document_too_large", path=shown(path), kind=kind, size=size, limit=limit))
    return data


def document_text(data: bytes, *, kind: str, sha256: str, path: str | Path, ctx: ToolContext) -> str:
    """The text of the document ``data`` (of ``kind``, whose SHA-256 is ``sha256``): kept from an earlier
    conversion, else converted now and kept. Refused with a one-line error when the file is encrypted, corrupt or
    too long, or its conversion runs out of time or memory, or is stopped."""
    documents = ctx.documents
    kept = _kept_path(documents, sha256, kind)
    if kept is not None:
        try:
            return kept.read_text(encoding="utf-8")
        except FileNotFoundError:
            pass
    answer = _converted(data, kind=kind, path=path, ctx=ctx)
    if "text" not in answer:
        raise ToolError(_refusal(answer, kind=kind, path=path, ctx=ctx))
    text = str(answer["text"])
    if kept is not None:
        _keep(kept, text)
    return text


def _kept_path(documents: Documents, sha256: str, kind: str) -> Path | None:
    if documents.cache is None:
        return None
    return documents.cache / sha256[:2] / f"{sha256}.{kind.lower()}.v{CONVERTER_VERSION}.txt"


def _keep(kept: Path, text: str) -> None:
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        partial = kept.with_name(f"{kept.name}.{os.getpid()}.partial")
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, kept)
    except OSError:
        pass  # not kept: the next read converts it again


def _converted(data: bytes, *, kind: str, path: str | Path, ctx: ToolContext) -> dict[str, object]:
    documents = ctx.documents
    seconds = max(1, int(documents.timeout))
    argv = [
        sys.executable,
        "-I",  # no environment, no user site, not the current folder: the converter and the packages it imports
        str(CONVERTER),
        kind,
        str(documents.max_pages),
        str(documents.max_chars),
        str(documents.memory_bytes),
        str(seconds),
    ]
    # The bytes go in, and the answer comes out, through memory files rather than pipes: nothing has to be pumped
    # while the converter works (a pipe holds 64 KiB), so waiting is a plain wait, checked for Stop and the time.
    given, out_fd, err_fd = _memory_file("document", data), _memory_file("text"), _memory_file("errors")
    try:
        process = subprocess.Popen(argv, cwd="/", env={"PATH": os.defpath}, stdin=given, stdout=out_fd, stderr=err_fd)
        try:
            _wait(process, path=path, kind=kind, ctx=ctx)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        out, err = _contents(out_fd), _contents(err_fd)
    finally:
        for fd in (given, out_fd, err_fd):
            os.close(fd)
    try:
        answer = json.loads(out)
    except ValueError:
        answer = None
    if isinstance(answer, dict):
        return answer
    if process.returncode in (-9, -24) or b"MemoryError" in err:  # the CPU limit's SIGKILL / SIGXCPU, or memory
        return {"error": "memory" if b"MemoryError" in err else "timeout", "detail": ""}
    return {"error": "corrupt", "detail": (err.decode("utf-8", "replace").strip().splitlines() or [""])[-1][:200]}


def _wait(process: subprocess.Popen[bytes], *, path: str | Path, kind: str, ctx: ToolContext) -> None:
    timeout = ctx.documents.timeout
    deadline = time.monotonic() + timeout
    while True:
        if ctx.cancelled():
            raise ToolError(ctx.config.error("document_stopped", path=shown(path), kind=kind))
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ToolError(ctx.config.error("document_timed_out", path=shown(path), kind=kind, seconds=f"{timeout:g}"))
        try:
            process.wait(timeout=min(_POLL_SECONDS, remaining))
            return
        except subprocess.TimeoutExpired:
            continue


def _memory_file(name: str, data: bytes = b"") -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _contents(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _refusal(answer: dict[str, object], *, kind: str, path: str | Path, ctx: ToolContext) -> str:
    config = ctx.config
    documents = ctx.documents
    reason = answer.get("error")
    detail = str(answer.get("detail") or "")
    where = shown(path)
    if reason == "encrypted":
        return config.error("document_encrypted", path=where, kind=kind)
    if reason == "pages":
        return config.error("document_pages", path=where, kind=kind, pages=detail, limit=documents.max_pages)
    if reason == "chars":
        return config.error("document_chars", path=where, kind=kind, limit=documents.max_chars)
    if reason == "memory":
        return config.error("document_memory", path=where, kind=kind, limit=documents.memory_bytes)
    if reason == "timeout":
        return config.error("document_timed_out", path=where, kind=kind, seconds=f"{documents.timeout:g}")
    return config.error("document_corrupt", path=where, kind=kind, detail=detail or "no detail")


def file_sha256(data: bytes) -> str:
    """The SHA-256 of a file's bytes, as the rules keep it."""
    return hashlib.sha256(data).hexdigest()
