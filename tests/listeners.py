"""Plain TCP listeners served by a thread in a test, and stopping them without harm to later tests."""

from __future__ import annotations

import contextlib
import socket
import threading


def stop_listening(server: socket.socket, thread: threading.Thread) -> None:
    """Wake ``thread`` from ``accept`` and wait for it, then close ``server``.

    Closing the socket alone leaves the thread blocked in ``accept`` on a descriptor number that the next
    socket opened reuses (a later test's model server); once a signal restarts that ``accept``, the thread
    takes the new server's next connection and the request on it fails."""
    with contextlib.suppress(OSError):
        server.shutdown(socket.SHUT_RDWR)  # a blocked accept returns (EINVAL)
    thread.join(5)
    assert not thread.is_alive(), "the listener's thread did not stop"
    server.close()
