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

An AF_UNIX connection also says whether the kernel is there while its Python is busy
(``kernelbeat.py``): its process (``SO_PEERCRED``'s pid) runs, or is stopped or gone.

A kernel on the same host connects to an AF_UNIX socket in a directory only this user may enter
(``wire/cellendpoint.py``), without TLS. A reply goes out in slices as the transport takes them
(``pause_writing``/``resume_writing``), each encrypted just before it is written: a 256 MiB value
is neither encrypted whole nor copied whole into the transport's buffer first.

A run may send a rank's big reply ahead of its node's, as the rank sends it (``relay``:
``valuerelay.py``); the connection holds back its other replies until that message is whole,
so messages never interleave on the stream. To a kernel on this host a rank's big values come
as files instead, which go on with the node's reply (``write_files``: ``wire/valuefiles.py``).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import os
import shutil
import socket
import ssl
import struct
from collections.abc import Callable, Sequence
from typing import Any

from ..wire import sharednames, valuefiles
from ..wire.cellendpoint import CellEndpoint
from ..wire.events import NodeReply
from ..wire.frames import SOCKET_BUFFER, Frames, Undecodable, encode
from ..wire.payload import CellPayload
from . import socketdirs
from .tlsbuffers import SLICE, TlsBuffers
from .valuerelay import CHUNK, RelaySink

#: Starts a run now (its requests on their way to the ranks) and returns its reply's future;
#: its ranks' big replies may go ahead through the connection given.
Run = Callable[[Any, int, RelaySink], "asyncio.Future[Any]"]
#: A connection whose TLS handshake is not done by then is closed (a peer that is not a kernel).
HANDSHAKE_S = 10.0
#: ``struct ucred``: the peer's pid, uid, gid (``SO_PEERCRED``).
_PEERCRED = struct.Struct("3i")
#: The transport's buffer may hold this much of a reply before it asks for no more.
_HIGH_WATER = 4 * SLICE
#: The longest AF_UNIX socket path (``sun_path``, less its terminating NUL).
_MAX_PATH = 107


class _Connection(asyncio.Protocol):
    """The kernel's connection: asyncio's transport, TCP or AF_UNIX from this host (its write
    buffering, its close after what is written), TLS here on TCP."""

    def __init__(self, server: CellServer, context: ssl.SSLContext | None) -> None:
        self._server, self._context = server, context
        self._tls: TlsBuffers | None = None
        self._frames = Frames()
        self._overdue: asyncio.TimerHandle | None = None
        #: what is still to be written (and its bytes), and whether the transport has asked us
        #: to wait
        self._pending: collections.deque[memoryview] = collections.deque()
        self._queued = 0
        self._paused = False
        #: a relayed message is under way: other messages wait in ``_held``; ``_drained`` is
        #: the relay's, called when the queue drains
        self._relaying = False
        self._held: list[bytes | memoryview] = []
        self._drained: Callable[[], None] | None = None
        self._closing = False
        self.transport: asyncio.Transport
        #: the kernel's process, on an AF_UNIX connection (from this host)
        self.kernel_pid: int | None = None
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=_HIGH_WATER, low=SLICE)
        sock = transport.get_extra_info("socket")
        if sock.family == socket.AF_UNIX:  # TCP tunes its own
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
            self.kernel_pid = _PEERCRED.unpack(
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
            )[0]
        self._server.connections.add(self)
        if self._context is not None:
            self._tls = TlsBuffers(self._context, server_side=True)
            loop = asyncio.get_running_loop()
            self._overdue = loop.call_later(HANDSHAKE_S, self._handshake_overdue)

    def data_received(self, data: bytes) -> None:
        requests: list[Any] | None
        if self._tls is None:
            requests = self._frames.feed(data)
        else:
            try:
                requests = self._tls.feed_into(data, self._frames)  # None: the kernel closed TLS
            except ssl.SSLError:  # not TLS from a kernel with the gang's certificate
                requests = None
            self._send(self._tls.outgoing())
        if requests is None:
            self.transport.close()
            return
        for request in requests:
            if not isinstance(request, Undecodable):  # only the kernel writes here
                self._server.answer(self, *request)

    def connection_lost(self, exc: Exception | None) -> None:
        # the kernel went: its runs still end, their replies go nowhere
        self._pending.clear()
        self._queued = 0
        self._held.clear()
        self._call_drained()
        if self._overdue is not None:
            self._overdue.cancel()
        self._server.connections.discard(self)
        if not self.closed.done():
            self.closed.set_result(None)

    def _handshake_overdue(self) -> None:
        if self._tls is not None and not self._tls.handshaken:
            self.transport.abort()

    def write(self, parts: Sequence[bytes | memoryview]) -> None:
        if self._relaying:
            self._held.extend(parts)
            return
        self._queue(parts)

    def _queue(self, parts: Sequence[bytes | memoryview]) -> None:
        if self.transport.is_closing():  # the kernel has gone
            return
        views = [memoryview(p).cast("B") for p in parts if len(p)]
        self._pending.extend(views)
        self._queued += sum(v.nbytes for v in views)
        self._pump()

    # ---- a reply with files: a kernel on this host (``wire/valuefiles.py``)
    @property
    def takes_files(self) -> bool:
        return self.kernel_pid is not None

    def write_files(self, parts: Sequence[bytes | memoryview], files: Sequence[int]) -> bool:
        """Write a message with ``files`` (they go with its first bytes), if it can go now in
        order: nothing else waits to be written. False: nothing went."""
        transport = self.transport
        if self._relaying or self._pending or transport.is_closing():
            return False
        if not self.takes_files or transport.get_write_buffer_size():
            return False
        try:
            sock = transport.get_extra_info("socket").fileno()
            sent = sharednames.send_files(sock, files, parts[0])
        except OSError:  # the socket is full (or the kernel has gone): the bytes go instead
            return False
        self._queue([memoryview(parts[0])[sent:], *parts[1:]])
        return True

    # ---- a relayed message (``valuerelay.RelaySink``)
    def relay(self, head: bytes) -> bool:
        if self._relaying or self._closing or self.transport.is_closing():
            return False
        self._queue([head])
        self._relaying = True
        return True

    def relayed(self, data: bytes | memoryview) -> None:
        self._queue([data])

    def relay_done(self) -> None:
        self._relaying = False
        held, self._held = self._held, []
        self._queue(held)

    def backlogged(self) -> bool:
        return self._queued > CHUNK and not self.transport.is_closing()

    def when_drained(self, then: Callable[[], None]) -> None:
        self._drained = then
        if not self.backlogged():
            self._call_drained()

    def _call_drained(self) -> None:
        then, self._drained = self._drained, None
        if then is not None:
            then()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._pump()

    def _pump(self) -> None:
        """Hand the transport what is pending, a slice at a time, until it asks us to wait;
        close once all is written if ``close`` was called meanwhile."""
        while self._pending and not self._paused and not self.transport.is_closing():
            piece = self._pending[0][:SLICE]
            self._pending[0] = self._pending[0][SLICE:]
            if not self._pending[0]:
                self._pending.popleft()
            self._queued -= piece.nbytes
            for data in [piece] if self._tls is None else self._tls.wrap([piece]):
                self._send(data)
        if self._drained is not None and not self.backlogged():
            self._call_drained()
        if self._closing and not self._pending:
            if self._tls is not None:
                self._send(self._tls.close())
            self.transport.close()

    def _send(self, data: bytes | memoryview) -> None:
        if data and not self.transport.is_closing():
            self.transport.write(data)

    def kernel_runs(self) -> bool:
        """Whether the kernel's process is there and not stopped (known on this host alone)."""
        return self.kernel_pid is not None and _runs(self.kernel_pid)

    def close(self) -> None:
        """Close after what is written, our close_notify last."""
        self._closing = True
        self._pump()


class CellServer:
    """Listens on the worker's host; serves the kernel's connection."""

    def __init__(self, run: Run) -> None:
        self._run = run
        self._servers: list[asyncio.Server] = []
        #: the directory of the AF_UNIX socket (None where there is none)
        self._private: str | None = None
        self._runs: set[asyncio.Future[Any]] = set()
        self.connections: set[_Connection] = set()
        self.endpoint = CellEndpoint(0)

    async def start(self, host: str, context: ssl.SSLContext | None) -> None:
        """Listen (at ``self.endpoint``): on ``host`` with ``context``'s TLS, and on an AF_UNIX
        socket in a new directory of mode 0700 (``socketdirs.py``)."""
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Connection(self, context), host, 0)
        self._servers.append(server)
        port = int(server.sockets[0].getsockname()[1])
        self._private = socketdirs.made()
        path = os.path.join(self._private, socketdirs.SOCKET)
        if len(os.fsencode(path)) > _MAX_PATH:  # a TMPDIR this deep: TCP alone
            self.endpoint = CellEndpoint(port)
            return
        local = await loop.create_unix_server(lambda: _Connection(self, None), path)
        self._servers.append(local)
        self.endpoint = CellEndpoint(port, path)

    def kernel_runs(self) -> bool:
        """Whether a kernel connected from this host runs (its Python may be busy)."""
        return any(c.kernel_runs() for c in self.connections if not c.transport.is_closing())

    def answer(self, connection: _Connection, payload: Any, run_id: int) -> None:
        """Start the run from the read that brought its request; reply when it is done. A
        kernel on this host sends a cell's large names as files of its own, opened here."""
        opened: CellPayload | None = None  # with descriptors of ours (``opened`` cleans up)
        try:
            if isinstance(payload, CellPayload):
                payload = opened = sharednames.opened(payload, connection.kernel_pid)
            run = self._run(payload, run_id, connection)
        except Exception as exc:
            for captured in opened.names if opened is not None else ():
                sharednames.close(captured)
            connection.write(encode((run_id, None, _said(exc))))
            return
        self._runs.add(run)
        run.add_done_callback(functools.partial(self._reply, connection, run_id))

    def _reply(self, connection: _Connection, run_id: int, run: asyncio.Future[Any]) -> None:
        self._runs.discard(run)
        if run.cancelled():  # closed: the connection goes too
            return
        failed = run.exception()
        if failed:
            connection.write(encode((run_id, None, _said(failed))))
            return
        node = run.result()
        if isinstance(node, NodeReply) and (files := valuefiles.files_of(node)):
            fits = len(files) <= valuefiles.MAX_FILES  # what the kernel's read makes room for
            if fits and connection.write_files(encode((run_id, node, None)), files):
                valuefiles.close(node)  # the kernel has its own now
                return
            node = valuefiles.inline(node)
        connection.write(encode((run_id, node, None)))

    async def close(self, grace: float = 0.0) -> None:
        """Stop listening; give the runs in progress ``grace`` seconds to answer (the agent has
        stopped their ranks) and their replies to go out, then drop the kernel's connection (a
        request still waiting gets ``StreamLost`` there)."""
        for server in self._servers:
            server.close()
        if self._private is not None:
            shutil.rmtree(self._private, ignore_errors=True)
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


def _runs(pid: int) -> bool:
    """Whether process ``pid`` is there and not stopped (``/proc/PID/stat``'s state)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rpartition(b")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"T", b"t", b"Z", b"X")


def _said(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
