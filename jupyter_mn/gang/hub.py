"""The gang's event fan-out: dask events and kernel-made events go to the main thread's inbox
(for the cell's view) and to listeners (the job registry), and the last telemetry is kept."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from ..wire.events import Displays, GpuSample, LogLines, OnEvent, TransportReport
from .inbox import Inbox

log = logging.getLogger(__name__)


def topics(gang_id: str) -> tuple[str, str]:
    """A gang's dask event topics: its agents' events, and its ``%cluster exec`` lines."""
    return f"jupyter-mn-{gang_id}", f"jupyter-mn-{gang_id}-exec"


class EventHub:
    """Where a gang's events go. Listeners run on the thread that delivers the event."""

    def __init__(self) -> None:
        self.inbox = Inbox()
        self._listeners: list[OnEvent] = []
        self._seen: dict[int, int] = {}
        #: the last LogLines sequence number delivered per node (any thread), and its condition
        self._delivered: dict[int, int] = {}
        self._delivery = threading.Condition()
        #: the latest transport report of each node
        self.transport: dict[int, TransportReport] = {}
        #: the latest GPU sample of each node
        self.gpus: dict[int, GpuSample] = {}

    def subscribe(self, listener: OnEvent) -> Callable[[], None]:
        """Call ``listener(event)`` (from a dask thread) for every event; returns unsubscribe."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def dispatch(self, event: Any) -> None:
        self.inbox.put_event(event)
        self._notify(event)
        if isinstance(event, (LogLines, Displays)):
            with self._delivery:
                self._delivered[event.node] = max(self._delivered.get(event.node, 0), event.seq)
                self._delivery.notify_all()

    def wait_delivered(self, last: dict[int, int], timeout: float) -> bool:
        """Until each node's events up to ``last[node]`` have arrived (False after ``timeout``)."""
        with self._delivery:
            return self._delivery.wait_for(
                lambda: all(self._delivered.get(n, 0) >= seq for n, seq in last.items()), timeout
            )

    def announce(self, event: Any, on_event: OnEvent | None) -> None:
        """An event made on the main thread (e.g. ``CellDone``): show it and tell listeners."""
        self.consume(event, on_event)
        self._notify(event)

    def _notify(self, event: Any) -> None:
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:
                log.exception("jupyter_mn event listener failed")

    def consume(self, event: Any, on_event: OnEvent | None) -> None:
        """Handle one event on the main thread: note log progress, then show it."""
        if isinstance(event, (LogLines, Displays)):  # one sequence per node
            self._seen[event.node] = max(self._seen.get(event.node, 0), event.seq)
        elif isinstance(event, TransportReport):
            self.transport[event.node] = event
        elif isinstance(event, GpuSample):
            self.gpus[event.node] = event
        if on_event is not None:
            on_event(event)

    def replay(self, on_event: OnEvent | None) -> None:
        """Show a new cell's view what each node last reported (agents do not repeat it)."""
        if on_event is not None:
            for node in sorted(self.gpus):
                on_event(self.gpus[node])
            for node in sorted(self.transport):
                on_event(self.transport[node])

    def seen(self, node: int) -> int:
        return self._seen.get(node, 0)
