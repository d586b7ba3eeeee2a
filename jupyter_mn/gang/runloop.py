"""The run loop: one job at a time on a gang, driven from the kernel's (main) thread.

docs/architecture.md, "The run protocol": the gang is RUNNING while a job runs, and one loop
applies interrupt requests, ``--timeout`` and Ctrl-C (as ``job.stop``), ticks the job's
escalation and shows events as they arrive.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

from ..errors import JupyterMNError
from .inbox import InterruptRequest
from .job import INTERRUPTED_BY_USER, Job
from .lifecycle import GangStatus

if TYPE_CHECKING:
    from .base import Gang

T = TypeVar("T")


class RunLoop:
    """Which job runs on a gang (its run id, which interrupt requests name), and its loop."""

    def __init__(
        self,
        gang: Gang,
        lock: threading.RLock,
        transition: Callable[[GangStatus], None],
    ) -> None:
        """``lock``: the gang's; ``transition``: the gang's one way to change its state."""
        self._gang, self._lock, self._transition = gang, lock, transition
        self._runs = 0
        #: the id of the job running now (0: none)
        self.current = 0

    @contextlib.contextmanager
    def running(self) -> Iterator[int]:
        """``Gang.running``: RUNNING (a warm gang; nodes claimed for one job have no ranks and
        keep their state), then READY again unless the job moved the gang on."""
        gang = self._gang
        gang.settle()
        with self._lock:
            if self.current:
                raise JupyterMNError(f"gang {gang.id} is already running run {self.current}")
            if gang.status.usable:
                self._transition(GangStatus.RUNNING)
            elif gang.ranks or gang.status != GangStatus.SCHEDULING:
                raise JupyterMNError(f"gang {gang.id} is {gang.status.value}: {gang.detail}")
            self._runs += 1
            self.current = self._runs
        try:
            yield self.current
        finally:
            with self._lock:
                self.current = 0
                if gang.status == GangStatus.RUNNING:
                    self._transition(GangStatus.READY)
                if gang.preemption is not None:  # any job (a script, a command): its node goes
                    gang.close(broken=f"node {gang.preemption.node} was preempted", wait=False)

    def run(self, job: Job[T], timeout: float | None) -> T:
        """``Gang.run``: ``job`` on the nodes until it is done, on the calling thread."""
        hub = self._gang.hub
        with self.running() as run_id:
            job.run_id = run_id
            hub.announce(job.what(), job.on_event)
            job.start()
            deadline = time.monotonic() + timeout if timeout else None
            while not job.done():
                try:
                    now = time.monotonic()
                    if deadline is not None and now - job.paused_for >= deadline:
                        deadline = None
                        job.stop(f"--timeout {timeout:g} s reached", by_user=True)
                    if job.tick(now):
                        break
                    try:
                        item = hub.inbox.get(timeout=job.tick_s)
                    except queue.Empty:
                        continue
                    if isinstance(item, InterruptRequest):
                        if item.run == run_id:  # else: meant for a run that is over
                            job.stop(item.reason, by_user=True, again=True)
                    elif job.take(item):
                        job.stop("another rank failed", by_user=False)
                except KeyboardInterrupt:
                    job.stop(INTERRUPTED_BY_USER, by_user=True, again=True)
            job.settle()
        return job.finish()

    def request_cancel(self, reason: str) -> bool:
        """``Gang.request_cancel``: an interrupt request for the running job; False if none."""
        with self._lock:
            if not self.current:
                return False
            self._gang.hub.inbox.put_reply(InterruptRequest(reason, self.current))
            return True
