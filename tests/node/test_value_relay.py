"""A rank's big reply goes to the kernel as the agent reads it (``node/valuerelay.py``,
``wire/valueahead.py``), through the agent's real parts: a rank process speaking the control
socket, its ``RankHandle``, ``CellRuns`` and the ``CellServer``. The rank sends half of its
value, then waits on a FIFO the test opens: what the kernel has by then proves the relay."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from distributed.security import Security

from jupyter_mn.gang.cellstream import CellStream
from jupyter_mn.gang.inbox import Inbox
from jupyter_mn.node import cellserver
from jupyter_mn.node.cellrun import CellRuns
from jupyter_mn.node.cellserver import CellServer
from jupyter_mn.node.process import RankHandle
from jupyter_mn.wire.cellendpoint import CellEndpoint
from jupyter_mn.wire.events import NodeReply, RankStatus
from jupyter_mn.wire.frames import Frames, encode, write_all
from jupyter_mn.wire.payload import CellPayload
from jupyter_mn.wire.valueahead import ReplyAhead
from tests.support.agentloop import Recorder

SIZE = 24 << 20  # over the sockets' buffers: half of it cannot wait in them whole
DEADLINE_S = 30.0

#: A rank that answers each cell with a random array of SIZE bytes: its reply's header, pickle
#: and first half, then (once the FIFO ``argv[1]`` gives it a byte) the rest.
RANK = f"""
import os, pickle, sys
import numpy as np
from multiprocessing.connection import Connection
from jupyter_mn.wire.events import RankReply, RankStatus
from jupyter_mn.wire.frames import encode, write_all
from jupyter_mn.wire.rankwire import Stop
from jupyter_mn.wire.values import Pickled
conn = Connection(int(os.environ["JUPYTER_MN_CONTROL_FD"]))
while not isinstance(conn.recv(), Stop):
    value = np.random.default_rng(7).integers(0, 255, {SIZE}, dtype=np.uint8)
    buffers = []
    data = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    head, body, array = encode(RankReply(0, RankStatus.OK, value=Pickled(data, tuple(buffers))))
    half = array.nbytes // 2
    write_all(conn.fileno(), [head, body, array[:half]])
    with open(sys.argv[1], "rb") as go:
        go.read(1)
    write_all(conn.fileno(), [array[half:]])
"""
DIGEST = hashlib.sha256(
    np.random.default_rng(7).integers(0, 255, SIZE, dtype=np.uint8).tobytes()
).hexdigest()


class _Output(Recorder):
    """The node's output, as a run flushes it."""

    def send_displays(self) -> None:
        pass

    def flush(self) -> int:
        return 0


class Node:
    """One rank and the agent's parts that serve the cell stream, on a loop thread."""

    def __init__(self, fifo: str, security: Security) -> None:
        self.fifo = fifo
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.handle, self.server = self.call(self._start(security))
        self.endpoint: CellEndpoint = self.server.endpoint

    async def _start(self, security: Security) -> tuple[RankHandle, CellServer]:
        argv = [sys.executable, "-c", RANK, self.fifo]
        output = _Output()
        handle = RankHandle(output, 0, 0, dict(os.environ), None, argv)
        cells = CellRuns(SimpleNamespace(handles=[handle], output=output), asyncio.Event())
        cells.telemetry = SimpleNamespace(cell=lambda running: False)  # type: ignore[assignment]
        server = CellServer(cells.start)  # type: ignore[arg-type]
        await server.start("127.0.0.1", security.get_listen_args("worker")["ssl_context"])
        return handle, server

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(DEADLINE_S)

    def release(self) -> None:
        """Let the rank send the rest of its value (once it waits for it)."""
        with open(self.fifo, "wb") as go:
            go.write(b"!")

    def close(self) -> None:
        async def stop() -> None:
            await self.server.close()
            await self.handle.stop()

        self.call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def tls() -> Security:
    return Security.temporary()


@pytest.fixture
def node(tmp_path, tls) -> Iterator[Node]:
    fifo = str(tmp_path / "go")
    os.mkfifo(fifo)
    n = Node(fifo, tls)
    yield n
    n.close()


class Kernel:
    """The kernel's end on the agent's AF_UNIX socket, read by hand: bytes as they come."""

    def __init__(self, node: Node) -> None:
        assert node.endpoint.path is not None
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(DEADLINE_S)
        self.sock.connect(node.endpoint.path)
        self.frames = Frames()
        self.received = 0

    def send(self, run_id: int) -> None:
        write_all(self.sock.fileno(), encode((CellPayload("x", 1), run_id)))

    def read_past(self, count: int) -> list[Any]:
        """Read until ``count`` bytes have come in all; the messages they complete."""
        messages: list[Any] = []
        while self.received < count:
            n = self.sock.recv_into(self.frames.into())
            assert n, "the agent closed the connection"
            self.received += n
            messages += self.frames.filled(n)
        return messages

    def read_reply(self) -> list[Any]:
        """Read up to and including the node's reply."""
        messages: list[Any] = []
        while not messages or not isinstance(messages[-1], tuple):
            messages += self.read_past(self.received + 1)
        return messages


def _digest(reply: NodeReply) -> str:
    (rank,) = reply.ranks
    assert rank.value is not None
    return hashlib.sha256(rank.value.loads().tobytes()).hexdigest()


def test_a_big_reply_reaches_the_kernel_while_its_rank_still_sends_it(node):
    kernel = Kernel(node)
    kernel.send(7)
    kernel.read_past(SIZE // 2)  # the rank waits on its FIFO meanwhile
    node.release()
    ahead, (run_id, reply, error) = kernel.read_reply()
    assert isinstance(ahead, ReplyAhead) and (ahead.run_id, run_id, error) == (7, 7, None)
    assert reply.ahead == (0,) and reply.ranks[0].value is None  # the value went ahead alone
    assert _digest(reply.with_ahead({0: ahead.reply})) == DIGEST
    kernel.sock.close()


def test_a_rank_killed_mid_value_is_lost_and_the_stream_stays_in_step(node):
    kernel = Kernel(node)
    kernel.send(1)
    kernel.read_past(SIZE // 2)
    os.kill(node.handle.proc.pid, signal.SIGKILL)
    *_, (run_id, reply, error) = kernel.read_reply()  # the cut reply, padded, came first
    assert (run_id, error, reply.ahead) == (1, None, ())
    (lost,) = reply.ranks
    assert lost.status == RankStatus.LOST and lost.error is not None
    assert "SIGKILL" in lost.error.evalue
    kernel.send(2)  # the next cell's reply is read as one: nothing of the last is left over
    (_, again, _) = kernel.read_reply()[-1]
    assert again.ranks[0].status == RankStatus.LOST
    kernel.sock.close()


def test_a_kernel_gone_mid_value_leaves_the_rank_and_agent_ready_for_the_next(node):
    first = Kernel(node)
    first.send(1)
    first.read_past(SIZE // 2)
    first.sock.close()
    node.release()  # the agent reads the rest and drops it
    second = Kernel(node)
    second.send(2)
    second.read_past(SIZE // 2)
    node.release()
    ahead, (_, reply, _) = second.read_reply()
    assert _digest(reply.with_ahead({0: ahead.reply})) == DIGEST
    second.sock.close()


def test_a_big_reply_goes_ahead_over_tls_and_the_kernel_puts_it_back(node, tls, monkeypatch):
    relayed: list[bytes] = []
    begin = cellserver._Connection.relay
    monkeypatch.setattr(
        cellserver._Connection, "relay", lambda c, head: relayed.append(head) or begin(c, head)
    )
    inbox = Inbox()
    stream = CellStream(inbox)
    context = tls.get_connection_args("client")["ssl_context"]
    assert stream.open(0, "127.0.0.1", CellEndpoint(node.endpoint.port), context)
    try:
        (connection,) = node.server.connections
        assert connection.transport.get_extra_info("socket").family != socket.AF_UNIX
        assert stream.send(0, stream.request(CellPayload("x", 1), 3))
        releasing = threading.Thread(target=node.release)
        releasing.start()
        got = inbox.get(timeout=DEADLINE_S)
        releasing.join(DEADLINE_S)
    finally:
        stream.close()
    assert got.error is None and len(relayed) == 1
    assert got.value.ahead == () and _digest(got.value) == DIGEST


def test_a_rank_killed_mid_value_gives_the_kernel_its_error_over_tls(node, tls):
    inbox = Inbox()
    stream = CellStream(inbox)
    context = tls.get_connection_args("client")["ssl_context"]
    assert stream.open(0, "127.0.0.1", CellEndpoint(node.endpoint.port), context)
    try:
        assert stream.send(0, stream.request(CellPayload("x", 1), 3))
        killing = threading.Thread(target=_kill_once_waiting, args=(node,))
        killing.start()
        got = inbox.get(timeout=DEADLINE_S)
        killing.join(DEADLINE_S)
    finally:
        stream.close()
    (lost,) = got.value.ranks
    assert got.error is None and lost.status == RankStatus.LOST


def _kill_once_waiting(node: Node) -> None:
    """Kill the rank once it has sent half its value and waits for the rest (the FIFO opens
    for writing once the rank opens it to read)."""
    with open(node.fifo, "wb"):
        os.kill(node.handle.proc.pid, signal.SIGKILL)
