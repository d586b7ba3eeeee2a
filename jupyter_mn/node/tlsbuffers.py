"""TLS on memory buffers (``ssl.SSLObject``), for the two ends of the cell stream.

Neither end hands its socket to ``ssl``: the kernel's end shares one connection between the
thread that sends a cell and the thread that reads replies (an ``SSLSocket`` must not be used
by two threads at once), and the agent's end is a plain protocol on the event loop
(asyncio's TLS streams cost the agent a few loop turns and ~0.08 ms of CPU a cell). Both feed what
arrives in here, and send what comes out.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Iterable
from typing import Any, overload

from ..wire.frames import Frames

#: How much plaintext goes into the memory BIO before its records are taken out: one
#: ``SSLObject.write`` of a whole 256 MiB value grows the BIO by reallocation (12× the time of
#: this, measured), while a few records at a time stay in the CPU's cache.
SLICE = 1 << 18


class TlsBuffers:
    """One side of a TLS connection: bytes from the peer in, application data and the records
    to send out. The handshake advances as the peer's records are fed."""

    def __init__(self, context: ssl.SSLContext, server_side: bool) -> None:
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._in, self._out, server_side=server_side)
        self.handshaken = False

    def feed(self, data: bytes | memoryview) -> bytes | None:
        """``data`` from the peer; returns the application data it completes (``b""`` mid-record
        or mid-handshake), or None once the peer has closed TLS (what came before its
        close_notify in the same ``data`` is returned first). Raises ``ssl.SSLError`` for what
        is not TLS from a peer this context trusts."""
        chunks = []
        while (chunk := self._read(data, None)) is not None and chunk:
            chunks.append(chunk)
            data = b""
        return b"".join(chunks) if chunks or chunk is not None else None

    def feed_into(self, data: bytes | memoryview, frames: Frames) -> list[Any] | None:
        """As ``feed``, decrypting straight into ``frames``' buffer (a big value's body): the
        messages ``data`` completes, or None once the peer has closed TLS."""
        messages: list[Any] = []
        while (n := self._read(data, frames.into())) is not None and n:
            messages += frames.filled(n)
            data = b""
        return messages if messages or n is not None else None

    @overload
    def _read(self, data: bytes | memoryview, into: None) -> bytes | None: ...
    @overload
    def _read(self, data: bytes | memoryview, into: memoryview) -> int | None: ...

    def _read(self, data: bytes | memoryview, into: memoryview | None) -> bytes | int | None:
        """Take ``data`` in, then one read of application data (into ``into``, if given): empty
        (b"" or 0) when no more is due yet, None once the peer has closed TLS."""
        if data:
            self._in.write(data)
        if not self.handshaken:
            try:
                self._tls.do_handshake()
            except ssl.SSLWantReadError:
                return b"" if into is None else 0
            self.handshaken = True
        try:
            got = self._tls.read(SLICE) if into is None else self._tls.read(len(into), into)
        except ssl.SSLWantReadError:
            return b"" if into is None else 0
        except ssl.SSLZeroReturnError:
            return None
        return got or None

    def wrap(self, parts: Iterable[bytes]) -> list[bytes]:
        """``parts``, one after the other, as records for the peer (with anything else due to
        it), in slices of at most ``SLICE`` bytes each."""
        records = []
        for part in parts:
            view = memoryview(part)
            for start in range(0, len(view), SLICE):
                self._tls.write(view[start : start + SLICE])
                records.append(self._out.read())
        if due := self._out.read():
            records.append(due)
        return records

    def outgoing(self) -> bytes:
        """The records due to the peer now (the handshake's, a key update's, close_notify)."""
        return self._out.read()

    def close(self) -> bytes:
        """Our close_notify, to send before closing the socket."""
        if not self.handshaken:
            return b""
        with contextlib.suppress(ssl.SSLError):  # it waits for the peer's close_notify: we do not
            self._tls.unwrap()
        return self.outgoing()
