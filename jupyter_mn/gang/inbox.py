"""The kernel's inbox: everything that reaches the thread running a cell, in arrival order.

Agent replies and interrupt requests are never dropped; events are bounded (when no cell runs
nobody reads them, and the newest are kept).

The waiting thread also reads the sockets ``watch``ed here (the cell streams,
``cellstream.py``) itself, in a selector with a wake-up socket that a ``put`` from another
thread writes to: a reply then wakes the thread that waits for it directly, not a reader thread
that hands it over (docs/architecture.md, "The cell stream").
"""

from __future__ import annotations

import contextlib
import queue
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
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


class _Sockets:
    """The watched sockets and the wake-up pair, in one selector."""

    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = socket.socketpair()
        for end in (self.wake_r, self.wake_w):
            end.setblocking(False)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        self.closed = False

    def wake(self) -> None:
        with contextlib.suppress(OSError):  # full (a wake-up is pending anyway)
            self.wake_w.send(b"\0")

    def read(self, timeout: float) -> None:
        """Wait for a watched socket or a wake-up, then run the callbacks of those ready."""
        for key, _ in self.selector.select(max(timeout, 0)):
            if key.data is None:
                with contextlib.suppress(OSError):
                    self.wake_r.recv(4096)
            else:
                key.data()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.selector.close()
            self.wake_r.close()
            self.wake_w.close()


class Inbox:
    """Everything that reaches the kernel's main thread: agent replies and (bounded) events."""

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._events = 0
        self._lock = threading.Lock()
        self._added = threading.Condition(self._lock)
        #: while a socket is watched: the selector a waiting thread reads them in
        self._sockets: _Sockets | None = None
        #: a thread is reading the sockets (in the selector, or running callbacks): one at a
        #: time, and the selector is closed by it, not under it
        self._reader = False
        #: the reader was sent a wake-up it has not read yet
        self._woken = False
        self.dropped = 0

    def put_event(self, event: Any) -> None:
        with self._lock:
            if self._events >= _BACKLOG:  # nobody is reading (no cell runs): keep the newest
                self.dropped += 1
                oldest = next(i for i, item in enumerate(self._items) if not _is_kept(item))
                del self._items[oldest]
                self._events -= 1
            self._events += 1
            self._append(event)

    def put_reply(self, reply: Reply | InterruptRequest | Message) -> None:
        """Never dropped, unlike events."""
        with self._lock:
            self._append(reply)

    def _append(self, item: Any) -> None:
        self._items.append(item)
        self._added.notify()
        self._wake_reader()

    def _wake_reader(self) -> None:
        if self._reader and not self._woken and self._sockets is not None:
            self._woken = True
            self._sockets.wake()

    def watch(self, sock: socket.socket, on_readable: Callable[[], None]) -> None:
        """Call ``on_readable()`` on the waiting thread whenever ``sock`` has data (or closed)."""
        with self._lock:
            if self._sockets is None:
                self._sockets = _Sockets()
            self._sockets.selector.register(sock, selectors.EVENT_READ, on_readable)
            self._added.notify_all()  # a thread waiting on the condition becomes the reader
            self._wake_reader()  # a reader selects again, with this socket

    def unwatch(self, sock: socket.socket) -> None:
        """Stop watching ``sock`` (before closing it); the last one closes the selector (its
        reader does, when there is one)."""
        with self._lock:
            if self._sockets is None:
                return
            try:
                self._sockets.selector.unregister(sock)
            except (KeyError, ValueError):
                return
            if len(self._sockets.selector.get_map()) == 1:  # the wake-up socket alone
                self._wake_reader()  # back to the condition
                sockets, self._sockets = self._sockets, None
                if not self._reader:
                    sockets.close()

    def get(self, timeout: float) -> Any:
        """The oldest item, waiting up to ``timeout`` s (reading the watched sockets meanwhile);
        ``queue.Empty`` when none came."""
        deadline = time.monotonic() + timeout
        polled = False  # the sockets were read at least once (timeout 0 reads them too)
        while True:
            reading: _Sockets | None = None
            try:  # a Ctrl-C anywhere in here leaves no reader flag set
                with self._lock:
                    if self._items:
                        return self._take()
                    remaining = deadline - time.monotonic()
                    if self._sockets is None or self._reader:  # none, or another thread reads
                        if remaining <= 0:
                            raise queue.Empty
                        self._added.wait(remaining)
                        continue
                    if remaining <= 0 and polled:
                        raise queue.Empty
                    reading = self._sockets
                    self._reader, self._woken = True, False
                reading.read(remaining)
            finally:
                if reading is not None:
                    with self._lock:
                        self._reader = False
                        self._added.notify_all()  # a thread waiting meanwhile reads next
                        if reading is not self._sockets:  # its last socket went meanwhile
                            reading.close()
            polled = True

    def _take(self) -> Any:
        item = self._items.popleft()
        if not _is_kept(item):
            self._events -= 1
        return item

    def empty(self) -> bool:
        return not self._items

    @staticmethod
    def is_event(item: Any) -> bool:
        """An event (shown to views), not a reply, a request or a job's message."""
        return not _is_kept(item)


def _is_kept(item: Any) -> bool:
    return isinstance(item, _KEPT)
