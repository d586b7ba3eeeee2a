"""A big value to a kernel on the rank's host goes as one sealed memfd (``wire/valuefiles.py``):
the rank writes it, the agent passes it on with its node's reply, the kernel maps it. Each hop
here is the real code on real sockets; the gang-level twin is in ``tests/kernel/test_cluster.py``.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import socket
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from jupyter_mn.rank.execute import dumps
from jupyter_mn.wire import sharednames, valuefiles
from jupyter_mn.wire.events import NodeReply, RankReply, RankStatus
from jupyter_mn.wire.frames import Frames, encode

MIB = 1 << 20


def _memfds() -> set[int]:
    """This process's descriptors of memfds."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:"):
                found.add(int(fd))
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return found


@pytest.fixture
def pairs() -> Iterator[tuple[socket.socket, socket.socket, socket.socket, socket.socket]]:
    """rank → agent and agent → kernel, each a stream socketpair (the agent's end of the
    kernel's is non-blocking, as on its event loop)."""
    rank, agent_in = socket.socketpair()
    agent_out, kernel = socket.socketpair()
    agent_out.setblocking(False)
    yield rank, agent_in, agent_out, kernel
    for s in (rank, agent_in, agent_out, kernel):
        s.close()


def _read(sock: socket.socket, files: valuefiles.Inbound) -> object:
    frames = Frames()
    while True:
        n = files.recv_into(frames.into())
        assert n, "the stream ended before the message"
        if messages := frames.filled(n):
            (message,) = messages
            return message


def _reply(rng: np.random.Generator) -> tuple[RankReply, list[str]]:
    value = {"big": rng.integers(0, 255, 3 * MIB, dtype=np.uint8), "small": np.arange(4)}
    pulled = rng.integers(0, 255, 2 * MIB, dtype=np.uint8)
    digests = [hashlib.sha256(value["big"]).hexdigest(), hashlib.sha256(pulled).hexdigest()]
    reply = RankReply(
        0, RankStatus.OK, value=dumps(value), pulled={"p": dumps(pulled), "tiny": dumps(1)}
    )
    return reply, digests


def _at_agent(
    rank: socket.socket, agent_in: socket.socket, seed: int
) -> tuple[RankReply, list[str]]:
    """A big reply sent by file, as the agent reads it; the digests of its two big values."""
    reply, digests = _reply(np.random.default_rng(seed))
    valuefiles.send(rank.fileno(), reply, by_file=True)
    inbound = valuefiles.Inbound(agent_in)
    return valuefiles.attached(_read(agent_in, inbound), inbound), digests


def _send_with(sock: socket.socket, message: object, files: list[int]) -> None:
    """Write ``message`` on ``sock`` with ``files``, as the agent's connection does."""
    parts = encode(message)
    sent = sharednames.send_files(sock.fileno(), files, parts[0])
    parts[0] = parts[0][sent:]
    for part in parts:
        sock.sendall(part)


def test_a_big_value_crosses_both_hops_as_a_file_the_kernel_maps_and_no_descriptor_stays(pairs):
    rank, agent_in, agent_out, kernel = pairs
    before = _memfds()
    got, digests = _at_agent(rank, agent_in, 3)
    assert got.value.file is not None and got.pulled["p"].file is not None
    assert got.pulled["tiny"].file is None  # a small value stays in the message
    assert len(got.value.data) < 1000  # the pickle only: the bytes are in the file

    node = NodeReply(0, 0, (got,))
    _send_with(agent_out, (7, node, None), valuefiles.files_of(node))
    valuefiles.close(node)

    at_kernel = valuefiles.Inbound(kernel)
    run_id, arrived, error = _read(kernel, at_kernel)
    arrived = valuefiles.mapped(arrived, at_kernel)
    value = arrived.ranks[0].value.loads()
    pulled = arrived.ranks[0].pulled["p"].loads()
    assert (run_id, error) == (7, None)
    assert [hashlib.sha256(value["big"]).hexdigest(), hashlib.sha256(pulled).hexdigest()] == digests
    assert value["small"].tolist() == [0, 1, 2, 3] and arrived.ranks[0].pulled["tiny"].loads() == 1
    value["big"][:] = 0  # copy-on-write: the value is the kernel's own to change
    assert _memfds() <= before  # every hop closed its descriptors; the mappings hold the pages


def test_without_by_file_or_when_small_a_reply_goes_as_bytes_and_no_file_is_made(pairs):
    rank, agent_in, _, _ = pairs
    reply, _ = _reply(np.random.default_rng(4))
    small = RankReply(0, RankStatus.OK, value=dumps(np.zeros(1000)))
    sender = threading.Thread(  # the socket holds less than the reply: read while it is sent
        target=lambda: [
            valuefiles.send(rank.fileno(), reply),
            valuefiles.send(rank.fileno(), small, by_file=True),
        ]
    )
    sender.start()
    inbound = valuefiles.Inbound(agent_in)
    for _ in range(2):
        got = valuefiles.attached(_read(agent_in, inbound), inbound)
        assert got.value.file is None and got.value.buffers
    sender.join()


def test_the_agent_sends_bytes_when_the_files_cannot_go_with_its_reply(pairs):
    """``inline``: the agent's fallback maps the files and closes them; the bytes are the same."""
    rank, agent_in, _, _ = pairs
    before = _memfds()
    got, digests = _at_agent(rank, agent_in, 5)
    node = valuefiles.inline(NodeReply(0, 0, (got,)))
    assert _memfds() <= before
    back = pickle.loads(pickle.dumps(node, protocol=5))  # as the stream's encode carries it
    assert hashlib.sha256(back.ranks[0].value.loads()["big"]).hexdigest() == digests[0]


def test_a_file_that_is_not_sealed_is_refused_by_the_kernel(pairs):
    """A file in a reply must be a sealed memfd: one whose bytes could change under the value
    is refused (the stream is given up), and closed."""
    _, _, agent_out, kernel = pairs
    loose = os.memfd_create("loose", os.MFD_CLOEXEC)
    os.write(loose, bytes(MIB))
    inode = os.fstat(loose).st_ino
    from jupyter_mn.wire.payload import InFile
    from jupyter_mn.wire.values import Pickled

    data = pickle.dumps(np.zeros(MIB, dtype=np.uint8), protocol=5, buffer_callback=lambda _: False)
    reply = RankReply(
        0, RankStatus.OK, value=Pickled(data, file=InFile(0, ((0, MIB),), loose, inode))
    )
    _send_with(agent_out, (1, NodeReply(0, 0, (reply,)), None), [loose])
    os.close(loose)
    before = _memfds()
    inbound = valuefiles.Inbound(kernel)
    _, node, _ = _read(kernel, inbound)
    with pytest.raises(ConnectionError, match="not a sealed memfd"):
        valuefiles.mapped(node, inbound)
    assert _memfds() <= before
