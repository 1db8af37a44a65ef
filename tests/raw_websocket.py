"""Speaking the websocket protocol by hand, as a proxy or a hostile page would."""

from __future__ import annotations

import os
from typing import BinaryIO

HELLO = b'{"type": "hello", "rev": 0, "first": 0, "bar": 0}'


def client_frame(payload: bytes) -> bytes:
    """One masked text frame, as a client sends it."""
    mask = os.urandom(4)
    key = (mask * (len(payload) // 4 + 1))[: len(payload)]
    masked = (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(len(payload), "big")
    length = len(payload)
    if length < 126:
        header = bytes([0x81, 0x80 | length])
    elif length < 65536:
        header = bytes([0x81, 0x80 | 126]) + length.to_bytes(2, "big")
    else:
        header = bytes([0x81, 0x80 | 127]) + length.to_bytes(8, "big")
    return header + mask + masked


def server_frame(stream: BinaryIO) -> tuple[int, bytes]:
    """The opcode and payload of the next frame the server sends (unmasked)."""

    def exactly(size: int) -> bytes:
        data = stream.read(size)
        if len(data) != size:
            raise ConnectionError("the server closed the connection mid-frame")
        return data

    head = exactly(2)
    length = head[1] & 0x7F
    if length == 126:
        length = int.from_bytes(exactly(2), "big")
    elif length == 127:
        length = int.from_bytes(exactly(8), "big")
    return head[0] & 0x0F, exactly(length)
