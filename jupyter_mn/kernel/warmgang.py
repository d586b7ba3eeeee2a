"""A ``Cluster``'s gang, kept warm between jobs.

Brought up on first use (all ranks or none), checked before each job (a re-forming after a
failure is waited for, and what it did is told with the next result), replaced when it broke,
and torn down, saying why, on close, on ``release``, after ``idle_timeout`` or at
``max_runtime`` (``lifetime.py``). A one-off job without it claims nodes of its own
(``claim_nodes``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from .lifetime import GangLifetime
from .workdir import for_spec

if TYPE_CHECKING:
    from ..gang.base import Gang, Preflight
    from ..wire.events import OnEvent
    from .cluster import Cluster
    from .spec import ClusterSpec


class WarmGang:
    """The one gang of a cluster, or why there is none (``released``)."""

    def __init__(
        self,
        cluster: Cluster,
        lock: threading.RLock,
        busy: Callable[[], bool],
        forget: Callable[[], None],
    ) -> None:
        """``lock``: the cluster's; ``busy``: whether a job runs; ``forget``: what goes with the
        gang (the names its ranks hold)."""
        self._cluster, self._lock, self._busy, self._forget = cluster, lock, busy, forget
        self.gang: Gang | None = None
        #: why the gang was torn down ("" while up, or never started)
        self.released = ""
        #: what re-forming the gang told us, for the next result
        self.notes: list[str] = []
        self.lifetime = GangLifetime(lock, busy, self.tear_down, self.cancel)

    def up(self, on_event: OnEvent | None) -> Gang:
        """The warm gang, or a new one (all ranks or none)."""
        from ..gang import make_gang
        from .recorder import track

        spec = self._cluster.spec
        with self._lock:
            if self.warm() and self.gang is not None:
                return self.gang
            files = for_spec(spec)  # bad input: nothing started
            self.drop()
            gang = make_gang(spec)
            self.gang = gang
            track(self._cluster, gang)  # the job registry: sidebar, `jupyter mn`, cancel/release
            gang.start(on_event, preflight=preflight_of(spec), files=files)
            self.released = ""
            self.lifetime.started(spec, gang.usage)
            if not self._busy():
                self.lifetime.idle(spec.idle_timeout)
            return gang

    def warm(self) -> bool:
        """Whether the gang is up and usable, once a re-forming after a failure has ended."""
        with self._lock:
            if self.gang is None:
                return False
            self.notes += self.gang.settle()
            return self.gang.status.usable

    def job_ended(self) -> str:
        """A job ended: why the cost cap tore the gang down then ("" if it did not; else the
        idle release counts from now)."""
        expired = self.lifetime.take_expired()
        if expired:
            self.drop()
            self.released = f"torn down: {expired}"
        elif self.gang is not None:
            self.lifetime.idle(self._cluster.spec.idle_timeout)
        return expired

    def cancel(self, reason: str) -> bool:
        """Stop the running job, from any thread (the gang stays up); False if none runs."""
        gang = self.gang
        return gang is not None and gang.request_cancel(reason)

    def tear_down(self, why: str) -> None:
        """Drop the gang, if there is one, saying why (``Cluster.status()`` shows it)."""
        with self._lock:
            if self.gang is not None:
                self.drop()
                self.released = why

    def drop(self) -> None:
        self.lifetime.gone()
        if self.gang is not None:
            self.gang.close()
            self.gang = None
        self._forget()

    def close(self) -> None:
        self.lifetime.close()
        self.drop()


def preflight_of(spec: ClusterSpec) -> Preflight | None:
    """The doctor's check of new nodes, when ``spec`` asks for it."""
    if not spec.runs_preflight:
        return None
    from ..doctor import preflight

    return preflight


@contextlib.contextmanager
def claim_nodes(spec: ClusterSpec, on_event: OnEvent | None, files: bool) -> Iterator[Gang]:
    """Nodes claimed for one job alone (no ranks), released after it; ``files=False``: without
    the notebook's files."""
    from ..gang import make_gang

    selected = for_spec(spec) if files else None  # bad input: nothing started
    gang = make_gang(spec)
    try:
        gang.start(on_event, ranks=False, preflight=preflight_of(spec), files=selected)
        yield gang
    finally:
        gang.close()
