"""``Cluster``: the public API. The magic, papermill runs, the CLI and the tests all go through it.

A ``Cluster`` owns at most one gang: started on first use, kept warm between cells, released
after ``idle_timeout`` or on close, replaced when it breaks. ``session(spec)`` keeps one
"current" cluster per kernel for the magics: same gang shape → reuse, other shape → replace.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .cell import CellPayload, Shipper, bound_names, compile_cell
from .result import LOST, CellResult
from .spec import ClusterSpec

_live: weakref.WeakSet[Cluster] = weakref.WeakSet()


class Cluster:
    """A gang of ``nodes × gpus`` torch.distributed ranks you run code on.

    >>> with Cluster(nodes=2, gpus=2) as c:                     # doctest: +SKIP
    ...     c.run("import torch.distributed as dist; dist.get_world_size()").value
    4
    """

    def __init__(self, spec: ClusterSpec | None = None, **options: Any) -> None:
        self.spec = spec.replace(**options) if spec else ClusterSpec.build(options)
        self.gang: Any = None
        self.cells = 0
        self.released = ""
        self.last_used = time.time()
        self._shipper = Shipper()
        self._rank_defined: set[str] = set()
        self._lock = threading.RLock()
        self._idle_timer: threading.Timer | None = None
        _live.add(self)

    # ---- lifecycle
    def up(self, on_event: Callable[[Any], None] | None = None) -> Any:
        """Bring the gang up (all ranks or none); a no-op when it is already up."""
        from .gang import make_gang
        from .recorder import track

        with self._lock:
            if self.gang is not None and self.gang.status.usable:
                return self.gang
            self._drop_gang()
            gang = make_gang(self.spec)
            self.gang = gang
            track(self, gang)  # the job registry: sidebar, `jupyter mn`, cancel/release requests
            gang.start(on_event)
            self.released = ""
            self._arm_idle_timer()
            return gang

    def close(self) -> None:
        """Stop every process of the gang. Safe to call twice."""
        with self._lock:
            self._cancel_idle_timer()
            self._drop_gang()

    def cancel(self, reason: str) -> bool:
        """Stop the running cell, from any thread (the gang stays up); False if none runs."""
        gang = self.gang
        return gang is not None and gang.request_cancel(reason)

    def release(self, reason: str) -> None:
        """Free the gang now, from any thread: stop a running cell, then every process."""
        self.cancel(reason)
        with self._lock:
            self._cancel_idle_timer()
            if self.gang is not None:
                self._drop_gang()
                self.released = reason

    def _drop_gang(self) -> None:
        if self.gang is not None:
            self.gang.close()
            self.gang = None
        self._shipper.forget()
        self._rank_defined.clear()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- cells
    def run(
        self,
        code: str,
        *,
        namespace: Mapping[str, Any] | None = None,
        cell_id: int | None = None,
        return_all: bool = False,
        pull: Iterable[str] = (),
        push: Iterable[str] = (),
        timeout: float | None = None,
        seed: int | None = None,
        retries: int | None = None,
        on_event: Callable[[Any], None] | None = None,
    ) -> CellResult:
        """Run ``code`` on every rank; rank 0's value is ``.value`` (``.unwrap()`` raises).

        ``namespace`` is where notebook names the code reads are taken from (the magic passes
        the kernel's ``user_ns``); nothing is captured without it.
        """
        from .gang.run import run_cell

        with self._lock:
            self.cells += 1
            cell_id = self.cells if cell_id is None else cell_id
            python = compile_cell(code, cell_id)
            names, notes = self._shipper.capture(
                python, namespace or {}, rank_defined=self._rank_defined, push=push
            )
            defines = bound_names(python)
            payload = CellPayload(
                code,
                cell_id,
                names,
                return_all=return_all,
                pull=tuple(pull),
                seed=self.spec.seed if seed is None else seed,
                defines=tuple(sorted(defines)),
                notes=notes,
            )
            self._cancel_idle_timer()
            try:
                attempts = 1 + (self.spec.retries if retries is None else retries)
                for attempt in range(attempts):
                    gang = self.up(on_event)
                    result = run_cell(
                        gang, payload, on_event, self.spec.timeout if timeout is None else timeout
                    )
                    if result.ok or not _retryable(result) or attempt + 1 == attempts:
                        break
                    if on_event is not None:
                        on_event(RetryNote(attempt + 1, attempts - 1, result))
                    payload = self._reship(payload, python, namespace, push)
            finally:
                self.last_used = time.time()
                self._arm_idle_timer()
            self._rank_defined |= defines
            result.notes[:0] = list(notes)
            return result

    def _reship(
        self,
        payload: CellPayload,
        python: str,
        namespace: Mapping[str, Any] | None,
        push: Iterable[str],
    ) -> CellPayload:
        """The gang was replaced: its ranks hold no cached names, so send them all again."""
        names, _ = self._shipper.capture(python, namespace or {}, rank_defined=(), push=push)
        return dataclasses.replace(payload, names=names)

    # ---- status and idle release
    def status(self) -> dict[str, Any]:
        gang = self.gang
        return {
            "id": gang.id if gang else None,
            "state": gang.status.value if gang else ("RELEASED" if self.released else "DOWN"),
            "detail": (gang.detail if gang else self.released),
            "shape": self.spec.shape,
            "backend": self.spec.backend,
            "device": gang.device if gang else None,
            "cells": self.cells,
            "idle_s": round(time.time() - self.last_used, 1),
            "idle_timeout_s": self.spec.idle_timeout,
        }

    def _arm_idle_timer(self) -> None:
        self._cancel_idle_timer()
        timer = threading.Timer(self.spec.idle_timeout, self._release_idle)
        timer.daemon = True
        timer.start()
        self._idle_timer = timer

    def _cancel_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _release_idle(self) -> None:
        if not self._lock.acquire(blocking=False):
            return  # a cell is running: not idle
        try:
            if self.gang is not None:
                self._drop_gang()
                self.released = f"released after {self.spec.idle_timeout:g} s idle"
        finally:
            self._lock.release()


class RetryNote:
    """Event shown by views when ``--retries`` re-runs a cell."""

    def __init__(self, attempt: int, retries: int, result: CellResult) -> None:
        cause = result.root_cause
        self.text = (
            f"retry {attempt}/{retries}: "
            f"{cause.label if cause else 'a rank'} was lost; re-running the cell"
        )


def _retryable(result: CellResult) -> bool:
    cause = result.root_cause
    return cause is not None and cause.status == LOST


# ---- one current cluster per kernel, for the magics
_current: Cluster | None = None


def current() -> Cluster | None:
    return _current


def session(spec: ClusterSpec) -> Cluster:
    """The kernel's cluster for ``spec``: the warm one if its gang fits, else a new one."""
    global _current
    if _current is not None and _current.spec.gang_key() == spec.gang_key():
        _current.spec = spec
        return _current
    if _current is not None:
        _current.close()
    _current = Cluster(spec)
    return _current


def shutdown() -> None:
    """Close the current cluster (``%cluster down``)."""
    global _current
    if _current is not None:
        _current.close()
        _current = None


@atexit.register
def _close_all() -> None:
    for cluster in list(_live):
        with contextlib.suppress(Exception):  # the interpreter is going away: best effort
            cluster.close()
