"""A node's one copy of a large notebook name (``wire/sharednames.py``): the agent's sealed memfd,
passed beside the message on a real socket pair, mapped copy-on-write by the rank; and the
stand-in ranks, which speak the same protocol."""

from __future__ import annotations

import hashlib
import os
import pickle
import socket
from multiprocessing.connection import Connection

import numpy as np
import pytest

from jupyter_mn import Cluster
from jupyter_mn.wire.payload import Captured, CellPayload, InFile
from jupyter_mn.wire.sharednames import (
    HeldNames,
    SharedNames,
    close,
    opened,
    received,
    send_files,
)
from tests.support.simulated import standin_env


def _captured(name: str, value: object) -> Captured:
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    return Captured(name, "digest", data, tuple(buffers))


def test_a_large_name_crosses_as_one_sealed_file_that_each_reader_maps_copy_on_write():
    big = np.random.default_rng(5).integers(0, 2**31, 1 << 20, dtype=np.int32)  # 4 MiB
    payload = CellPayload("x", 1, (_captured("big", big), _captured("small", np.arange(3))))
    agent, rank = socket.socketpair()
    shared = SharedNames(payload)
    try:
        (fd,) = shared.fds
        with pytest.raises(PermissionError):  # sealed: no reader can change what the others read
            os.pwrite(fd, b"x", 0)
        Connection(os.dup(agent.fileno())).send_bytes(pickle.dumps(shared.payload, protocol=5))
        send_files(agent.fileno(), shared.fds)
    finally:
        shared.close()
    got = received(rank.fileno(), pickle.loads(Connection(os.dup(rank.fileno())).recv_bytes()))
    held = HeldNames()
    first, small = (held.value(c) for c in got.names)
    assert np.array_equal(first, big) and np.array_equal(small, np.arange(3))
    first[:4] = -1  # writable, and only for this reader
    small[:] = 7
    again, small_again = (held.value(Captured(c.name, "digest", None)) for c in got.names)
    assert np.array_equal(again, big) and np.array_equal(small_again, np.arange(3))
    for c in got.names:  # what a rank holds until its next value of the name
        close(c)
    agent.close()
    rank.close()


def test_only_a_sealed_memfd_of_the_kernel_is_opened():
    payload = CellPayload("x", 1, (_captured("big", np.ones(1 << 20)),))
    shared = SharedNames(payload)
    try:
        with pytest.raises(ValueError, match="on this host alone"):
            opened(shared.payload, None)  # a kernel over TCP
        (mine,) = opened(shared.payload, os.getpid()).names
        assert mine.shared is not None and mine.shared.fd != shared.fds[0]
        os.close(mine.shared.fd)
        read, write = os.pipe()
        first = shared.payload.names[0].shared
        assert first is not None
        forged = CellPayload("x", 1, (Captured("big", "d", b"", shared=InFile(0, (), read)),))
        with pytest.raises(ValueError, match="not a sealed memfd"):
            opened(forged, os.getpid())
        other = SharedNames(payload)  # another file where the first one's number was
        try:
            reused = InFile(0, (), other.fds[0], first.inode)
            moved = CellPayload("x", 1, (Captured("big", "d", b"", shared=reused),))
            with pytest.raises(ValueError, match="no longer the kernel's"):
                opened(moved, os.getpid())
        finally:
            other.close()
        os.close(read)
        os.close(write)
    finally:
        shared.close()


def test_stand_in_ranks_read_a_pushed_array_too(monkeypatch, no_leftovers):
    for key, value in standin_env().items():
        monkeypatch.setenv(key, value)
    pushed = np.random.default_rng(2).integers(0, 255, 16 << 20, dtype=np.uint8)
    cell = "import hashlib\nhashlib.sha256(pushed).hexdigest()"
    with Cluster(nodes=1, gpus=2) as cluster:
        digests = cluster.run(cell, namespace={"pushed": pushed}, return_all=True).unwrap()
        again = cluster.run(cell, namespace={"pushed": pushed}, return_all=True).unwrap()
    assert digests == again == [hashlib.sha256(pushed).hexdigest()] * 2
