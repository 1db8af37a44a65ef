"""llama.cpp's own HTTP server, run in this process by xllamacpp, for tests and benchmarks.

`xllamacpp.Server(params)` loads the model and starts llama-server's HTTP listener on native
threads; dropping the last reference stops it (its destructor waits for the main loop to exit).
"""

from __future__ import annotations

import gc
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from chat.agent import server_api


class LlamaServerError(RuntimeError):
    pass


class LlamaServer:
    """A llama-server on 127.0.0.1 with one slot (``parallel`` slots share ``ctx_size``), prompt caching and jinja
    chat templates.

    ``cache_ram_mib`` sizes the host-memory prompt cache (llama-server's ``--cache-ram``; 0 switches it off,
    ``None`` keeps the server's default, 8192 MiB) and ``slot_prompt_similarity`` is ``--slot-prompt-similarity``
    (``None``: the default, 0.1). ``chat_template`` (jinja) replaces the model's own, as ``--chat-template-file``.
    ``slot_save_path`` is ``--slot-save-path`` (slots saved to and restored from files there). ``projector`` is
    ``--mmproj``: a multimodal projector (see `testing.tiny_gguf.write_projector`) that lets it read images.
    """

    def __init__(
        self,
        model_path: Path,
        *,
        ctx_size: int = 4096,
        threads: int = 2,
        port: int | None = None,
        alias: str | None = None,
        startup_timeout: float = 60.0,
        verbosity: int = 2,
        n_predict: int = -1,
        cache_ram_mib: int | None = None,
        slot_prompt_similarity: float | None = None,
        chat_template: str | None = None,
        parallel: int = 1,
        slot_save_path: Path | None = None,
        projector: Path | None = None,
    ) -> None:
        self.model_path = Path(model_path)
        self.ctx_size = ctx_size
        self.threads = threads
        self.port = port or 0
        self.alias = alias or self.model_path.stem
        self.startup_timeout = startup_timeout
        self.verbosity = verbosity
        self.n_predict = n_predict
        self.cache_ram_mib = cache_ram_mib
        self.slot_prompt_similarity = slot_prompt_similarity
        self.chat_template = chat_template
        self.parallel = parallel
        self.slot_save_path = slot_save_path
        self.projector = Path(projector) if projector is not None else None
        self._server: Any = None
        self._address = ""

    def params(self) -> Any:
        """The `xllamacpp.CommonParams` this server starts with."""
        import xllamacpp

        params = xllamacpp.CommonParams()
        params.model.path = str(self.model_path)
        params.model_alias = {self.alias}
        params.n_ctx = self.ctx_size
        params.n_parallel = self.parallel  # slots; ``ctx_size`` is shared among them
        if self.slot_save_path is not None:
            params.slot_save_path = str(self.slot_save_path).rstrip("/") + "/"  # llama-server's flag adds the "/"
        params.kv_unified = False
        params.cpuparams.n_threads = self.threads
        params.cpuparams_batch.n_threads = self.threads
        params.hostnames = ["127.0.0.1"]
        params.port = self.port
        params.use_jinja = True
        params.cache_prompt = True
        params.warmup = False
        params.ui = False
        params.verbosity = self.verbosity
        params.n_predict = self.n_predict
        if self.cache_ram_mib is not None:
            params.cache_ram_mib = self.cache_ram_mib
        if self.slot_prompt_similarity is not None:
            params.slot_prompt_similarity = self.slot_prompt_similarity
        if self.chat_template is not None:
            params.chat_template = self.chat_template
        if self.projector is not None:
            params.mmproj.path = str(self.projector)
        return params

    @property
    def address(self) -> str:
        """`http://127.0.0.1:PORT`."""
        if not self._address:
            raise LlamaServerError("the llama server is not running")
        return self._address

    @property
    def base_url(self) -> str:
        return self.address + "/v1"

    def start(self) -> LlamaServer:
        """Load the model, start serving and wait until `/health` answers."""
        if self._server is not None:
            return self
        if not self.model_path.is_file():
            raise LlamaServerError(f"no model file at {self.model_path}")
        if self.projector is not None and not self.projector.is_file():
            raise LlamaServerError(f"no projector file at {self.projector}")
        import xllamacpp

        self._server = xllamacpp.Server(self.params())
        self._address = str(self._server.listening_address).rstrip("/")
        deadline = time.monotonic() + self.startup_timeout
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                response = httpx.get(self._address + "/health", timeout=2.0)
                if response.status_code == 200:
                    server_api.forget(self.base_url)  # a server that had this port before may have offered less
                    return self
                last = f"HTTP {response.status_code}: {response.text[:200]}"
            except httpx.HTTPError as error:
                last = str(error)
            time.sleep(0.05)
        self.stop()
        raise LlamaServerError(f"llama server for {self.model_path} not healthy in time ({last})")

    def stop(self) -> None:
        """Stop serving and free the model."""
        server, self._server = self._server, None
        self._address = ""
        del server
        gc.collect()

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
