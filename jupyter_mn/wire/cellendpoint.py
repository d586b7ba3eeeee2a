"""Where a node agent's cell stream listens: a TCP port on the worker's host, and a socket in a
directory of the user's own (mode 0700) for a kernel on the same host.

On the same host the stream needs no TLS: only this user (and root) may enter the directory, so
nothing else can connect, and a value's bytes then cross as a memory copy each way rather than
being encrypted and decrypted (docs/architecture.md, "The cell stream").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CellEndpoint:
    """A node agent's cell stream: ``port`` on its host; ``path``, its AF_UNIX socket (None
    where it has none), which only a kernel on that host finds."""

    port: int
    path: str | None = None
