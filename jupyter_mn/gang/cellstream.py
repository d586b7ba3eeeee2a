"""The kernel's end of the cell stream (docs/architecture.md, "The cell stream"): a cell's
request goes to each node agent straight from the thread that runs the cell, and each node's
reply is read by the thread waiting on the inbox (``Inbox.watch``), with no dask client loop
and no reader thread on the way.

An agent on this host is reached on its AF_UNIX socket (``wire/cellendpoint.py``), without
TLS: its directory admits this user alone. Across hosts TLS is done on memory buffers
(``node/tlsbuffers.py``) under a lock, so a sending thread and the reading one can share one
connection (an ``SSLSocket`` must not be used by two threads at once). Either way a reply is
read (or decrypted) straight into its message's buffer (``Frames.into``): a big value is copied
once on its way in. A rank's big reply may come ahead of its node's (``wire/valueahead.py``),
while the rank still sends it; it waits here, per node, for the node's reply. A request over
``MAX_REQUEST`` bytes (a cell with large captured variables) goes as an actor call instead, and
a send gives up after ``SEND_S``: a send on a cut link must not hold the cell's thread.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..node.tlsbuffers import TlsBuffers
from ..wire.cellendpoint import CellEndpoint
from ..wire.events import NodeReply, RankReply
from ..wire.frames import Frames, encode
from ..wire.valueahead import ReplyAhead
from .inbox import Inbox, Reply

MAX_REQUEST = 64 * 1024
#: How long connecting, the TLS handshake or one send may take.
SEND_S = 5.0
#: At most this many agents are connected to at once.
_CONNECTS = 32


#: The most one read of TLS records takes: a big value arrives in fewer turns of the inbox.
READ = 1 << 20


class StreamLost(ConnectionError):
    """The connection to a node agent closed or failed while a cell waited for its reply."""


class _Channel:
    """One connection, TLS (as the worker's comms) or plain: sent to and read from any thread."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext | None) -> None:
        self.sock = sock
        self._lock = threading.Lock()
        self._tls: TlsBuffers | None = None
        self._records = bytearray(READ) if context is not None else bytearray()
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

    def send(self, parts: Sequence[bytes]) -> None:
        with self._lock:
            for data in parts if self._tls is None else self._tls.wrap(parts):
                self.sock.sendall(data)

    def recv(self, frames: Frames) -> list[Any] | None:
        """The messages what arrived completes (maybe none yet); None once the connection is
        over. Called when the socket is readable."""
        into = frames.into() if self._tls is None else memoryview(self._records)
        try:
            n = self.sock.recv_into(into)
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

    def send(self, node: int, request: Sequence[bytes]) -> bool:
        """Send ``request`` (``encode``d) to ``node``'s agent; False when it has no stream or
        ``request`` is too large for one. A failed send is that node's reply."""
        channel = self._channels.get(node)
        if channel is None or sum(map(len, request)) > MAX_REQUEST:
            return False
        with self._lock:
            self._waiting[node] = self._waiting.get(node, 0) + 1
        try:
            channel.send(request)
        except (OSError, ssl.SSLError) as exc:
            self._drop(node, channel, f"sending the cell failed: {exc}")
        return True

    @staticmethod
    def request(payload: object, run_id: int) -> tuple[bytes, bytes]:
        return encode((payload, run_id))

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
        for node, channel in channels:
            self._drop(node, channel, why)
