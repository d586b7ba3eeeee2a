"""The kernel's heartbeat to its node agents: while it beats, the kernel is alive.

Agents stop their ranks when it has been silent for ``heartbeat_timeout`` (``node/watchdog.py``),
so a kernel killed with ``kill -9`` leaves nothing running, on any backend.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from ..node.watchdog import HEARTBEAT_S


class Heartbeat:
    """Calls ``heartbeat()`` on every agent every ``HEARTBEAT_S`` from a daemon thread."""

    def __init__(self, agents: Callable[[], list[Any]]) -> None:
        self._agents = agents
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._beat, name="jupyter-mn-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            for agent in self._agents():
                with contextlib.suppress(Exception):  # a lost agent is reported by cell runs
                    agent.heartbeat()

    def stop(self) -> None:
        self._stop.set()
