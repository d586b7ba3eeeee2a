"""Where a node agent's cell stream listens: a TCP port on the worker's host, and a socket in a
directory of the user's own (mode 0700) for a kernel on the same host.

On the same host the stream needs no TLS: only this user (and root) may enter the directory, so
nothing else can connect, and a value's bytes then cross as a memory copy each way rather than
being encrypted and decrypted (docs/architecture.md, "The cell stream").
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field


@functools.cache
def network_here() -> str:
    """This process's network: its network namespace on this boot. Two processes that share it
    are one host to each other; a network namespace of its own (a container, a test host) is
    another, even on one machine with one file system, and is reached over its network."""
    with open("/proc/sys/kernel/random/boot_id") as boot:
        return f"{boot.read().strip()}:{os.stat('/proc/self/ns/net').st_ino}"


@dataclass(frozen=True)
class CellEndpoint:
    """A node agent's cell stream: ``port`` on its host; ``path``, its AF_UNIX socket (None
    where it has none), for a kernel in the same network (``network``, ``network_here()``)."""

    port: int
    path: str | None = None
    network: str = field(default_factory=network_here)

    def local(self) -> bool:
        """Whether a kernel here takes the AF_UNIX socket."""
        return self.path is not None and self.network == network_here()
