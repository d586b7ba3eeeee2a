"""The cell stream on its own: a real TLS connection with dask's certificates between the kernel's
end (``CellStream``, read by a thread waiting on the inbox while another sends) and the
agent's (``CellServer``, an asyncio protocol), with a ``run`` standing in for
``NodeAgent.run``."""

from __future__ import annotations

import asyncio
import hashlib
import os
import pickle
import queue
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from distributed.security import Security

from jupyter_mn.gang import cellstream
from jupyter_mn.gang.cellstream import CellStream, StreamLost
from jupyter_mn.gang.inbox import Inbox, Reply
from jupyter_mn.node import cellserver, socketdirs
from jupyter_mn.node.cellserver import CellServer
from jupyter_mn.node.tlsbuffers import TlsBuffers
from jupyter_mn.wire.cellendpoint import CellEndpoint
from jupyter_mn.wire.frames import Frames
from jupyter_mn.wire.payload import Captured, CellPayload
from tests.support.otheruser import other_user
from tests.support.polling import wait_until
from tests.support.procs import open_files


class Agent:
    """A CellServer on a loop thread of its own; ``run`` starts a run that answers ``payload * 2``
    as bytes, or the digest of the array in ``("digest", array)``, or fails to start for "boom",
    or fails later for "bust", or waits for ``release`` on "wait"."""

    def __init__(self, security: Security) -> None:
        self.loop = asyncio.new_event_loop()
        self.release = asyncio.Event()
        self.big = np.random.default_rng(7).integers(0, 255, 64 << 20, dtype=np.uint8)
        self.waiting = threading.Event()  # a "wait" run has started
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = CellServer(self.run)
        context = security.get_listen_args("worker")["ssl_context"]
        self.call(self.server.start("127.0.0.1", context))
        self.endpoint = self.server.endpoint
        self.port = self.endpoint.port

    def run(self, payload: Any, run_id: int, sink: Any) -> asyncio.Future[Any]:
        if payload == "big":  # a cell whose value is a big array
            return asyncio.ensure_future(_now(self.big))
        if isinstance(payload, CellPayload):  # a cell with names, on a node without ranks
            raise ValueError("no ranks here")
        if isinstance(payload, tuple):  # ("digest", a cell's big captured array)
            return asyncio.ensure_future(_now(hashlib.sha256(payload[1]).hexdigest()))
        if payload == "boom":
            raise ValueError("no such rank")
        return asyncio.ensure_future(self._run(payload, run_id))

    async def _run(self, payload: Any, run_id: int) -> bytes:
        if payload == "bust":
            raise RuntimeError("a rank's reply did not decode")
        if payload == "wait":
            self.waiting.set()
            await self.release.wait()
        return repr((payload * 2, run_id)).encode()

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def close(self) -> None:
        if self.loop.is_running():
            self.call(self.server.close())
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


async def _now(value: Any) -> Any:
    return value


@pytest.fixture
def tls() -> Security:
    return Security.temporary()


@pytest.fixture
def agent(tls: Security) -> Iterator[Agent]:
    a = Agent(tls)
    yield a
    a.close()


def replies(inbox: Inbox, n: int) -> list[Reply]:
    return [inbox.get(timeout=10) for _ in range(n)]


def connected(agent: Agent, security: Security) -> tuple[CellStream, Inbox]:
    inbox = Inbox()
    stream = CellStream(inbox)
    context = security.get_connection_args("client")["ssl_context"]
    assert stream.open(0, "127.0.0.1", CellEndpoint(agent.port), context)
    return stream, inbox


def test_requests_sent_while_replies_are_read_all_come_back_over_tls(agent, tls):
    stream, inbox = connected(agent, tls)
    try:
        got: list[Reply] = []
        reader = threading.Thread(target=lambda: got.extend(replies(inbox, 300)))
        reader.start()  # reads the connection (TLS records) while this thread writes to it
        for run_id in range(300):
            assert stream.send(0, stream.request(run_id, run_id))
        reader.join(60)
        assert sorted(eval(r.value.decode()) for r in got) == [(2 * i, i) for i in range(300)]
        assert all(r.node == 0 and r.error is None for r in got)
        assert stream.send(0, stream.request("boom", 1))
        assert stream.send(0, stream.request("bust", 2))
        failed = [inbox.get(timeout=10).error for _ in range(2)]
        assert all(isinstance(error, RuntimeError) for error in failed)
        said = sorted(str(error) for error in failed)
        assert said == ["RuntimeError: a rank's reply did not decode", "ValueError: no such rank"]
    finally:
        stream.close()


def test_a_kernel_without_the_gangs_certificate_is_refused(agent):
    other = Security.temporary()  # another CA: the agent requires a client certificate of its own
    inbox = Inbox()
    stream = CellStream(inbox)
    tcp = CellEndpoint(agent.port)
    assert not stream.open(0, "127.0.0.1", tcp, other.get_connection_args("client")["ssl_context"])
    assert not stream.send(0, stream.request("x", 1))  # no stream: the caller sends it otherwise
    # plain TCP connects, but the agent takes no request from it: it closes the connection
    assert stream.open(0, "127.0.0.1", tcp, None)
    assert stream.send(0, stream.request("x", 2))
    assert isinstance(inbox.get(timeout=10).error, StreamLost)


def test_a_peer_that_never_finishes_the_tls_handshake_is_closed(agent, monkeypatch):
    monkeypatch.setattr(cellserver, "HANDSHAKE_S", 0.2)
    with socket.create_connection(("127.0.0.1", agent.port), timeout=10) as sock:
        assert sock.recv(1) == b""  # the agent closed it (a timeout here would raise)


def test_a_large_request_goes_on_the_stream_with_its_array_out_of_band_over_tls(agent, tls):
    """A cell's 64 MiB captured array travels in the request itself, in slices of TLS records;
    the agent's digest of what it got is the kernel's."""
    stream, inbox = connected(agent, tls)
    try:
        _big_request_through(stream, inbox)
    finally:
        stream.close()


def test_a_stream_closed_under_a_waiting_request_is_that_nodes_reply(agent, tls):
    stream, inbox = connected(agent, tls)
    assert stream.send(0, stream.request("wait", 5))
    assert agent.waiting.wait(10)
    agent.close()  # the agent's process goes: its connection closes
    lost = inbox.get(timeout=10)
    assert (lost.node, type(lost.error)) == (0, StreamLost)
    assert not stream.send(0, stream.request("x", 6))  # the next cell goes another way
    stream.close()


def test_closing_an_idle_stream_posts_nothing(agent, tls):
    stream, inbox = connected(agent, tls)
    stream.close()
    agent.close()
    with pytest.raises(queue.Empty):  # no reply for a request nobody made
        inbox.get(timeout=0.5)


def test_a_ctrl_c_while_a_reply_is_read_gives_the_stream_up_and_says_so(agent, tls, monkeypatch):
    """The bytes read are gone once the interrupt lands: the stream, out of step, is given up,
    so the request still waiting gets ``StreamLost`` instead of no answer."""
    stream, inbox = connected(agent, tls)
    assert stream.send(0, stream.request("wait", 1))
    assert agent.waiting.wait(10)

    def interrupted(self: Frames, data: bytes) -> list[Any]:
        raise KeyboardInterrupt

    monkeypatch.setattr(Frames, "feed", interrupted)
    agent.loop.call_soon_threadsafe(agent.release.set)  # the reply comes
    with pytest.raises(KeyboardInterrupt):
        inbox.get(timeout=10)
    lost = inbox.get(timeout=0)
    assert (lost.node, type(lost.error)) == (0, StreamLost)
    assert "cut short (KeyboardInterrupt)" in str(lost.error)
    assert not stream.send(0, stream.request("x", 2))  # the next cell goes another way


def test_a_ctrl_c_part_way_through_a_big_request_gives_the_stream_up(agent, tls, monkeypatch):
    """The agent holds part of a request: the stream, out of step, is not used again, and that
    node's reply says why."""
    stream, inbox = connected(agent, tls)
    sent: list[int] = []

    def interrupted(self: Any, data: memoryview) -> None:
        if sent:
            raise KeyboardInterrupt
        sent.append(data.nbytes)
        real(self, data)

    real = cellstream._Channel._send_slice
    monkeypatch.setattr(cellstream._Channel, "_send_slice", interrupted)
    array = np.zeros(3 * cellstream.SLICE, dtype=np.uint8)
    with pytest.raises(KeyboardInterrupt):
        stream.send(0, stream.request(("digest", array), 1))
    lost = inbox.get(timeout=10)
    assert (lost.node, type(lost.error)) == (0, StreamLost)
    assert "cut short (KeyboardInterrupt)" in str(lost.error)
    assert not stream.send(0, stream.request("x", 2))


def test_a_reply_read_together_with_the_peers_close_notify_is_delivered(tls):
    """An agent that answers and closes at once: both records may come in one read."""
    client = TlsBuffers(tls.get_connection_args("client")["ssl_context"], server_side=False)
    server = TlsBuffers(tls.get_listen_args("worker")["ssl_context"], server_side=True)
    client.feed(b"")  # the client's hello
    while not (client.handshaken and server.handshaken):
        server.feed(client.outgoing())
        client.feed(server.outgoing())
    assert client.feed(b"".join(server.wrap([b"last reply"])) + server.close()) == b"last reply"
    assert client.feed(b"") is None  # closed: what follows is nothing


def test_agents_that_cannot_be_reached_cost_one_wait_not_one_each(agent, tls, monkeypatch):
    """Six "agents" take the connection and never answer the handshake (a gateway that
    swallows it): they are tried together, while the reachable one gets its stream."""
    from jupyter_mn.gang import cellstream

    monkeypatch.setattr(cellstream, "SEND_S", 3.0)
    silent = [socket.create_server(("127.0.0.1", 0)) for _ in range(6)]
    try:
        stream = CellStream(Inbox())
        context = tls.get_connection_args("client")["ssl_context"]
        targets = [(0, "127.0.0.1", CellEndpoint(agent.port))]
        targets += [
            (n, "127.0.0.1", CellEndpoint(s.getsockname()[1])) for n, s in enumerate(silent, 1)
        ]
        started = time.monotonic()
        assert stream.open_all(targets, context) == [True] + [False] * 6
        assert time.monotonic() - started < 12  # one after the other: 18 s
        assert stream.send(0, stream.request(21, 1)) and not stream.send(1, stream.request("x", 2))
    finally:
        for server in silent:
            server.close()


def _big_value_through(agent: Agent, stream: CellStream, inbox: Inbox) -> None:
    """A 64 MiB array (out of band, as a value's) from the agent: its bytes arrive intact."""
    assert stream.send(0, stream.request("big", 1))
    (reply,) = replies(inbox, 1)
    assert reply.error is None
    assert hashlib.sha256(reply.value).hexdigest() == hashlib.sha256(agent.big).hexdigest()


def _big_request_through(stream: CellStream, inbox: Inbox) -> None:
    array = np.random.default_rng(3).integers(0, 255, 64 << 20, dtype=np.uint8)
    request = stream.request(("digest", array), 1)
    assert max(len(part) for part in request.parts(local=False)[:2]) < 1000  # not in the pickle
    assert stream.send(0, request)
    (reply,) = replies(inbox, 1)
    assert reply.error is None and reply.value == hashlib.sha256(array).hexdigest()


def test_a_big_value_arrives_intact_over_tls(agent, tls):
    stream, inbox = connected(agent, tls)
    try:
        _big_value_through(agent, stream, inbox)
    finally:
        stream.close()


def test_a_kernel_on_the_agents_host_takes_its_socket_and_a_big_value_arrives_intact(agent, tls):
    inbox = Inbox()
    stream = CellStream(inbox)
    context = tls.get_connection_args("client")["ssl_context"]
    assert stream.open(0, "127.0.0.1", agent.endpoint, context)
    try:
        # the kernel's end is connected once the agent's backlog has it; the agent's end
        # once its loop has accepted it
        connections = wait_until(lambda: list(agent.server.connections), 30, "the agent's end")
        (connection,) = connections
        assert connection.transport.get_extra_info("socket").family == socket.AF_UNIX
        _big_value_through(agent, stream, inbox)
        _big_request_through(stream, inbox)
    finally:
        stream.close()


def test_a_run_that_fails_to_start_leaves_none_of_the_kernels_files_open(agent, tls):
    """On the AF_UNIX stream a big name comes as a memfd of the kernel's, which the agent opens;
    a run that cannot start closes it again (here the kernel is this process too)."""
    inbox = Inbox()
    stream = CellStream(inbox)
    context = tls.get_connection_args("client")["ssl_context"]
    assert stream.open(0, "127.0.0.1", agent.endpoint, context)
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(np.ones(1 << 20), protocol=5, buffer_callback=buffers.append)
    payload = CellPayload("x", 1, (Captured("big", "", data, tuple(buffers)),))
    try:
        assert stream.send(0, stream.request(payload, 1))
        assert "no ranks here" in str(inbox.get(timeout=10).error)
    finally:
        stream.close()  # and the kernel's own file with it
    assert not [path for path in open_files() if "jupyter-mn-big" in path]


def test_the_agents_socket_is_in_a_directory_only_its_user_may_enter(agent):
    assert agent.endpoint.path is not None
    folder = os.stat(os.path.dirname(agent.endpoint.path))
    assert stat.S_IMODE(folder.st_mode) == 0o700 and folder.st_uid == os.getuid()
    with other_user() as user:
        connect = f"import socket; socket.socket(socket.AF_UNIX).connect({agent.endpoint.path!r})"
        tried = user.sh(f"python3 -c {shlex.quote(connect)}", check=False)
        assert tried.returncode != 0 and "PermissionError" in tried.stderr


#: An agent's cell server alone, in a process of its own: it prints its socket's path.
_SERVER = """
import asyncio
from jupyter_mn.node.cellserver import CellServer
async def serve():
    server = CellServer(lambda *a: None)
    await server.start("127.0.0.1", None)
    print(server.endpoint.path, flush=True)
    await asyncio.Event().wait()
asyncio.run(serve())
"""


def _stale_socket(folder: str) -> None:
    """A socket in ``folder`` that nobody listens on any more (as a killed agent leaves it)."""
    with socket.socket(socket.AF_UNIX) as gone:
        gone.bind(os.path.join(folder, socketdirs.SOCKET))


def test_a_killed_agents_socket_directory_is_removed_by_the_next_agent_and_a_live_ones_kept(tls):
    killed = subprocess.Popen([sys.executable, "-c", _SERVER], stdout=subprocess.PIPE, text=True)
    try:
        path = killed.stdout.readline().strip()
    finally:
        killed.kill()
        killed.wait()
    assert os.path.exists(path)  # SIGKILL: it could not remove it
    live = Agent(tls)
    try:
        assert not os.path.exists(os.path.dirname(path))
        later = Agent(tls)  # its sweep leaves the live agent's socket alone
        later.close()
        with socket.socket(socket.AF_UNIX) as kernel:
            kernel.connect(live.endpoint.path)
    finally:
        live.close()


def test_the_sweep_leaves_another_users_socket_directories(agent):
    with other_user() as user:
        folder = tempfile.mkdtemp(prefix=socketdirs.PREFIX)
        try:
            _stale_socket(folder)
            os.chown(folder, user.uid, user.gid)
            socketdirs.sweep()
            assert os.path.exists(os.path.join(folder, socketdirs.SOCKET))
        finally:
            shutil.rmtree(folder)
