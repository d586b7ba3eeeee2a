"""Messages to a rank on its control socket, in the order they were made.

A small one, with no large one still being sent, goes before ``send`` returns: a socket buffer
takes it at once, so a cell's request reaches every rank before the loop turns (a thread hop
would cost ~2 ms a cell). A large one goes from a thread, and those after it wait their turn.
A cell's shared names (``wire/sharednames.py``) go as descriptors after their message; the
rank reads them after it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from multiprocessing.connection import Connection

from ..wire.sharednames import send_files

#: Messages up to this size are written from the event loop (the socket buffer holds them).
INLINE_SEND = 64 * 1024


class OrderedSend:
    """Sends ``pack``ed messages on one control socket, in order."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = asyncio.Lock()
        self._sending: set[asyncio.Task[bool]] = set()  # sends waiting for the lock, or a thread

    def send(self, data: bytes, files: Sequence[int] = ()) -> asyncio.Future[bool]:
        """Send ``data``, then ``files``; the future says whether it went."""
        if len(data) <= INLINE_SEND and not self._sending:
            sent = asyncio.get_running_loop().create_future()
            sent.set_result(self._write(data, files))
            return sent
        task = asyncio.ensure_future(self._send_in_order(data, files))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)
        return task

    def _write(self, data: bytes, files: Sequence[int]) -> bool:
        try:
            self._conn.send_bytes(data)
            if files:
                send_files(self._conn.fileno(), files)
        except (OSError, ValueError):
            return False
        return True

    async def _send_in_order(self, data: bytes, files: Sequence[int]) -> bool:
        async with self._lock:
            if len(data) <= INLINE_SEND:
                return self._write(data, files)
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(None, self._write, data, files)
