"""Abort a gloo process group's connections, so peers blocked on this rank fail at once.

gloo closes its sockets only when the last reference to the group goes, and a failed collective's
frames or a user's ``DistributedDataParallel`` model keep one; ``abort()`` does not close them
either (measured with torch 2.13). So the rank remembers which sockets ``init_process_group``
opened and shuts the connected ones down itself: a peer sees "Connection closed by peer" within
a millisecond. Listening sockets are left alone (gloo aborts the process when its listener
fails), and so are connections to the c10d store, which outlives the group.
"""

from __future__ import annotations

import contextlib
import os
import socket

_FD_DIR = "/proc/self/fd"


def open_sockets() -> dict[int, str]:
    """This process's socket descriptors and their inodes (``socket:[N]``)."""
    found: dict[int, str] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir(_FD_DIR):
            with contextlib.suppress(OSError):
                target = os.readlink(f"{_FD_DIR}/{name}")
                if target.startswith("socket:"):
                    found[int(name)] = target
    return found


def opened_since(before: dict[int, str]) -> dict[int, str]:
    return {fd: inode for fd, inode in open_sockets().items() if before.get(fd) != inode}


def shut_down(sockets: dict[int, str], spare_port: int) -> int:
    """Shut down the connected TCP sockets among ``sockets`` (still the same inodes); count them.

    ``spare_port``: connections from or to this port (the c10d store) are left open.
    """
    now = open_sockets()
    count = 0
    for fd, inode in sockets.items():
        if now.get(fd) != inode:
            continue  # closed since, and the number perhaps reused
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        with sock, contextlib.suppress(OSError):
            if sock.type != socket.SOCK_STREAM or sock.family not in (
                socket.AF_INET,
                socket.AF_INET6,
            ):
                continue
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                continue
            if spare_port in (sock.getsockname()[1], sock.getpeername()[1]):
                continue
            sock.shutdown(socket.SHUT_RDWR)
            count += 1
    return count
