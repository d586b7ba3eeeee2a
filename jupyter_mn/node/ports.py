"""A port for a listener that starts seconds after it is chosen (rank 0's TCPStore).

A port from ``bind((host, 0))`` comes from the kernel's ephemeral range, the range every new
outgoing connection on the node also takes its local port from: in the seconds before rank 0
listens (process start, importing torch) one of them may take it, and rank 0 fails with
EADDRINUSE (seen in a CI run). A free port below that range is taken only by a process that asks
for it by number.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: The IANA dynamic range's start: where macOS and Windows begin their ephemeral ports.
_IANA_EPHEMERAL = 49152
#: Below this, ports are likelier to belong to a service started later on a fixed number.
_LOWEST = 10000
_TRIES = 50


def listen_port(host: str) -> int:
    """A port on ``host`` that nothing listens on or connects from now, outside the ephemeral
    range where there is room; else one the OS assigns."""
    start = ephemeral_start()
    candidates = range(_LOWEST, max(start, _LOWEST))
    for port in random.sample(candidates, min(_TRIES, len(candidates))):
        if is_free(host, port):
            return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def ephemeral_start() -> int:
    """The first port of this machine's ephemeral range."""
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _IANA_EPHEMERAL


def is_free(host: str, port: int) -> bool:
    """Whether ``port`` on ``host`` can be bound now."""
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True
