"""Speaking the websocket protocol by hand, as a proxy or a hostile page would."""

from __future__ import annotations

import os

HELLO = b'{"type": "hello", "rev": 0, "first": 0, "bar": 0}'


def client_frame(payload: bytes) -> bytes:
    """One masked text frame, as a client sends it."""
    mask = os.urandom(4)
    masked = bytes(byte ^ mask[index % 4] for index, byte in enumerate(payload))
    length = len(payload)
    header = bytes([0x81, 0x80 | length]) if length < 126 else bytes([0x81, 0x80 | 126]) + length.to_bytes(2, "big")
    return header + mask + masked
