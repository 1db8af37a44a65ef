from __future__ import annotations

from collections.abc import Iterator

import pytest

from testing.llama import LlamaServer
from testing.tiny_gguf import ModelShape, write_model

LLAMA_CONTEXT = 32768


@pytest.fixture(scope="session")
def llama_32k(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """A real llama.cpp server on the generated tiny model, with a 32k window, one slot and no host-memory
    prompt cache (so a slot taken by another session is a miss), for every test of the process that asks for
    that shape: loading it once saves a start per file."""
    model = write_model(tmp_path_factory.mktemp("model") / "tiny.gguf", ModelShape(ctx=LLAMA_CONTEXT))
    with LlamaServer(model, ctx_size=LLAMA_CONTEXT, n_predict=8, alias="tiny", cache_ram_mib=0) as server:
        yield server
