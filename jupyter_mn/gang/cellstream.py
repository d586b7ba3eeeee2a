"""The kernel's end of the cell stream (docs/architecture.md, "The cell stream"): a cell's
request goes to each node agent straight from the thread that runs the cell, and each node's
reply is read by the thread waiting on the inbox (``Inbox.watch``), with no dask client loop
and no reader thread on the way.

An agent on this host is reached on its AF_UNIX socket (``wire/cellendpoint.py``), without
TLS: its directory admits this user alone. Across hosts TLS is done on memory buffers
(``node/tlsbuffers.py``) under a lock, so a sending thread and the reading one can share one
connection (an ``SSLSocket`` must not be used by two threads at once). Either way a reply is
read (or decrypted) straight into its message's buffer (``Frames.into``): a big value is copied
once on its way in. A request goes the same way whatever its size: a cell's captured names are
sent once per node, their arrays out of band (``wire/frames.py``), written in slices of ``SLICE``
bytes (each encrypted just before it is written); a send gives up when one slice does not go
within ``SEND_S``: a send on a cut link must not hold the cell's thread. A rank's big reply
may come ahead of its node's (``wire/valueahead.py``), while the rank still sends it; it waits
here, per node, for the node's reply.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import struct
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..node.tlsbuffers import TlsBuffers
from ..wire import valuefiles
from ..wire.cellendpoint import CellEndpoint
from ..wire.events import NodeReply, RankReply
from ..wire.frames import Frames, encode
from ..wire.payload import CellPayload
from ..wire.sharednames import SharedNames
from ..wire.valueahead import ReplyAhead
from .inbox import Inbox, Reply

#: How long connecting, the TLS handshake or the send of one slice may take.
SEND_S = 5.0
#: A request's big parts are written this much at a time: each write has ``SEND_S``.
SLICE = 1 << 22
#: At most this many agents are connected to at once.
_CONNECTS = 32


#: The most one read of TLS records takes: a big value arrives in fewer turns of the inbox.
READ = 1 << 20


class StreamLost(ConnectionError):
    """The connection to a node agent closed or failed while a cell waited for its reply."""


class CellRequest:
    """A cell's request, encoded once for each way it goes: whole (its names' arrays in the
    request itself), or for an agent on this host with its large names in memfds that the agent
    opens through ``/proc`` (``wire/sharednames.py``): one copy for all of the host's nodes and
    ranks, kept until the next request (by then each agent holds its own descriptors)."""

    def __init__(self, payload: Any, run_id: int) -> None:
        self.payload, self.run_id = payload, run_id
        self._whole: list[bytes | memoryview] | None = None
        self._local: list[bytes | memoryview] | None = None
        self.files: SharedNames | None = None

    def parts(self, local: bool) -> list[bytes | memoryview]:
        """The request as ``encode``d for an agent on this host (``local``) or any other."""
        if not local or not isinstance(self.payload, CellPayload):
            if self._whole is None:
                self._whole = encode((self.payload, self.run_id))
            return self._whole
        if self._local is None:
            self.files = SharedNames(self.payload)
            self._local = encode((self.files.payload, self.run_id))
        return self._local

    def close(self) -> None:
        if self.files is not None:
            self.files.close()


class _Channel:
    """One connection, TLS (as the worker's comms) or plain: sent to and read from any thread."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext | None) -> None:
        self.sock = sock
        #: an agent on this host, of this user, that sees this process (it opens a cell's
        #: shared names through ``/proc``)
        self.local = context is None and sock.family == socket.AF_UNIX and _same_user_here(sock)
        self._lock = threading.Lock()  # the TLS state: a reply may be read while we send
        self._sending = threading.Lock()  # one request at a time
        self._tls: TlsBuffers | None = None
        self._records = bytearray(READ) if context is not None else bytearray()
        #: an agent on this host sends a big value as a file (``wire/valuefiles.py``)
        self.files = valuefiles.Inbound(sock) if sock.family == socket.AF_UNIX else None
        if context is not None:
            self._tls = TlsBuffers(context, server_side=False)
            self._handshake(self._tls)

    def _handshake(self, tls: TlsBuffers) -> None:
        tls.feed(b"")  # our hello
        while not tls.handshaken:
            self.sock.sendall(tls.outgoing())
            data = self.sock.recv(1 << 16)
            if not data or tls.feed(data) is None:
                raise ConnectionError("closed during the TLS handshake") from None
        self.sock.sendall(tls.outgoing())

    def send(self, parts: Sequence[bytes | memoryview]) -> None:
        with self._sending:
            for part in parts:
                view = memoryview(part).cast("B")
                for start in range(0, view.nbytes, SLICE):
                    self._send_slice(view[start : start + SLICE])

    def _send_slice(self, data: memoryview) -> None:
        if self._tls is None:
            self.sock.sendall(data)
            return
        with self._lock:
            for record in self._tls.wrap([data]):
                self.sock.sendall(record)

    def recv(self, frames: Frames) -> list[Any] | None:
        """The messages what arrived completes (maybe none yet); None once the connection is
        over. Called when the socket is readable."""
        into = frames.into() if self._tls is None else memoryview(self._records)
        try:
            n = self.files.recv_into(into) if self.files is not None else self.sock.recv_into(into)
        except TimeoutError:  # readable, and yet nothing came within SEND_S
            return []
        if not n:
            return None
        if self._tls is None:
            return frames.filled(n)
        with self._lock:
            messages = self._tls.feed_into(into[:n], frames)  # None: the agent's close_notify
            if due := self._tls.outgoing():
                self.sock.sendall(due)
        return messages

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        if self.files is not None:
            self.files.close()


def _same_user_here(sock: socket.socket) -> bool:
    """Whether the peer runs as this user, in a pid namespace this process sees (its pid is 0
    where it does not)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", creds)
    return pid > 0 and uid == os.getuid()


def _connect(host: str, at: CellEndpoint, context: ssl.SSLContext | None) -> _Channel | None:
    """A connection to an agent: on its AF_UNIX socket where this host has it, else over TCP
    with the TLS handshake done; None when it cannot be had."""
    if at.local() and os.path.exists(at.path):
        local = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        local.settimeout(SEND_S)
        try:
            local.connect(at.path)
            return _Channel(local, None)
        except OSError:  # another host's path after all, or the agent has gone
            local.close()
    try:
        sock = socket.create_connection((host, at.port), timeout=SEND_S)
    except OSError:
        return None
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _Channel(sock, context)
    except (OSError, ssl.SSLError):
        sock.close()  # a refused handshake
        return None


class CellStream:
    """A connection per node agent that has one; ``send`` says where there is none."""

    def __init__(self, inbox: Inbox) -> None:
        self._inbox = inbox
        self._channels: dict[int, _Channel] = {}
        #: per node, how many requests await their reply (a closed stream fails them)
        self._waiting: dict[int, int] = {}
        self._lock = threading.Lock()
        self._latest: CellRequest | None = None  # its shared names stay open until the next

    def open(self, node: int, host: str, at: CellEndpoint, context: ssl.SSLContext | None) -> bool:
        """Connect to ``node``'s agent; False when it cannot be reached (its cells then go as
        actor calls)."""
        return self.open_all([(node, host, at)], context) == [True]

    def open_all(
        self, agents: list[tuple[int, str, CellEndpoint]], context: ssl.SSLContext | None
    ) -> list[bool]:
        """Connect to every ``(node, host, endpoint)`` agent at once: where the agents cannot be
        reached (a kernel in the cluster's pod network, workers behind a gateway) each try waits
        up to ``SEND_S``, and one after the other that would be ``SEND_S`` a node."""
        with ThreadPoolExecutor(max(1, min(len(agents), _CONNECTS))) as pool:
            channels = list(pool.map(lambda a: _connect(a[1], a[2], context), agents))
        for (node, _, _), channel in zip(agents, channels, strict=True):
            if channel is not None:
                self._channels[node] = channel
                frames, ahead = Frames(), {}
                self._inbox.watch(
                    channel.sock,
                    lambda n=node, c=channel, f=frames, a=ahead: self._readable(n, c, f, a),
                )
        return [channel is not None for channel in channels]

    def local(self, nodes: Iterable[int]) -> bool:
        """Whether each of ``nodes`` has a stream to an agent on this host (``_Channel.local``)."""
        with self._lock:
            return all(n in self._channels and self._channels[n].local for n in nodes)

    def send(self, node: int, request: CellRequest) -> bool:
        """Send ``request`` to ``node``'s agent; False when it has no stream. A failed send is
        that node's reply."""
        channel = self._channels.get(node)
        if channel is None:
            return False
        with self._lock:
            self._waiting[node] = self._waiting.get(node, 0) + 1
            if request is not self._latest:
                if self._latest is not None:
                    self._latest.close()
                self._latest = request
        try:
            channel.send(request.parts(channel.local))
        except (OSError, ssl.SSLError) as exc:
            self._drop(node, channel, f"sending the cell failed: {exc}")
        except BaseException as exc:  # a Ctrl-C part way through a big request: out of step
            self._drop(node, channel, f"sending the cell was cut short ({type(exc).__name__})")
            raise
        return True

    @staticmethod
    def request(payload: object, run_id: int) -> CellRequest:
        return CellRequest(payload, run_id)

    def _readable(
        self,
        node: int,
        channel: _Channel,
        frames: Frames,
        ahead: dict[int, dict[int, RankReply]],
    ) -> None:
        """On the thread waiting on the inbox: the node's replies so far into the inbox, with
        the rank replies that came ahead of each (``ahead``: by run, then rank) put back.

        What was read and not yet handed over would be lost by an exception part way (a Ctrl-C
        lands on this thread; a frame that does not decode), and the stream would be out of step
        for good: the stream is given up instead, so a waiting request gets ``StreamLost``
        rather than no answer, and the next cells go as actor calls."""
        try:
            data = channel.recv(frames)
            for message in data or ():
                if isinstance(message, ReplyAhead):
                    ahead.setdefault(message.run_id, {})[message.reply.rank] = message.reply
                    continue
                run_id, value, error = message
                if (came := ahead.pop(run_id, None)) is not None and error is None:
                    value = NodeReply.of(value).with_ahead(came)
                if channel.files is not None and isinstance(value, NodeReply):
                    value = valuefiles.mapped(value, channel.files)
                with self._lock:
                    self._waiting[node] = max(self._waiting.get(node, 0) - 1, 0)
                failed = RuntimeError(error) if error is not None else None  # agent.run raised
                self._inbox.put_reply(Reply(node, value=value, error=failed))
        except (OSError, ssl.SSLError):
            data = None  # closed under us (close(), or the send failed)
        except BaseException as exc:
            self._drop(node, channel, f"reading its reply was cut short ({type(exc).__name__})")
            if isinstance(exc, Exception):
                return
            raise  # a Ctrl-C: the run loop stops the cell
        if data is None:
            self._drop(node, channel, "its connection closed")

    def _drop(self, node: int, channel: _Channel, why: str) -> None:
        """Forget ``node``'s stream; a request still waiting gets ``why`` as its reply."""
        with self._lock:
            if self._channels.get(node) is not channel:
                return
            del self._channels[node]
            waiting = self._waiting.pop(node, 0)
        self._inbox.unwatch(channel.sock)
        channel.close()
        if waiting:
            self._inbox.put_reply(Reply(node, error=StreamLost(why)))

    def close(self, why: str = "closed") -> None:
        """Close every connection (teardown); a request still waiting gets ``why`` as its
        reply, so a job running meanwhile ends."""
        with self._lock:
            channels = list(self._channels.items())
            latest, self._latest = self._latest, None
        for node, channel in channels:
            self._drop(node, channel, why)
        if latest is not None:
            latest.close()
