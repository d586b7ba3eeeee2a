"""``Cluster``: the public API. The magic, papermill runs, the CLI and the tests all go through it.

A ``Cluster`` owns at most one gang (``warmgang.py``): started on first use, kept warm between
cells, released after ``idle_timeout``, after ``max_runtime`` (a cost cap, ``lifetime.py``) or on
close, replaced when it breaks. One job runs at a time, in the foreground or in the background
(``submit``, ``jobslot.py``); a cell reads the notebook's names (``shippednames.py``) and runs again
when a rank was lost (``retries.py``).
``session(spec)`` keeps one "current" cluster per kernel for the magics: same gang shape → reuse,
other shape → replace.
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..model.result import CellResult
from ..model.spec import ClusterSpec, check_seconds, check_seed
from ..model.verdict import explain
from ..wire.events import OnEvent, Stacks
from ..wire.payload import CellPayload
from .clusterstate import ClusterState
from .retries import with_retries
from .warmgang import WarmGang, claim_nodes

if TYPE_CHECKING:
    from ..gang.base import Gang
    from ..gang.debugger import LastCell, Prompt, Write
    from .background import BackgroundCell

_live: weakref.WeakSet[Cluster] = weakref.WeakSet()


class Cluster:
    """A gang of ``nodes × gpus`` torch.distributed ranks you run code on.

    >>> with Cluster(nodes=2, gpus=2) as c:                     # doctest: +SKIP
    ...     c.run("import torch.distributed as dist; dist.get_world_size()").value
    4
    """

    def __init__(self, spec: ClusterSpec | None = None, **options: Any) -> None:
        spec = spec.replace(**options) if spec else ClusterSpec.build(options)
        #: spec, lock, job slot and shipped names, shared with the warm gang
        self._state = ClusterState(spec)
        self.cells = 0
        self.last_used = time.time()
        self._warm = WarmGang(self._state)
        self._last: LastCell | None = None
        _live.add(self)

    @property
    def spec(self) -> ClusterSpec:
        """The defaults of what runs next (a later cell's, once adopted)."""
        return self._state.spec

    @property
    def gang(self) -> Gang | None:
        return self._warm.gang

    @property
    def released(self) -> str:
        """Why the gang was torn down ("" while it is up, or before it started)."""
        return self._warm.released

    # ---- lifecycle
    def up(self, on_event: OnEvent | None = None) -> Gang:
        """Bring the gang up (all ranks or none); a no-op when it is already up."""
        return self._warm.up(on_event)

    @contextlib.contextmanager
    def nodes(
        self, on_event: OnEvent | None = None, preflight: bool | None = None, files: bool = True
    ) -> Iterator[Any]:
        """The gang's node agents for a one-off job (doctor, exec, a script): the warm gang's
        when it is up, else nodes claimed for the job alone (no ranks) and released after it.

        ``preflight`` overrides the spec's for freshly claimed nodes; ``files=False``: a job
        that needs none of the notebook's files (doctor, exec) claims nodes without them.
        """
        with self._job():
            with self._state.lock:
                warm = self._warm.warm()
                if not warm:
                    self._warm.drop()
            if warm:
                yield self.gang
                return
            spec = self.spec if preflight is None else self.spec.replace(preflight=preflight)
            with claim_nodes(spec, on_event, files) as gang:
                yield gang

    @contextlib.contextmanager
    def _job(self) -> Iterator[list[str]]:
        """One job at a time (``jobslot.py``): no idle release meanwhile; ``--max-runtime`` stops
        the job, then tears the gang down, and the list this yields then says why."""
        torn_down: list[str] = []

        def ended() -> None:
            self.last_used = time.time()
            if expired := self._warm.job_ended():
                torn_down.append(expired)

        with self._state.slot.hold(lambda: self._warm.lifetime.idle(None), ended):
            yield torn_down

    def close(self) -> None:
        """Stop every process of the gang (a background cell is interrupted). Safe twice."""
        self.cancel("the cluster is closing")
        with self._state.lock:
            self._state.slot.wait_quiet()
            self._warm.close()

    def cancel(self, reason: str) -> bool:
        """Stop the running cell, from any thread (the gang stays up); False if none runs.

        As Ctrl-C does: every rank's stack, SIGINT, the destroy cascade, then kill."""
        return self._warm.cancel(reason)

    def release(self, reason: str) -> None:
        """Free the gang now, from any thread: stop a running cell, then every process."""
        self._warm.release(reason)

    def adopt(self, spec: ClusterSpec) -> None:
        """Take ``spec`` (a later cell's, for the same gang) as the defaults of what runs next;
        a changed cost cap (``max_runtime``, ``max_gpu_hours``) counts from the gang's start."""
        with self._state.lock:
            changed = (spec.max_runtime, spec.max_gpu_hours) != (
                self.spec.max_runtime,
                self.spec.max_gpu_hours,
            )
            self._state.spec = spec
            if changed and self.gang is not None:
                self._warm.lifetime.cap(spec)

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
        from ..gang.debugger import can_prompt

        if seed is not None:
            check_seed(seed, self.spec.world_size)
        if timeout is not None:
            check_seconds("timeout", timeout)
        if hang_timeout is not None:  # a bad value is refused before anything runs
            hang_timeout = self.spec.replace(hang_timeout=hang_timeout).hang_timeout
        with self._job() as torn_down:
            self.cells += 1
            payload = self._state.names.payload(  # bad input: nothing started
                code,
                self.cells if cell_id is None else cell_id,
                namespace,
                push,
                return_all=return_all,
                pull=tuple(pull),
                max_value=self.spec.max_value,
                seed=self.spec.seed if seed is None else seed,
                prompts=can_prompt() and threading.current_thread() is threading.main_thread(),
            )
            self._warm.notes = []
            timeout = self.spec.timeout if timeout is None else timeout
            hang_timeout = self.spec.hang_timeout if hang_timeout is None else hang_timeout
            result = with_retries(
                lambda: self._attempt(payload, on_event, timeout, hang_timeout),
                self.spec.retries if retries is None else retries,
                on_event,
                lambda: bool(self._warm.lifetime.expired),
            )
        if torn_down:
            result.notes.append(f"the gang was torn down: {torn_down[0]}")
        self._state.names.ran(payload)
        result.notes[:0] = [*payload.notes, *self._warm.notes]
        return result

    def _attempt(
        self,
        payload: CellPayload,
        on_event: OnEvent | None,
        timeout: float | None,
        hang_timeout: float,
    ) -> CellResult:
        """Run ``payload`` once, on the gang (brought up if it is not)."""
        from ..gang.debugger import LastCell
        from ..gang.run import run_cell

        gang = self.up(on_event)
        sent = gang.files.refresh(self.spec)  # what a node's copy of the directory was sent
        result = run_cell(
            gang, self._state.names.for_ranks(payload, gang), on_event, timeout, hang_timeout
        )
        result.notes[:0] = sent
        self._last = LastCell(payload.cell_id, result, gang.core.id)
        return result

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
        from .runfunction import launch

        return launch(self.spec, self.run, fn, args, kwargs)

    def submit(self, code: str, **options: Any) -> BackgroundCell:
        """Run ``code`` like ``run`` but in the background; returns at once with a handle.

        One cell runs at a time: ``run`` or ``submit`` raise ``ClusterBusy`` meanwhile.
        """
        cell_id = options.pop("cell_id", None) or self.cells + 1
        return self._state.slot.submit(
            self,
            cell_id,
            code,
            lambda view: self.run(code, cell_id=cell_id, on_event=view, **options),
        )

    def debug(
        self, rank: int | None = None, prompt: Prompt | None = None, write: Write | None = None
    ) -> None:
        """pdb on a rank's last exception, after a failed cell (``%cluster debug``): the
        root-cause rank's, or ``rank``'s. Commands run on that rank; ``q`` ends it, and the
        gang is READY with every namespace as it was. ``prompt`` asks for each line (``input``:
        stdin, or the notebook's input box)."""
        from ..gang.debugger import post_mortem_of

        with self._job():
            post_mortem_of(self._last, self.gang, rank, prompt or input, write or sys.stdout.write)

    def stacks(self) -> Stacks:
        """Where every rank is now (``%cluster stacks``), with the hang verdict when ranks wait
        in a collective; works during a cell."""
        gang = self.gang
        return explain("stacks on request", gang.core.nodes.stacks() if gang is not None else [])[0]

    def status(self) -> dict[str, Any]:
        core = self.gang.core if self.gang is not None else None
        return {
            "id": core.id if core else None,
            "state": core.status.value if core else ("RELEASED" if self.released else "DOWN"),
            "detail": (core.detail if core else self.released),
            "shape": self.spec.shape,
            "backend": self.spec.backend,
            "device": core.device if core else None,
            "cells": self.cells,
            "idle_s": round(time.time() - self.last_used, 1),
            "idle_timeout_s": self.spec.idle_timeout,
            "gpu_hours": core.usage.hours() if core else 0.0,
            "unit": core.usage.unit.value if core and core.usage.unit else "",
        }


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
