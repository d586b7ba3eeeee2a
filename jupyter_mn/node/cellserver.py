"""The agent's end of the cell stream: the kernel's requests to run a cell, and their replies, on
one connection per node beside dask (docs/architecture.md, "The cell stream").

A dask actor call costs ~0.8 ms a round trip here (serialization, the client's loop thread, the
worker's handler); a cell's request and reply on a connection of their own cost ~0.1 ms. The
connection has dask's security: TLS with the gang's certificates when the worker uses TLS. Its
socket is read straight from the worker's event loop (``add_reader``), TLS on memory buffers
(``tlsbuffers.py``), as the agent reads its ranks' sockets: asyncio's TLS streams took each
agent ~0.08 ms more CPU a cell, in several more loop turns. Each request (``(payload, run_id)``)
runs as ``NodeAgent.run`` does for an actor call, concurrently with others; its reply is
``(run_id, packed NodeReply, None)`` or ``(run_id, None, error)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from .frames import Frames, Undecodable, encode
from .tlsbuffers import TlsBuffers

Run = Callable[[Any, int], Awaitable[bytes]]
#: A connection whose TLS handshake is not done by then is closed (a peer that is not a kernel).
HANDSHAKE_S = 10.0


class _Connection:
    """The kernel's connection, on the loop: read when readable; a reply is written at once, and
    what the socket does not take waits until it is writable."""

    def __init__(
        self, server: CellServer, sock: socket.socket, context: ssl.SSLContext | None
    ) -> None:
        self._server, self._sock = server, sock
        self._tls = TlsBuffers(context, server_side=True) if context is not None else None
        self._frames = Frames()
        self._unsent = bytearray()
        self.drained = asyncio.Event()
        self.drained.set()
        self.closed = False
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(sock.fileno(), self._readable)
        self._overdue = (
            self._loop.call_later(HANDSHAKE_S, self._handshake_overdue) if self._tls else None
        )

    def _readable(self) -> None:
        try:
            data = self._sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        plain: bytes | None = data
        if data and self._tls is not None:
            try:
                plain = self._tls.feed(data)  # None: the kernel closed TLS
            except ssl.SSLError:  # not TLS from a kernel with the gang's certificate
                plain = None
            self._send(self._tls.outgoing())
        if not plain:
            if plain is None or not data:  # the kernel went: its runs still end, unanswered
                self.close()
            return
        for request in self._frames.feed(plain):
            if not isinstance(request, Undecodable):  # only the kernel writes here
                self._server.answer(self, *request)

    def _handshake_overdue(self) -> None:
        if self._tls is not None and not self._tls.handshaken:
            self.close()

    def write(self, data: bytes) -> None:
        if not self.closed:
            self._send(data if self._tls is None else self._tls.wrap(data))

    def _send(self, data: bytes) -> None:
        if not data or self.closed:
            return
        if self._unsent:  # behind what waits: keep the order
            self._unsent += data
            return
        try:
            sent = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self.close()
            return
        if sent < len(data):
            self._unsent += data[sent:]
            self.drained.clear()
            self._loop.add_writer(self._sock.fileno(), self._writable)

    def _writable(self) -> None:
        try:
            sent = self._sock.send(self._unsent)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close()
            return
        del self._unsent[:sent]
        if not self._unsent:
            self._loop.remove_writer(self._sock.fileno())
            self.drained.set()

    def close(self) -> None:
        """Close now (with close_notify if it fits the socket); replies not sent are lost."""
        if self.closed:
            return
        if self._tls is not None and not self._unsent:
            with contextlib.suppress(OSError):
                self._sock.send(self._tls.close())
        self.closed = True
        if self._overdue is not None:
            self._overdue.cancel()
        self._loop.remove_reader(self._sock.fileno())
        self._loop.remove_writer(self._sock.fileno())
        self._sock.close()
        self.drained.set()
        self._server.forget(self)


class CellServer:
    """Listens on the worker's host; serves the kernel's connection."""

    def __init__(self, run: Run) -> None:
        self._run = run
        self._listener: socket.socket | None = None
        self._context: ssl.SSLContext | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._connections: set[_Connection] = set()
        self.port = 0

    async def start(self, host: str, context: ssl.SSLContext | None) -> None:
        """Listen (on ``self.port``)."""
        self._context = context
        family = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0][0]
        self._listener = socket.create_server((host, 0), family=family)
        self._listener.setblocking(False)
        self.port = int(self._listener.getsockname()[1])
        asyncio.get_running_loop().add_reader(self._listener.fileno(), self._accept)

    def _accept(self) -> None:
        assert self._listener is not None
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._connections.add(_Connection(self, sock, self._context))

    def forget(self, connection: _Connection) -> None:
        self._connections.discard(connection)

    def answer(self, connection: _Connection, payload: Any, run_id: int) -> None:
        task = asyncio.ensure_future(self._answer(connection, payload, run_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, connection: _Connection, payload: Any, run_id: int) -> None:
        try:
            reply: tuple[int, bytes | None, str | None] = (
                run_id,
                await self._run(payload, run_id),
                None,
            )
        except Exception as exc:
            reply = (run_id, None, f"{type(exc).__name__}: {exc}")
        connection.write(encode(reply))

    async def close(self, grace: float = 0.0) -> None:
        """Stop listening; give the runs in progress ``grace`` seconds to answer (the agent has
        stopped their ranks) and their replies to go out, then drop the kernel's connection (a
        request still waiting gets ``StreamLost`` there)."""
        if self._listener is not None:
            asyncio.get_running_loop().remove_reader(self._listener.fileno())
            self._listener.close()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=grace)
        for connection in list(self._connections):
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(connection.drained.wait(), grace)
            connection.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
