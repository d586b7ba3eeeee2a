"""A ``Cluster``'s gang, kept warm between jobs.

Brought up on first use (all ranks or none), checked before each job (a re-forming after a
failure is waited for, and what it did is told with the next result), replaced when it broke,
and torn down, saying why, on close, on ``release``, after ``idle_timeout`` or at
``max_runtime`` (``lifetime.py``). A one-off job without it claims nodes of its own
(``claim_nodes``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..model.spec import ClusterSpec
from ..model.workdir import for_spec
from .clusterstate import ClusterState
from .lifetime import GangLifetime

if TYPE_CHECKING:
    from ..gang.base import Gang, Preflight
    from ..wire.events import OnEvent


class WarmGang:
    """The one gang of a cluster, or why there is none (``released``)."""

    def __init__(self, state: ClusterState) -> None:
        """``state``: the cluster's spec, lock, job slot and the names its ranks hold (which go
        with the gang)."""
        self._state = state
        self.gang: Gang | None = None
        #: why the gang was torn down ("" while up, or never started)
        self.released = ""
        #: what re-forming the gang told us, for the next result
        self.notes: list[str] = []
        self.lifetime = GangLifetime(
            state.lock, lambda: state.slot.busy, self.tear_down, self.stop_every_run
        )

    def up(self, on_event: OnEvent | None) -> Gang:
        """The warm gang, or a new one (all ranks or none)."""
        from ..gang import make_gang
        from .recorder import track

        spec = self._state.spec
        with self._state.lock:
            if self.warm() and self.gang is not None:
                return self.gang
            files = for_spec(spec)  # bad input: nothing started
            self.drop()
            gang = make_gang(spec)
            self.gang = gang
            track(self, gang)  # the job registry: sidebar, `jupyter mn`, cancel/release
            gang.start(on_event, preflight=preflight_of(spec), files=files)
            self.released = ""
            self.lifetime.started(spec, gang.core.usage)
            if not self._state.slot.busy:
                self.lifetime.idle(spec.idle_timeout)
            return gang

    def warm(self) -> bool:
        """Whether the gang is up and usable, once a re-forming after a failure has ended."""
        with self._state.lock:
            if self.gang is None:
                return False
            self.notes += self.gang.generations.settle()
            return self.gang.core.status.usable

    def job_ended(self) -> str:
        """A job ended: why the cost cap tore the gang down then ("" if it did not; else the
        idle release counts from now)."""
        expired = self.lifetime.take_expired()
        if expired:
            self.drop()
            self.released = f"torn down: {expired}"
        elif self.gang is not None:
            self.lifetime.idle(self._state.spec.idle_timeout)
        return expired

    def cancel(self, reason: str) -> bool:
        """Stop the running job, from any thread (the gang stays up); False if none runs."""
        gang = self.gang
        return gang is not None and gang.request_cancel(reason)

    def stop_every_run(self, reason: str) -> None:
        """Stop the running job, or the one that holds the cluster when its run starts, and any
        after it (the cost cap; the gang goes when the job ends)."""
        gang = self.gang
        if gang is not None:
            gang.stop_every_run(reason)

    def release(self, reason: str) -> None:
        """Free the gang now, from any thread: stop a running job, then every process."""
        self.cancel(reason)
        with self._state.lock:
            self._state.slot.wait_quiet()
            self.lifetime.idle(None)
            self.tear_down(reason)

    def tear_down(self, why: str) -> None:
        """Drop the gang, if there is one, saying why (``Cluster.status()`` shows it)."""
        with self._state.lock:
            if self.gang is not None:
                self.drop()
                self.released = why

    def drop(self) -> None:
        self.lifetime.gone()
        if self.gang is not None:
            self.gang.core.close()
            self.gang = None
        self._state.names.forget()

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
        gang.core.close()
