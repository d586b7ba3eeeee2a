"""A node agent's side, for tests of what runs on its loop (pipes, rank handles): the loop, on a
thread of its own, and a recorder of what they hand the agent (``node/nodelink.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from jupyter_mn.wire.events import DisplayOutput

T = TypeVar("T")


def on_loop_thread(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a fresh loop in a thread of its own, as the agent's loop runs on its
    worker's thread (and whatever an earlier test left on the main thread cannot interfere)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


class Recorder:
    """The agent's side of the seam, recording the lines a pipe reader hands it (made on the
    loop)."""

    node = 0

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []
        self.partials: list[tuple[str, str]] = []
        self.changed = asyncio.Event()

    def log(self, rank: int, stream: str, line: str) -> None:
        self.lines.append((stream, line))
        self.changed.set()

    def partial(self, rank: int, stream: str, text: str) -> None:
        self.partials.append((stream, text))
        self.changed.set()

    def display(self, rank: int, output: DisplayOutput) -> None:
        raise AssertionError("no test here displays anything")

    def rank_state(self, rank: int, state: str, detail: str = "", **_: Any) -> None:
        pass
