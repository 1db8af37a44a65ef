from __future__ import annotations

import contextlib
import socket
import threading

from tests.listeners import stop_listening


def test_a_thread_blocked_in_accept_is_gone_before_its_descriptor_is_closed() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                accepted.append(server.accept()[0])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    stop_listening(server, thread)
    assert not thread.is_alive() and server.fileno() == -1 and accepted == []
