"""A SIGTERM to a node process is a preemption notice, not a stop: the grace period.

Slurm (a preemption, ``scontrol requeue``, ``--signal=TERM@S`` before the time limit) and
Kubernetes (a pod's deletion or eviction) send SIGTERM and kill later. While its agent lives,
the node keeps running: the agent tells the kernel (which tells every node) and its own ranks,
and only at the deadline stops them and closes its worker. torchrun instead turns the SIGTERM
into a kill of its workers 30 s later, whatever the grace (pytorch#119856).

The handler is a plain ``signal.signal`` one (the worker's loop runs on the main thread), so
the one it replaces (``dask spec``'s, the pod's) is put back when the agent stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..wire.events import PreemptCause, Preemption


def cause_of(env: Mapping[str, str]) -> PreemptCause:
    """Who sends a node process SIGTERM, from where it runs."""
    if "SLURM_JOB_ID" in env:
        return PreemptCause.SLURM
    if "KUBERNETES_SERVICE_HOST" in env:
        return PreemptCause.POD
    return PreemptCause.SIGNAL


class GracePeriod:
    """Turns this process's SIGTERM into a ``Preemption`` notice (``on_notice``) and calls
    ``on_deadline`` ``grace`` seconds later; a second SIGTERM changes nothing."""

    def __init__(
        self,
        node: int,
        grace: float,
        on_notice: Callable[[Preemption], None],
        on_deadline: Callable[[], Any],
    ) -> None:
        self.node, self.grace = node, grace
        self._on_notice, self._on_deadline = on_notice, on_deadline
        self.notice: Preemption | None = None
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._stopping: asyncio.Future[Any] | None = None
        self._previous: Any = None
        self._installed = False

    def install(self) -> bool:
        """Handle SIGTERM from now on; False where this is not the main thread (a worker in a
        thread of another program: its SIGTERM stays that program's)."""
        try:
            self._previous = signal.signal(signal.SIGTERM, self._signalled)
        except ValueError:
            return False
        self._installed = True
        return True

    def _signalled(self, signum: int, frame: Any) -> None:
        self._loop.call_soon_threadsafe(self.begin, signal.Signals(signum).name)

    def begin(self, name: str = "SIGTERM") -> None:
        """The notice: now, on the loop."""
        if self.notice is not None:
            return
        self.notice = Preemption(self.node, cause_of(os.environ), time.time() + self.grace, name)
        self._timer = self._loop.call_later(self.grace, self._expire)
        self._on_notice(self.notice)

    def _expire(self) -> None:
        self._timer = None
        self._stopping = asyncio.ensure_future(self._on_deadline())

    def close(self) -> None:
        """Cancel the deadline and give SIGTERM back to the handler this one replaced."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._installed:
            self._installed = False
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signal.SIGTERM, self._previous)

    def hand_on(self) -> None:
        """Once the node has stopped: a SIGTERM heard meanwhile goes to the handler it was meant
        for (the worker closes, as it would have at once without an agent)."""
        if self.notice is not None and not self._installed:
            signal.raise_signal(signal.SIGTERM)
