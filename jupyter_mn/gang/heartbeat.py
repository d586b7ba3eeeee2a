"""The kernel's heartbeat to its node agents, both ways a dead-man switch.

Agents stop their ranks when it has been silent for ``heartbeat_timeout`` (``node/kernelbeat.py``),
so a kernel killed with ``kill -9`` leaves nothing running, on any backend. The kernel in turn
watches the answers: a node that has not answered for ``liveness_timeout`` is unreachable (a cut
link or a frozen host sends no FIN and no RST, so no connection would fail for minutes), and
``on_silent`` says so once, until it answers again (docs/architecture.md, "Heartbeat and
liveness").
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from ..node.kernelbeat import CHECK_S, KERNEL_HEARTBEAT_S


class Heartbeat:
    """Calls ``heartbeat()`` on every agent every ``KERNEL_HEARTBEAT_S`` from a daemon thread,
    one call in flight per agent, and reports an agent silent for ``window`` seconds; ends when
    ``stop`` is set (the gang's teardown begins)."""

    def __init__(
        self,
        agents: Callable[[], list[Any]],
        window: float,
        on_silent: Callable[[int, float], None],
        stop: threading.Event,
    ) -> None:
        self._agents = agents
        self.window = window
        self._on_silent = on_silent
        self._stop = stop
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._beat, name="jupyter-mn-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        pending: dict[int, Any] = {}
        answered: dict[int, float] = {}
        reported: set[int] = set()
        due = 0.0
        while not self._stop.wait(CHECK_S):
            now = time.monotonic()
            beat = now >= due
            if beat:
                due = now + KERNEL_HEARTBEAT_S
            for node, agent in enumerate(self._agents()):
                answered.setdefault(node, now)
                call = pending.get(node)
                if call is not None and call.done():
                    del pending[node]
                    with contextlib.suppress(Exception):  # a lost agent: never answers again
                        call.result()
                        answered[node] = now
                        reported.discard(node)
                if beat and node not in pending:
                    with contextlib.suppress(Exception):  # known lost: cell runs report it
                        pending[node] = agent.heartbeat()
                silent = now - answered[node]
                if silent >= self.window and node not in reported:
                    reported.add(node)
                    self._on_silent(node, silent)
