"""``Cluster``: the public API. The magic, papermill runs, the CLI and the tests all go through it.

A ``Cluster`` owns at most one gang: started on first use, kept warm between cells, released
after ``idle_timeout``, after ``max_runtime`` (a cost cap) or on close, replaced when it breaks.
One cell runs at a time, in the foreground or in the background (``submit``).
``session(spec)`` keeps one "current" cluster per kernel for the magics: same gang shape → reuse,
other shape → replace.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import itertools
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from .background import BackgroundCell
from .cell import Shipper, bound_names, compile_cell
from .errors import ClusterBusy, DebugUnavailable
from .events import Note, OnEvent, Stacks
from .payload import Captured, CellPayload
from .result import LOST, OK, CellResult
from .runfunction import CALL_CELL, call_names
from .spec import ClusterSpec, check_seconds, check_seed
from .verdict import explain
from .workdir import for_spec

if TYPE_CHECKING:
    from .gang.base import Gang, Preflight
    from .gang.debugger import Prompt, Write

_live: weakref.WeakSet[Cluster] = weakref.WeakSet()


class Cluster:
    """A gang of ``nodes × gpus`` torch.distributed ranks you run code on.

    >>> with Cluster(nodes=2, gpus=2) as c:                     # doctest: +SKIP
    ...     c.run("import torch.distributed as dist; dist.get_world_size()").value
    4
    """

    def __init__(self, spec: ClusterSpec | None = None, **options: Any) -> None:
        self.spec = spec.replace(**options) if spec else ClusterSpec.build(options)
        self.gang: Gang | None = None
        self.cells = 0
        self.released = ""
        self.last_used = time.time()
        self._shipper = Shipper()
        self._rank_defined: set[str] = set()
        self._lock = threading.RLock()
        #: a job (cell, script, node command, doctor) runs on the nodes; its thread
        self._busy: threading.Thread | None = None
        #: notified when the job ends (``close`` from another thread waits for it)
        self._quiet = threading.Condition(self._lock)
        self._idle = _Deadline(self._release_idle)
        #: the cost cap (``--max-runtime``) of the warm gang, counted from ``_up_at``
        self._expiry = _Deadline(self._expire)
        self._cap: float | None = None
        self._up_at = 0.0
        self._expired = ""
        #: the rank processes (gang id, incarnation) the shipper's cache of names is about
        self._cache_ranks: tuple[str, int] | None = None
        self._background: BackgroundCell | None = None
        #: what re-forming the gang told us, for the next result
        self._notes: list[str] = []
        #: the last cell: its number, outcome and the gang it ran on (``debug``)
        self._last: tuple[int, CellResult, str] | None = None
        _live.add(self)

    # ---- lifecycle
    def up(self, on_event: OnEvent | None = None) -> Gang:
        """Bring the gang up (all ranks or none); a no-op when it is already up."""
        from .gang import make_gang
        from .recorder import track

        with self._lock:
            if self.gang is not None:
                self._notes += self.gang.settle()  # a re-forming after a failure
                if self.gang.status.usable:
                    return self.gang
            files = for_spec(self.spec)  # bad input: nothing started
            self._drop_gang()
            gang = make_gang(self.spec)
            self.gang = gang
            track(self, gang)  # the job registry: sidebar, `jupyter mn`, cancel/release requests
            gang.start(on_event, preflight=_preflight(self.spec), files=files)
            self.released = ""
            self._up_at = time.monotonic()
            self._arm_expiry()
            if not self._busy:
                self._arm_idle_timer()
            return gang

    @contextlib.contextmanager
    def nodes(
        self, on_event: OnEvent | None = None, preflight: bool | None = None, files: bool = True
    ) -> Iterator[Any]:
        """The gang's node agents for a one-off job (doctor, exec, a script): the warm gang's
        when it is up, else nodes claimed for the job alone (no ranks) and released after it.

        ``preflight`` overrides the spec's for freshly claimed nodes; ``files=False``: a job
        that needs none of the notebook's files (doctor, exec) claims nodes without them.
        """
        from .gang import make_gang

        self._refuse_while_background()
        with self._job():
            with self._lock:
                if self.gang is not None:
                    self._notes += self.gang.settle()  # a re-forming after a failure
                warm = self.gang is not None and self.gang.status.usable
                if not warm:
                    self._drop_gang()
            if warm:
                yield self.gang
                return
            spec = self.spec if preflight is None else self.spec.replace(preflight=preflight)
            selected = for_spec(spec) if files else None  # bad input: nothing started
            gang = make_gang(spec)
            try:
                gang.start(on_event, ranks=False, preflight=_preflight(spec), files=selected)
                yield gang
            finally:
                gang.close()

    @contextlib.contextmanager
    def _job(self) -> Iterator[list[str]]:
        """One job at a time, in the foreground or in the background: busy meanwhile (no idle
        release; ``--max-runtime`` stops the job, then tears the gang down, and the list this
        yields then says why)."""
        with self._lock:
            if self._busy is not None:
                raise ClusterBusy(self._busy_message())
            self._busy = threading.current_thread()
            self._cancel_idle_timer()
        torn_down: list[str] = []
        try:
            yield torn_down
        finally:
            with self._lock:
                self._busy = None
                self.last_used = time.time()
                if self._expired:
                    self._drop_gang()
                    self.released = f"torn down: {self._expired}"
                    torn_down.append(self._expired)
                    self._expired = ""
                elif self.gang is not None:
                    self._arm_idle_timer()
                self._quiet.notify_all()

    def close(self) -> None:
        """Stop every process of the gang (a background cell is interrupted). Safe twice."""
        self.cancel("the cluster is closing")
        with self._lock:
            self._wait_quiet()
            self._idle.close()
            self._expiry.close()
            self._drop_gang()

    def cancel(self, reason: str) -> bool:
        """Stop the running cell, from any thread (the gang stays up); False if none runs.

        As Ctrl-C does: every rank's stack, SIGINT, the destroy cascade, then kill."""
        gang = self.gang
        return gang is not None and gang.request_cancel(reason)

    def release(self, reason: str) -> None:
        """Free the gang now, from any thread: stop a running cell, then every process."""
        self.cancel(reason)
        with self._lock:
            self._wait_quiet()
            self._cancel_idle_timer()
            if self.gang is not None:
                self._drop_gang()
                self.released = reason

    def _wait_quiet(self) -> None:
        """Until the running job (stopped by the caller) is over, unless it runs on this thread."""
        self._quiet.wait_for(lambda: self._busy in (None, threading.current_thread()))

    def adopt(self, spec: ClusterSpec) -> None:
        """Take ``spec`` (a later cell's, for the same gang) as the defaults of what runs next;
        a changed ``max_runtime`` counts from the gang's start."""
        with self._lock:
            changed = spec.max_runtime != self.spec.max_runtime
            self.spec = spec
            if changed and self.gang is not None:
                self._arm_expiry()

    def _arm_expiry(self) -> None:
        cap = self._cap = self.spec.max_runtime
        self._expiry.arm(None if cap is None else max(self._up_at + cap - time.monotonic(), 0.0))

    def _drop_gang(self) -> None:
        self._cap = None
        self._expiry.arm(None)
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
        hang_timeout: float | None = None,
        seed: int | None = None,
        retries: int | None = None,
        on_event: OnEvent | None = None,
    ) -> CellResult:
        """Run ``code`` on every rank; rank 0's value is ``.value`` (``.unwrap()`` raises).

        ``namespace`` is where notebook names the code reads are taken from (the magic passes
        the kernel's ``user_ns``); nothing is captured without it. With ``retries`` a cell whose
        rank was lost runs again once the gang has recovered. ``hang_timeout`` (default the
        spec's, 300 s; 0: off): after that long without progress while ranks wait in a
        collective, the hang verdict is shown and the cell keeps running.
        """
        from .gang.debugger import can_prompt

        if seed is not None:
            check_seed(seed, self.spec.world_size)
        if timeout is not None:
            check_seconds("timeout", timeout)
        if hang_timeout is not None:  # a bad value is refused before anything runs
            hang_timeout = self.spec.replace(hang_timeout=hang_timeout).hang_timeout
        self._refuse_while_background()
        with self._job() as torn_down:
            self.cells += 1
            python = compile_cell(code)
            names, notes = self._capture(python, namespace, push)  # bad input: nothing started
            defines = bound_names(python)
            payload = CellPayload(
                code,
                self.cells if cell_id is None else cell_id,
                names,
                return_all=return_all,
                pull=tuple(pull),
                seed=self.spec.seed if seed is None else seed,
                defines=tuple(sorted(defines)),
                notes=notes,
                prompts=can_prompt() and threading.current_thread() is threading.main_thread(),
            )
            self._notes = []
            result = self._attempts(
                payload,
                on_event,
                self.spec.timeout if timeout is None else timeout,
                self.spec.retries if retries is None else retries,
                self.spec.hang_timeout if hang_timeout is None else hang_timeout,
            )
        if torn_down:
            result.notes.append(f"the gang was torn down: {torn_down[0]}")
        self._rank_defined |= defines
        result.notes[:0] = [*notes, *self._notes]
        return result

    def _attempts(
        self,
        payload: CellPayload,
        on_event: OnEvent | None,
        timeout: float | None,
        retries: int,
        hang_timeout: float,
    ) -> CellResult:
        """Run ``payload``; while a rank was lost and retries are left, again once the gang has
        recovered (not after the cost cap stopped it)."""
        from .gang.run import run_cell

        for attempt in range(1 + retries):
            gang = self.up(on_event)
            sent = gang.files.refresh(self.spec)  # what a node's copy of the directory was sent
            result = run_cell(gang, self._for_ranks(payload, gang), on_event, timeout, hang_timeout)
            result.notes[:0] = sent
            self._last = (payload.cell_id, result, gang.id)
            if result.ok or not _retryable(result) or attempt == retries or self._expired:
                return result
            if on_event is not None:
                on_event(Note(_retry_text(attempt + 1, retries, result)))
        raise AssertionError("unreachable: the last attempt returns")

    def _for_ranks(self, payload: CellPayload, gang: Gang) -> CellPayload:
        """``payload`` as ``gang``'s ranks get it: the large names they already hold as digests;
        new rank processes hold none."""
        ranks = (gang.id, gang.incarnation)
        if ranks != self._cache_ranks:
            self._shipper.forget()
            self._cache_ranks = ranks
        return dataclasses.replace(payload, names=self._shipper.for_ranks(payload.names))

    def launch(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Call ``fn(*args, **kwargs)`` on every rank and return rank 0's return value (a failure
        raises ``CellError``), as accelerate's ``notebook_launcher`` does. ``fn`` and its
        arguments are cloudpickled, so a function defined in the notebook works; the ranks'
        output shows as a cell's does (the widget in a notebook, text elsewhere).

        >>> def world(scale):                                     # doctest: +SKIP
        ...     import torch.distributed as dist
        ...     return dist.get_world_size() * scale
        >>> Cluster(nodes=2, gpus=2).launch(world, 10)           # doctest: +SKIP
        40
        """
        from .views import make_view

        names = call_names(fn, args, kwargs)
        view = make_view(self.spec, title=f"launch {getattr(fn, '__name__', 'function')}")
        try:
            result = self.run(CALL_CELL, namespace=names, push=names, on_event=view)
        finally:
            view.close()
        return result.unwrap()

    def _capture(
        self, python: str, namespace: Mapping[str, Any] | None, push: Iterable[str]
    ) -> tuple[tuple[Captured, ...], tuple[str, ...]]:
        return self._shipper.capture(
            python, namespace or {}, rank_defined=self._rank_defined, push=push
        )

    def submit(self, code: str, **options: Any) -> BackgroundCell:
        """Run ``code`` like ``run`` but in the background; returns at once with a handle.

        One cell runs at a time: ``run`` or ``submit`` raise ``ClusterBusy`` meanwhile.
        """
        if self._background is not None and not self._background.done():
            raise ClusterBusy(self._busy_message())
        cell_id = options.pop("cell_id", None) or self.cells + 1
        compile_cell(code)  # a syntax error is the caller's, now
        handle = BackgroundCell(
            self, cell_id, lambda view: self.run(code, cell_id=cell_id, on_event=view, **options)
        )
        self._background = handle
        return handle

    def _refuse_while_background(self) -> None:
        bg = self._background
        if bg is not None and not bg.done() and not bg.runs_here():
            raise ClusterBusy(self._busy_message())

    def _busy_message(self) -> str:
        bg = self._background
        cell = f"In[{bg.cell_id}]" if bg is not None else ""
        return (
            f"background cell {cell} is still running on this gang (one cell at a time): "
            "wait for it (handle.result()) or stop it (handle.cancel())"
        )

    def debug(
        self, rank: int | None = None, prompt: Prompt | None = None, write: Write | None = None
    ) -> None:
        """pdb on a rank's last exception, after a failed cell (``%cluster debug``): the
        root-cause rank's, or ``rank``'s. Commands run on that rank; ``q`` ends it, and the
        gang is READY with every namespace as it was. ``prompt`` asks for each line (``input``:
        stdin, or the notebook's input box)."""
        from .gang.debugger import post_mortem

        self._refuse_while_background()
        with self._job():
            rank = self._failed_rank(rank)
            ended = post_mortem(self.gang, rank, prompt or input, write or sys.stdout.write)
        if ended.error:
            raise DebugUnavailable(ended.error)

    def _failed_rank(self, rank: int | None) -> int:
        """The rank to debug, or why there is none (nothing launched, nothing changed)."""
        if self._last is None:
            raise DebugUnavailable("no cell has run on this cluster: there is nothing to debug")
        cell, result, gang_id = self._last
        if result.ok:
            raise DebugUnavailable(f"the last cell (In[{cell}]) did not fail: nothing to debug")
        if self.gang is None or self.gang.id != gang_id:
            raise DebugUnavailable(f"the gang that ran In[{cell}] is gone, and its tracebacks")
        failed = [o for o in result.ranks if o.status != OK]
        cause = result.root_cause
        if rank is None and cause is not None:
            rank = cause.rank
        outcome = next((o for o in result.ranks if o.rank == rank), None)
        if outcome is None:
            raise DebugUnavailable(f"there is no rank {rank} (ranks 0-{len(result.ranks) - 1})")
        if outcome.status == OK:
            which = ", ".join(str(o.rank) for o in failed)
            raise DebugUnavailable(f"rank {rank} did not fail in In[{cell}] (failed: {which})")
        if outcome.status == LOST:
            raise DebugUnavailable(
                f"rank {rank} was lost in In[{cell}] and restarted: its traceback is gone"
            )
        return outcome.rank

    def stacks(self) -> Stacks:
        """Where every rank is now (``%cluster stacks``), with the hang verdict when ranks wait
        in a collective; works during a cell."""
        gang = self.gang
        return explain("stacks on request", gang.stacks() if gang is not None else [])[0]

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
        self._idle.arm(self.spec.idle_timeout)

    def _cancel_idle_timer(self) -> None:
        self._idle.arm(None)

    def _expire(self) -> None:
        """``max_runtime`` is up: tear the gang down now, or once its running job is stopped."""
        with self._lock:
            if self._cap is None:  # the gang went meanwhile
                return
            reason = f"--max-runtime {self._cap:g} s reached"
            gang = self.gang
            if self._busy is None:
                if gang is not None:
                    self._drop_gang()
                    self.released = f"torn down: {reason}"
                return
            self._expired = reason
        if gang is not None:
            gang.request_cancel(reason)

    def _release_idle(self) -> None:
        with self._lock:
            if self._busy is None and self.gang is not None:
                self._drop_gang()
                self.released = f"released after {self.spec.idle_timeout:g} s idle"


class _Deadline:
    """Calls ``action`` once a deadline passes; re-armed every cell by one waiting thread
    (a ``threading.Timer`` per cell costs a thread start on the cell's path). The thread is
    woken only when the deadline moves sooner than it waits for: a cell disarms the idle
    release and arms it later again, and each wake-up would cost a thread switch on the cell's
    path; a waiter that wakes early finds the later deadline and waits on."""

    def __init__(self, action: Callable[[], None]) -> None:
        self._action = action
        self._due: float | None = None
        #: when the waiting thread wakes up next (None: not before it is notified)
        self._wakes: float | None = None
        #: the waiting thread's number; 0 when none waits (a closed thread sees another number)
        self._thread = 0
        self._numbers = itertools.count(1)
        self._cond = threading.Condition()

    def arm(self, seconds: float | None) -> None:
        """Fire ``seconds`` from now; None disarms."""
        with self._cond:
            self._due = None if seconds is None else time.monotonic() + seconds
            if self._due is None:
                return  # the waiter finds it disarmed when it wakes
            if not self._thread:
                self._thread = next(self._numbers)
                self._wakes = self._due
                threading.Thread(
                    target=self._wait, args=(self._thread,), name="jupyter-mn-idle", daemon=True
                ).start()
            elif self._wakes is None or self._due < self._wakes:
                self._wakes = self._due
                self._cond.notify()

    def close(self) -> None:
        """Disarm and let the waiting thread end (a later ``arm`` starts another)."""
        with self._cond:
            self._due, self._thread = None, 0
            self._cond.notify_all()

    def _wait(self, me: int) -> None:
        with self._cond:
            while self._thread == me:
                if self._due is None or time.monotonic() < self._due:
                    self._wakes = self._due
                    self._cond.wait(None if self._due is None else self._due - time.monotonic())
                    continue
                self._due = self._wakes = None
                self._cond.release()
                try:
                    self._action()
                finally:
                    self._cond.acquire()


def _preflight(spec: ClusterSpec) -> Preflight | None:
    """The doctor's check of new nodes, when ``spec`` asks for it."""
    if not spec.runs_preflight:
        return None
    from .doctor import preflight

    return preflight


def _retry_text(attempt: int, retries: int, result: CellResult) -> str:
    cause = result.root_cause
    what = f"{cause.label if cause else 'a rank'} was lost"
    if result.preemption is not None:
        what = f"node {result.preemption.notice.node} was preempted"
    return f"retry {attempt}/{retries}: {what}; running the cell again"


def _retryable(result: CellResult) -> bool:
    if result.interrupted:
        return False
    cause = result.root_cause
    return result.preemption is not None or (cause is not None and cause.status == LOST)


# ---- one current cluster per kernel, for the magics
_current: Cluster | None = None


def current() -> Cluster | None:
    return _current


def session(spec: ClusterSpec) -> Cluster:
    """The kernel's cluster for ``spec``: the warm one if its gang fits, else a new one."""
    global _current
    if _current is not None and _current.spec.gang_key() == spec.gang_key():
        _current.adopt(spec)
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
def close_all() -> None:
    """Close every cluster of this process (kernel shutdown, interpreter exit)."""
    for cluster in list(_live):
        with contextlib.suppress(Exception):  # the interpreter is going away: best effort
            cluster.close()
