"""The kernel's inbox: everything that reaches the thread running a cell, in arrival order.

Agent replies and interrupt requests are never dropped; events are bounded (when no cell runs
nobody reads them, and the newest are kept).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from dataclasses import dataclass
from typing import Any

_BACKLOG = 5000


@dataclass(frozen=True)
class Reply:
    node: int
    value: Any = None
    error: BaseException | None = None


@dataclass(frozen=True)
class InterruptRequest:
    """Posted to the inbox to stop the running cell from another thread (cancel, max runtime)."""

    reason: str
    #: the run it is meant for: a request that arrives after its run ended is ignored
    run: int


@dataclass(frozen=True)
class Message:
    """Something a job started on the nodes sent back besides replies (``%cluster exec``'s
    lines): kept like a reply, read by that job alone."""

    body: Any


#: What the inbox never drops.
_KEPT = (Reply, InterruptRequest, Message)


class Inbox:
    """Everything that reaches the kernel's main thread: agent replies and (bounded) events."""

    def __init__(self) -> None:
        self._queue: queue.Queue[Any] = queue.Queue()
        self._events = 0
        self._lock = threading.Lock()
        self.dropped = 0

    def put_event(self, event: Any) -> None:
        with self._lock:
            if self._events >= _BACKLOG:  # nobody is reading (no cell runs): keep the newest
                self.dropped += 1
                with contextlib.suppress(queue.Empty):
                    old = self._queue.get_nowait()
                    if isinstance(old, _KEPT):
                        self._queue.put(old)
                    else:
                        self._events -= 1
            self._events += 1
            self._queue.put(event)

    def put_reply(self, reply: Reply | InterruptRequest | Message) -> None:
        """Never dropped, unlike events."""
        self._queue.put(reply)

    def get(self, timeout: float) -> Any:
        item = self._queue.get(timeout=timeout)
        if not isinstance(item, _KEPT):
            with self._lock:
                self._events -= 1
        return item

    def empty(self) -> bool:
        return self._queue.empty()

    @staticmethod
    def is_event(item: Any) -> bool:
        """An event (shown to views), not a reply, a request or a job's message."""
        return not isinstance(item, _KEPT)
