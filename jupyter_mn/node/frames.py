"""The messages a rank sends on its control socket, decoded as bytes arrive.

A rank writes with ``multiprocessing.connection.Connection.send``: a big-endian signed 32-bit
length (or -1, then an unsigned 64-bit length, for payloads over 2 GiB) and the pickle. The
agent reads the socket on its event loop whenever it is readable (a reader thread per rank cost
a cross-thread wake-up per reply), so a message may arrive in pieces. A message the agent cannot
unpickle (rank 0 displayed data holding a class of its own ``__main__``) is dropped as an
``Undecodable`` and the messages after it are still read: left at the head of the buffer it
would have hidden the cell's reply for good.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import struct
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

_SHORT, _LONG = struct.Struct("!i"), struct.Struct("!Q")


@dataclass(frozen=True)
class Undecodable:
    """A complete message that did not unpickle, in place of it."""

    error: str


class Frames:
    """Incremental decoder: ``feed`` bytes, get the complete messages so far."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        self._buffer += data
        messages: list[Any] = []
        while True:
            found = self._next()
            if found is None:
                return messages
            messages.append(found)

    def _next(self) -> Any:
        buffer = self._buffer
        if len(buffer) < _SHORT.size:
            return None
        (size,) = _SHORT.unpack_from(buffer)
        start = _SHORT.size
        if size == -1:
            if len(buffer) < start + _LONG.size:
                return None
            (size,) = _LONG.unpack_from(buffer, start)
            start += _LONG.size
        if len(buffer) < start + size:
            return None
        try:
            message = pickle.loads(memoryview(buffer)[start : start + size])
        except Exception as exc:  # what unpickling runs may raise anything
            message = Undecodable(f"{type(exc).__name__}: {exc}")
        del buffer[: start + size]
        return message


def encode(message: Any) -> tuple[bytes, bytes]:
    """``message`` in the same format (what ``Frames`` decodes), for a stream of our own: its
    header and its pickle, sent one after the other (joining them would copy a big value)."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) < 2**31:
        return _SHORT.pack(len(data)), data
    return _SHORT.pack(-1) + _LONG.pack(len(data)), data


def read_ready(loop: asyncio.AbstractEventLoop, conn: Connection) -> bytes:
    """What ``conn`` has, when ``loop`` found it readable (one read does not block); at EOF
    b"", and ``loop`` stops watching it."""
    try:
        data = os.read(conn.fileno(), 65536)
    except OSError:
        data = b""
    if not data:
        loop.remove_reader(conn.fileno())
    return data
