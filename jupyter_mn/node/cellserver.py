"""The agent's end of the cell stream: the kernel's requests to run a cell, and their replies, on
one connection per node beside dask (docs/architecture.md, "The cell stream").

A dask actor call costs ~0.8 ms a round trip here (serialization, the client's loop thread, the
worker's handler); a cell's request and reply on a connection of their own cost ~0.1 ms. The
connection has dask's security: TLS with the gang's certificates when the worker uses TLS. It is a
plain asyncio protocol (its ``data_received`` called straight from the worker's loop), with TLS
on memory buffers (``tlsbuffers.py``): asyncio's TLS streams took each agent ~0.08 ms more CPU a
cell, in several more loop turns. Each request (``(payload, run_id)``) starts its run
(``NodeAgent.start_run``, what an actor call to ``NodeAgent.run`` awaits) from the read that
brought it, concurrently with others; its reply is ``(run_id, NodeReply, None)`` or
``(run_id, None, error)``, written when the run's future is done.

The connection also says whether the kernel's host is there while its Python is busy
(``kernelbeat.py``): TCP keepalive probes it each second it is idle, and the kernel's OS
acknowledges them whatever its Python does; ``TCP_INFO`` says when the last acknowledgement came.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import ssl
import struct
from collections.abc import Callable, Sequence
from typing import Any

from ..wire.frames import Frames, Undecodable, encode
from .tlsbuffers import TlsBuffers

#: Starts a run now (its requests on their way to the ranks) and returns its reply's future.
Run = Callable[[Any, int], "asyncio.Future[Any]"]
#: A connection whose TLS handshake is not done by then is closed (a peer that is not a kernel).
HANDSHAKE_S = 10.0
#: Keepalive: probe after a second idle, then each second (Linux names; elsewhere the OS default).
_KEEPALIVE = (("TCP_KEEPIDLE", 1), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 30))
#: ``struct tcp_info``: eight one-byte fields, then ``__u32``s; ``tcpi_last_ack_recv`` (ms) is
#: the thirteenth.
_LAST_ACK_RECV = struct.Struct("=56xI")


class _Connection(asyncio.Protocol):
    """The kernel's connection: asyncio's TCP transport (its write buffering, its close after
    what is written), TLS here."""

    def __init__(self, server: CellServer, context: ssl.SSLContext | None) -> None:
        self._server, self._context = server, context
        self._tls: TlsBuffers | None = None
        self._frames = Frames()
        self._overdue: asyncio.TimerHandle | None = None
        self.transport: asyncio.Transport
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._server.connections.add(self)
        _keep_alive(transport.get_extra_info("socket"))
        if self._context is not None:
            self._tls = TlsBuffers(self._context, server_side=True)
            loop = asyncio.get_running_loop()
            self._overdue = loop.call_later(HANDSHAKE_S, self._handshake_overdue)

    def data_received(self, data: bytes) -> None:
        plain: bytes | None = data
        if self._tls is not None:
            try:
                plain = self._tls.feed(data)  # None: the kernel closed TLS
            except ssl.SSLError:  # not TLS from a kernel with the gang's certificate
                plain = None
            self._send(self._tls.outgoing())
        if plain is None:
            self.transport.close()
            return
        for request in self._frames.feed(plain):
            if not isinstance(request, Undecodable):  # only the kernel writes here
                self._server.answer(self, *request)

    def connection_lost(self, exc: Exception | None) -> None:
        # the kernel went: its runs still end, their replies go nowhere
        if self._overdue is not None:
            self._overdue.cancel()
        self._server.connections.discard(self)
        if not self.closed.done():
            self.closed.set_result(None)

    def _handshake_overdue(self) -> None:
        if self._tls is not None and not self._tls.handshaken:
            self.transport.abort()

    def write(self, parts: Sequence[bytes]) -> None:
        for data in parts if self._tls is None else self._tls.wrap(parts):
            self._send(data)

    def _send(self, data: bytes) -> None:
        if data and not self.transport.is_closing():
            self.transport.write(data)

    def last_ack_s(self) -> float | None:
        """Seconds since the kernel's host last acknowledged anything (None: unknown)."""
        sock = self.transport.get_extra_info("socket")
        if sock is None or not hasattr(socket, "TCP_INFO"):
            return None
        try:
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _LAST_ACK_RECV.size)
        except OSError:  # closed meanwhile
            return None
        return _LAST_ACK_RECV.unpack(info)[0] / 1000

    def close(self) -> None:
        """Close after what is written, our close_notify last."""
        if self._tls is not None:
            self._send(self._tls.close())
        self.transport.close()


class CellServer:
    """Listens on the worker's host; serves the kernel's connection."""

    def __init__(self, run: Run) -> None:
        self._run = run
        self._server: asyncio.Server | None = None
        self._runs: set[asyncio.Future[Any]] = set()
        self.connections: set[_Connection] = set()
        self.port = 0

    async def start(self, host: str, context: ssl.SSLContext | None) -> None:
        """Listen (on ``self.port``)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self, context), host, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    def acknowledged_within(self, seconds: float) -> bool:
        """Whether the kernel's host acknowledged one of its connections within ``seconds``."""
        ages = (c.last_ack_s() for c in self.connections if not c.transport.is_closing())
        return any(age is not None and age <= seconds for age in ages)

    def answer(self, connection: _Connection, payload: Any, run_id: int) -> None:
        """Start the run from the read that brought its request; reply when it is done."""
        try:
            run = self._run(payload, run_id)
        except Exception as exc:
            connection.write(encode((run_id, None, _said(exc))))
            return
        self._runs.add(run)
        run.add_done_callback(functools.partial(self._reply, connection, run_id))

    def _reply(self, connection: _Connection, run_id: int, run: asyncio.Future[Any]) -> None:
        self._runs.discard(run)
        if run.cancelled():  # closed: the connection goes too
            return
        failed = run.exception()
        reply = (run_id, None, _said(failed)) if failed else (run_id, run.result(), None)
        connection.write(encode(reply))

    async def close(self, grace: float = 0.0) -> None:
        """Stop listening; give the runs in progress ``grace`` seconds to answer (the agent has
        stopped their ranks) and their replies to go out, then drop the kernel's connection (a
        request still waiting gets ``StreamLost`` there)."""
        if self._server is not None:
            self._server.close()
        if self._runs:
            await asyncio.wait(list(self._runs), timeout=grace)
        for connection in list(self.connections):
            connection.close()
            try:
                await asyncio.wait_for(asyncio.shield(connection.closed), grace)
            except asyncio.TimeoutError:
                connection.transport.abort()
        for run in list(self._runs):
            run.cancel()


def _keep_alive(sock: socket.socket | None) -> None:
    if sock is None:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in _KEEPALIVE:
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def _said(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
