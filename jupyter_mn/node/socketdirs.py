"""The directories of the agents' AF_UNIX sockets (``cellserver.py``): one each, of mode 0700.

An agent removes its own when it closes; one killed (SIGKILL, a lost node) cannot, so each
agent that starts removes this user's that nobody listens on any more: a socket without its
listener refuses a connection at once (``ECONNREFUSED``), where a live agent's accepts it or is
busy. A directory without its socket yet (an agent between making it and listening) is left.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import tempfile

PREFIX = "jupyter-mn-cells-"
#: The socket's name in its directory.
SOCKET = "s"


def made() -> str:
    """A new directory of mode 0700 for an agent's socket, after sweeping the stale ones."""
    sweep()
    return tempfile.mkdtemp(prefix=PREFIX)


def sweep() -> None:
    """Remove this user's socket directories whose agent has gone."""
    root = tempfile.gettempdir()
    with contextlib.suppress(OSError):
        names = [n for n in os.listdir(root) if n.startswith(PREFIX)]
        for name in names:
            folder = os.path.join(root, name)
            if _stale(folder):
                shutil.rmtree(folder, ignore_errors=True)


def _stale(folder: str) -> bool:
    try:
        st = os.lstat(folder)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.setblocking(False)  # a live agent's full backlog must not hold this one's start
        try:
            probe.connect(os.path.join(folder, SOCKET))
        except ConnectionRefusedError:
            return True
        except OSError:  # a live agent, busy; or no socket yet
            return False
    return False
