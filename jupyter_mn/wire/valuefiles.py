"""A rank's big value to a kernel on its host: one sealed memfd, passed along, that the kernel maps.

Through the sockets a value is copied four times (into and out of the agent's socket, then the
kernel's); ipyparallel's crosses one socket. When a run comes from a kernel on the agent's host
(its cell stream is AF_UNIX: ``node/cellserver.py``), the agent asks its ranks for files
(``RunCell.values_by_file``): a rank writes each big pickled value of its reply (the cell's
value, ``--pull`` names, ``--all``) into a sealed memfd (``sharednames.sealed``) and sends the
files with the reply's first bytes (``SCM_RIGHTS``: ``send``); the agent takes them as it reads
(``Inbound``) and passes them on with its node's reply (``files_of``), and the kernel maps them
copy-on-write (``mapped``). One copy in all, the rank's, and no bytes through a socket. Where
the files cannot go on at once (the kernel's connection has bytes queued, or has gone), the agent
maps them and the bytes go as any reply's (``inline``).

A message's files are matched to it by inode, not by count: the files of a message that did not
decode are closed when a later message's files are taken.
"""

from __future__ import annotations

import array
import dataclasses
import os
import pickle
import socket
from collections.abc import Callable
from typing import Any

from . import sharednames
from .events import NodeReply, RankReply
from .frames import RELAY_MIN, encode, write_all
from .payload import InFile
from .values import Pickled

#: A value whose buffers come to this many bytes or more goes as a file.
MIN_BYTES = RELAY_MIN
#: A message carries at most this many files (Linux takes 253 in one; a reader makes room for
#: these): the rest of its big values go as bytes.
MAX_FILES = 64
_ANCILLARY = socket.CMSG_SPACE(MAX_FILES * array.array("i").itemsize)


def _each(reply: RankReply, change: Callable[[Pickled], Pickled]) -> RankReply:
    """``reply`` with ``change`` applied to each of its pickled values."""
    if reply.value is None and not reply.pulled:
        return reply
    value = change(reply.value) if reply.value is not None else None
    pulled = {n: change(p) for n, p in reply.pulled.items()} if reply.pulled else reply.pulled
    return dataclasses.replace(reply, value=value, pulled=pulled)


def _each_rank(node: NodeReply, change: Callable[[Pickled], Pickled]) -> NodeReply:
    return dataclasses.replace(node, ranks=tuple(_each(r, change) for r in node.ranks))


def _files(node: NodeReply) -> list[InFile]:
    values = (p for r in node.ranks for p in (r.value, *(r.pulled or {}).values()))
    return [p.file for p in values if p is not None and p.file is not None]


# ---- the rank
def send(fd: int, message: Any, by_file: bool = False) -> None:
    """Write ``message`` on the rank's blocking stream socket ``fd``; a reply's big values as
    files when ``by_file`` (the run asked for them)."""
    files: list[int] = []
    if by_file and isinstance(message, RankReply):
        message, files = _to_files(message)
    parts = encode(message)
    try:
        if files:
            parts[0] = parts[0][sharednames.send_files(fd, files, parts[0]) :]
        write_all(fd, parts)
    finally:
        for each in files:  # the message holds them now
            os.close(each)


def _to_files(reply: RankReply) -> tuple[RankReply, list[int]]:
    fds: list[int] = []

    def put(p: Pickled) -> Pickled:
        if len(fds) >= MAX_FILES or p.nbytes - len(p.data) < MIN_BYTES:
            return p
        try:
            fd, parts = sharednames.sealed("jupyter-mn-value", [b.raw() for b in p.buffers])
        except OSError:  # no memory for a file (a limit on shared memory): as bytes
            return p
        fds.append(fd)
        return Pickled(p.data, file=InFile(len(fds) - 1, parts, inode=os.fstat(fd).st_ino))

    try:
        return _each(reply, put), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


# ---- the reader: the agent (a rank's control socket) and the kernel (its cell stream)
class Inbound:
    """The files that came on the stream socket ``sock`` (not closed here), held until the
    message naming them takes them."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._held: list[tuple[int, int]] = []  # (inode, descriptor), as they came

    def recv_into(self, into: memoryview) -> int:
        """``sock.recv_into(into)``, keeping the files that come with the bytes."""
        n, ancillary, _, _ = self._sock.recvmsg_into([into], _ANCILLARY)
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
                self._held.extend((os.fstat(fd).st_ino, fd) for fd in fds)
        return n

    def take(self, inode: int) -> int | None:
        """The file of ``inode`` (the caller owns it now), or None when it did not come. Files
        that came before it and were not taken belong to no message any more: closed."""
        for i, (held, fd) in enumerate(self._held):
            if held == inode:
                for _, stale in self._held[:i]:
                    os.close(stale)
                del self._held[: i + 1]
                return fd
        return None

    def close(self) -> None:
        """Close the files no message took."""
        for _, fd in self._held:
            os.close(fd)
        self._held = []


def attached(reply: RankReply, inbound: Inbound) -> RankReply:
    """On the agent: ``reply`` as read, its files' descriptors the agent's own. A value whose
    file did not come (the agent was out of descriptors) is said in the reply's notes."""
    lost: list[str] = []

    def attach(p: Pickled) -> Pickled:
        if p.file is None:
            return p
        if (fd := inbound.take(p.file.inode)) is None:
            lost.append("a value's file did not reach its node agent (out of descriptors?)")
            return Pickled(pickle.dumps(None))
        return dataclasses.replace(p, file=dataclasses.replace(p.file, fd=fd))

    reply = _each(reply, attach)
    return dataclasses.replace(reply, notes=(*reply.notes, *lost)) if lost else reply


# ---- the agent, replying
def files_of(node: NodeReply) -> list[int]:
    """The descriptors of ``node``'s files (the agent's), to go with it."""
    return [f.fd for f in _files(node)]


def inline(node: NodeReply) -> NodeReply:
    """``node`` with its values' files mapped, to go as bytes (their descriptors closed)."""

    def read(p: Pickled) -> Pickled:
        if p.file is None:
            return p
        try:
            return Pickled(p.data, _mapped(p.file, p.file.fd))
        finally:
            os.close(p.file.fd)

    return _each_rank(node, read) if _files(node) else node


def close(node: NodeReply) -> None:
    """Close ``node``'s files (a reply that goes nowhere)."""
    for f in _files(node):
        os.close(f.fd)


# ---- the kernel
def mapped(node: NodeReply, inbound: Inbound) -> NodeReply:
    """On the kernel: ``node`` with its values' files, which came with it, mapped copy-on-write
    (a sealed file only: no one can change it under the value)."""

    def read(p: Pickled) -> Pickled:
        if p.file is None:
            return p
        fd = inbound.take(p.file.inode)
        if fd is None:
            raise ConnectionError("a value's file did not come with its node's reply")
        try:
            if not sharednames.is_sealed(fd):
                raise ConnectionError("a value's file is not a sealed memfd")
            return Pickled(p.data, _mapped(p.file, fd))
        finally:
            os.close(fd)

    return _each_rank(node, read) if _files(node) else node


def _mapped(file: InFile, fd: int) -> tuple[pickle.PickleBuffer, ...]:
    return tuple(map(pickle.PickleBuffer, sharednames.mapped(fd, file.parts)))
