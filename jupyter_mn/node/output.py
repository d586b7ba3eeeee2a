"""A node's output to the kernel: its ranks' lines, unfinished lines and displays as events.

The output half of ``NodeLink`` (``nodelink.py``): rank handles and a script run hand it what their
ranks write and show, and it publishes events on the gang's dask topic, in order. Lines arriving
within ``BATCH_S`` share one ``LogLines``; the lines the ranks are still writing (progress bars)
go with a batch every ``PARTIAL_S`` at most; rank 0's displays go at a bounded rate and size.
Everything runs on the worker's event loop, so its buffers need no lock; ``call_soon`` is the
way in from another thread (telemetry's look).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

from ..wire.events import (
    DisplayOutput,
    Displays,
    LogLines,
    RankPaused,
    RankState,
    RankStatus,
    to_msg,
)
from .displaybatch import DisplayBatch

#: Lines arriving within this window share one event.
BATCH_S = 0.005
#: A line still being written (a progress bar redrawn with \r) is sent at most this often per
#: node while it changes (5 updates/s: smooth, and a small share of the IOPub budget) ...
PARTIAL_S = 0.2
#: ... and again this long after it last went out while it stands unchanged, so a view that
#: writes it seldom (the text view) still gets to show its latest state.
PARTIAL_REPEAT_S = 2.0
#: Rank 0's displays go out at most this often (a plot redrawn every step: 5 frames/s) ...
DISPLAY_S = 0.2
#: ... and within this many bytes a second (a quarter of Jupyter's IOPub data limit, 1 MB/s).
DISPLAY_BYTES_PER_S = 250_000


class NodeOutput:
    """Batches a node's output into events and publishes them (``NodeLink``'s implementation)."""

    def __init__(self, node: int, publish: Callable[[dict[str, Any]], None]) -> None:
        self.node = node
        self._send = publish
        #: each output line also goes here (telemetry reads NCCL's), once ranks start
        self.on_line: Callable[[str], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._closing = False
        self._buffer: list[tuple[int, str, str]] = []
        self._flush_armed = False
        #: the unfinished line of each (rank, stream), "" once cleared until that is sent
        self._partials: dict[tuple[int, str], str] = {}
        self._partial_changed = False
        self._partial_timer: asyncio.TimerHandle | None = None
        self._partial_sent = 0.0
        #: rank display calls not sent yet, per rank, and when the next batch may go
        self._displays: dict[int, DisplayBatch] = {}
        self._display_armed = False
        self._display_timer: asyncio.TimerHandle | None = None
        self._display_next = 0.0
        self._seq = 0

    def begin(self, loop: asyncio.AbstractEventLoop) -> None:
        """From now on events go through ``loop`` (the worker's), where this is called."""
        self._loop, self._loop_thread = loop, threading.get_ident()

    def call_soon(self, fn: Any, *args: Any) -> None:
        """``fn(*args)`` on the loop, after what is queued there (from any thread)."""
        assert self._loop is not None
        if threading.get_ident() == self._loop_thread:  # no wake-up of the loop needed
            self._loop.call_soon(fn, *args)
            return
        with contextlib.suppress(RuntimeError):  # loop closed while the worker shuts down
            self._loop.call_soon_threadsafe(fn, *args)

    def publish(self, event: Any) -> None:
        # Every event goes through the loop's callback queue, so events keep their order.
        self.call_soon(self._send, to_msg(event))

    # ---- lines
    def log(self, rank: int, stream: str, line: str) -> None:
        if self.on_line is not None:
            self.on_line(line)
        self._buffer.append((rank, stream, line))
        self._partials.pop((rank, stream), None)  # the line is done: views drop its partial
        if self._flush_armed:
            return
        self._flush_armed = True
        # the window counts from this first line, not from when the loop gets to it
        assert self._loop is not None
        self.call_soon(self._loop.call_at, self._loop.time() + BATCH_S, self.flush)

    def partial(self, rank: int, stream: str, text: str) -> None:
        self._partials[(rank, stream)] = text
        if self._partial_changed:
            return
        self._partial_changed = True
        self.call_soon(self._schedule_partials, PARTIAL_S)

    def _schedule_partials(self, after: float) -> None:
        """Send the unfinished lines ``after`` seconds after they last went out (not sooner
        than a line batch would); an earlier due time wins over a later one."""
        assert self._loop is not None
        if self._closing:  # close() sent the last event: nothing may follow it
            return
        due = max(self._loop.time() + BATCH_S, self._partial_sent + after)
        timer = self._partial_timer
        if timer is not None:
            if timer.when() <= due:
                return
            timer.cancel()
        self._partial_timer = self._loop.call_at(due, self._send_partials)

    def _send_partials(self) -> None:
        assert self._loop is not None
        self._partial_timer, self._partial_sent = None, self._loop.time()
        self.flush(partials=True)
        standing = bool(self._partials)
        if standing:
            self._schedule_partials(PARTIAL_REPEAT_S)

    def flush(self, always: bool = False, partials: bool = False) -> int:
        """Publish buffered lines as one ``LogLines`` (``always``: even none, as a last event;
        ``partials``: with the unfinished lines); return the last sequence number sent."""
        lines, self._buffer = self._buffer, []
        self._flush_armed = False
        unfinished: tuple[tuple[int, str, str], ...] = ()
        if partials:
            self._partial_changed = False
            unfinished = tuple((r, s, t) for (r, s), t in sorted(self._partials.items()))
            self._partials = {k: t for k, t in self._partials.items() if t}
        if lines or unfinished or always:
            items: list[tuple[int, str, list[str]]] = []
            for rank, stream, text in lines:
                if items and items[-1][0] == rank and items[-1][1] == stream:
                    items[-1][2].append(text)
                else:
                    items.append((rank, stream, [text]))
            self._seq += 1
            self.publish(
                LogLines(
                    self.node,
                    self._seq,
                    tuple((r, s, tuple(t)) for r, s, t in items),
                    unfinished,
                )
            )
        return self._seq

    # ---- displays
    def display(self, rank: int, output: DisplayOutput) -> None:
        self._displays.setdefault(rank, DisplayBatch()).add(output)
        if self._display_armed:
            return
        self._display_armed = True
        self.call_soon(self._schedule_displays)

    def _schedule_displays(self) -> None:
        assert self._loop is not None
        if self._closing:  # close() sent them before its last event
            return
        due = max(self._loop.time() + BATCH_S, self._display_next)
        self._display_timer = self._loop.call_at(due, self.send_displays)

    def send_displays(self) -> None:
        """Publish the pending display calls (from the loop: when due, and before a reply)."""
        assert self._loop is not None
        if self._display_timer is not None:
            self._display_timer.cancel()
            self._display_timer = None
        size = 0
        self._display_armed = False
        batches, self._displays = self._displays, {}
        for rank, batch in sorted(batches.items()):
            self._seq += 1
            self.publish(Displays(self.node, self._seq, rank, tuple(batch.outputs)))
            size += batch.size
        self._display_next = self._loop.time() + max(DISPLAY_S, size / DISPLAY_BYTES_PER_S)

    # ---- states
    def rank_state(
        self,
        rank: int,
        state: RankStatus,
        detail: str = "",
        run: int = 0,
        primary: bool = False,
    ) -> None:
        # after the lines flushed before it, before those flushed after it
        self.publish(RankState(self.node, rank, state, detail, run, primary))

    def paused(self, rank: int, run: int, where: str) -> None:
        self.publish(RankPaused(self.node, rank, run, where))

    def close(self) -> int:
        """The last event: what is pending, then an empty batch whose number is returned (once
        the kernel has it, it can drop the topic). Nothing is published after it."""
        self._closing = True
        if self._partial_timer is not None:  # the ranks' lines ended with them
            self._partial_timer.cancel()
        self.send_displays()
        return self.flush(always=True)
