"""A host's one copy of a large notebook name, which each rank maps rather than receives.

The kernel sends a cell's names once per node (``gang/cellstream.py``), each a protocol-5 pickle
with its arrays' memory out of band (``payload.Captured``). A large name's buffers are written
into a sealed memfd (``SharedNames``): by the kernel itself for the agents on its host, which
open it through ``/proc/<kernel pid>/fd`` (``opened``), else by the agent from the request. The
agent passes the file to each rank right after the cell's message (``SCM_RIGHTS`` on the rank's
control socket, ``send_files`` / ``received``), and a rank maps it copy-on-write (``loads``): an
array is rebuilt on the shared pages, writable, and only the pages a rank writes become its own.
So the ranks of a host hold one copy of a 256 MiB array, not one each, and none of them is
written through a socket.

Agent and ranks are always on one host (the ranks are the agent's children), on every backend.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import mmap
import os
import pickle
import socket
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from . import values
from .payload import Captured, CellPayload, InFile

#: Names whose buffers come to this many bytes or more are shared; smaller ones cost less in the
#: message itself.
SHARE_MIN_BYTES = 1 << 20
#: Each buffer starts at a multiple of this in the file (an array's elements stay aligned).
_ALIGN = 64
_SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL


class SharedNames:
    """A payload as an agent's ranks get it, and the files its large names' buffers lie in
    (closed by ``close`` once sent: each rank then holds its own descriptor)."""

    def __init__(self, payload: CellPayload) -> None:
        self.fds: list[int] = []
        try:
            names = tuple(self._share(c) for c in payload.names)
        except BaseException:
            self.close()
            raise
        self.payload = dataclasses.replace(payload, names=names)

    def _share(self, c: Captured) -> Captured:
        if c.shared is not None:  # the kernel's file, which this agent opened (``opened``)
            self.fds.append(c.shared.fd)
            index = len(self.fds) - 1
            return dataclasses.replace(c, shared=dataclasses.replace(c.shared, index=index))
        size = sum(memoryview(b).nbytes for b in c.buffers)
        if c.data is None or size < SHARE_MIN_BYTES:  # pickled in band by the message to ranks
            return dataclasses.replace(c, buffers=tuple(map(pickle.PickleBuffer, c.buffers)))
        fd, parts = sealed(f"jupyter-mn-{c.name}", [memoryview(b) for b in c.buffers])
        self.fds.append(fd)
        shared = InFile(len(self.fds) - 1, parts, fd, os.fstat(fd).st_ino)
        return dataclasses.replace(c, buffers=(), shared=shared)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def sealed(name: str, buffers: Sequence[memoryview]) -> tuple[int, tuple[tuple[int, int], ...]]:
    """A new memfd holding ``buffers``, sealed read-only for good, and each buffer's offset and
    size in it (each starts aligned, so an array's elements stay aligned)."""
    fd = os.memfd_create(os.fsencode(name)[:249], os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        parts, offset = [], 0
        for buffer in buffers:
            view = buffer.cast("B")
            parts.append((offset, view.nbytes))
            _write_at(fd, view, offset)
            offset += -(-view.nbytes // _ALIGN) * _ALIGN
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    except BaseException:
        os.close(fd)
        raise
    return fd, tuple(parts)


def _write_at(fd: int, view: memoryview, offset: int) -> None:
    while view.nbytes:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def is_sealed(fd: int) -> bool:
    """Whether ``fd`` is a memfd sealed as ``sealed`` seals one (no one may change it)."""
    try:
        return fcntl.fcntl(fd, fcntl.F_GET_SEALS) == _SEALS
    except OSError:  # not a file that takes seals
        return False


def mapped(fd: int, parts: Sequence[tuple[int, int]]) -> list[memoryview]:
    """The ``parts`` of file ``fd`` on a fresh copy-on-write mapping: writable, and what is
    written stays in this process. The mapping holds no descriptor (``mmap.mmap`` keeps a
    duplicate for as long as it lives: a kernel holding a few hundred values would run out);
    it is unmapped once nothing uses its memory."""
    size = max((o + n for o, n in parts), default=0)
    if not size:
        return [memoryview(bytearray()) for _ in parts]
    address = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE, fd, 0)
    if address in (None, _MAP_FAILED):
        error = ctypes.get_errno()
        raise OSError(error, f"mapping a shared file: {os.strerror(error)}")
    region = (ctypes.c_ubyte * size).from_address(address)
    weakref.finalize(region, _libc.munmap, address, size)
    view = memoryview(region).cast("B")
    return [view[o : o + n] for o, n in parts]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


def opened(payload: CellPayload, kernel: int | None) -> CellPayload:
    """``payload`` from the kernel process ``kernel`` (an AF_UNIX peer), with the files of its
    shared names opened here through ``/proc``: each must be one of ours, a sealed memfd."""
    files = {c.shared.fd: c.shared.inode for c in payload.names if c.shared is not None}
    if not files:
        return payload
    if kernel is None:
        raise ValueError("shared names come from a kernel on this host alone")
    mine: dict[int, int] = {}
    try:
        for theirs, inode in files.items():
            mine[theirs] = os.open(f"/proc/{kernel}/fd/{theirs}", os.O_RDONLY | os.O_CLOEXEC)
            if not is_sealed(mine[theirs]):
                raise ValueError("a shared name's file is not a sealed memfd")
            if os.fstat(mine[theirs]).st_ino != inode:  # closed since, its number reused
                raise ValueError("a shared name's file is no longer the kernel's")
    except BaseException:
        for fd in mine.values():
            os.close(fd)
        raise
    return _with_fds(payload, lambda shared: mine[shared.fd])


def send_files(fd: int, files: Sequence[int], data: bytes | memoryview = b"\0") -> int:
    """Pass ``files`` on the stream socket ``fd`` with ``data`` (by default one byte, after a
    message); how much of ``data`` went (a non-blocking ``fd`` may take part of it, or raise
    ``BlockingIOError``: then the files did not go)."""
    with socket.socket(fileno=os.dup(fd)) as sock:
        return socket.send_fds(sock, [data], list(files))


def received(fd: int, payload: CellPayload) -> CellPayload:
    """``payload`` as read from the control socket ``fd``, with the files the agent sent after
    it: each shared name's ``InFile`` then holds its own descriptor."""
    count = len({c.shared.index for c in payload.names if c.shared is not None})
    if not count:
        return payload
    with socket.socket(fileno=os.dup(fd)) as sock:
        _, fds, _, _ = socket.recv_fds(sock, 1, count)
    if len(fds) != count:
        for each in fds:
            os.close(each)
        raise ConnectionError(f"the agent sent {len(fds)} of the cell's {count} shared names")
    return _with_fds(payload, lambda shared: fds[shared.index])


def _with_fds(payload: CellPayload, fd: Callable[[InFile], int]) -> CellPayload:
    """``payload`` with each shared name's descriptor ``fd`` gives for it."""
    names = tuple(
        c
        if c.shared is None
        else dataclasses.replace(c, shared=dataclasses.replace(c.shared, fd=fd(c.shared)))
        for c in payload.names
    )
    return dataclasses.replace(payload, names=names)


def loads(c: Captured) -> Any:
    """The value ``c`` holds: a shared name's arrays on a fresh copy-on-write mapping of its file
    (what a cell writes stays in this rank, and the next cell reads the notebook's value again)."""
    assert c.data is not None
    if c.shared is None:  # small buffers (in band to the rank): copied, as a pickle's would be
        fresh = [bytes(b) if memoryview(b).readonly else bytearray(b) for b in c.buffers]
        return values.loads(c.data, fresh)
    return values.loads(c.data, mapped(c.shared.fd, c.shared.parts))


def close(c: Captured) -> None:
    """Close a shared name's file (its mappings stay valid)."""
    if c.shared is not None and c.shared.fd >= 0:
        with contextlib.suppress(OSError):
            os.close(c.shared.fd)


class HeldNames:
    """The notebook names a rank was sent, by name: a large one arrives once, and later cells
    that read it get only its digest (``kernel/shippednames.py``) and load it from here."""

    def __init__(self) -> None:
        self._held: dict[str, Captured] = {}

    def value(self, c: Captured) -> Any:
        """``c``'s value: from what it carries, else from what this rank holds of its name."""
        if c.data is not None:
            old = self._held.get(c.name)
            self._held[c.name] = c
            if old is not None:
                close(old)
        return loads(self._held[c.name])
