"""A TCP proxy in front of a server (the machine's Redis, or a Postgres on TCP or its unix socket) that a test can
cut and mend: cut, every connection through it is closed and new ones are refused, as when the server is down;
mended, it forwards again on the same port. Only this test process's connections go through it."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator


class Proxy:
    """Forwards ``127.0.0.1:port`` to ``target`` (host and port, or a unix socket's path); :meth:`cut` and
    :meth:`mend` take the server away and back."""

    def __init__(self, target: tuple[str, int] | str) -> None:
        self.target = target
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.port = 0
        self.connections = 0  # accepted so far
        self.mend()

    def mend(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            open_sockets, self._sockets = self._sockets, set()
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for sock in open_sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.cut()

    def open_connections(self) -> int:
        """Connections through the proxy that neither side has closed."""
        with self._lock:
            return len(self._sockets) // 2

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = self._connect()
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    server.close()
                    return
                self._sockets.update((client, server))
                self.connections += 1
            threading.Thread(target=self._pipe, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client), daemon=True).start()

    def _connect(self) -> socket.socket:
        if isinstance(self.target, str):
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.connect(self.target)
            return server
        return socket.create_connection(self.target, timeout=5)

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        with self._lock:
            self._sockets.difference_update((source, sink))


@contextlib.contextmanager
def proxy(target: tuple[str, int] | str) -> Iterator[Proxy]:
    """A :class:`Proxy` for the test, closed after it."""
    made = Proxy(target)
    try:
        yield made
    finally:
        made.close()
