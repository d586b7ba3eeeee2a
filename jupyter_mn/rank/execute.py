"""Run a cell in this rank's persistent namespace with IPython semantics.

An ``InteractiveShell`` gives the notebook's rules for free: the last expression is the value,
``%``-magics and ``!`` work, ``display()`` is captured (rank 0's displays are shown in the
notebook as they happen, ``displays.py``), and tracebacks read ``Cell In[N], line L`` with the
notebook's own cell number.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import os
import pickle
import random
import signal
import sys
import time
import traceback
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import traitlets
from IPython.core.displayhook import DisplayHook
from IPython.core.inputtransformer2 import TransformerManager
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from ..wire import sharednames, values
from ..wire.events import RankError, RankReply, RankStatus
from . import location, preemption, timing
from .causes import is_secondary
from .displays import LiveDisplayPublisher, figures_as_png
from .info import cluster_info
from .reload import Reloader, reloaded_note

if TYPE_CHECKING:
    from ..wire.payload import CellPayload
    from .debugger import RankDebugger
    from .group import ProcessGroup
    from .info import ClusterInfo


#: Whether a cell ends in ``;`` (its value then stays on the rank): IPython tokenizes the whole
#: cell again to know, every time (~60 µs for six lines); remembered per cell text.
_ends_in_semicolon = functools.lru_cache(maxsize=256)(DisplayHook.semicolon_at_end_of_expression)


class _ValueHook(DisplayHook):
    """Keep the last expression's value instead of printing ``Out[N]``."""

    def __call__(self, result: Any = None) -> None:
        if result is not None and not self.quiet():
            self.exec_result.result = result

    def quiet(self) -> bool:
        history = self.shell.history_manager.input_hist_parsed
        return bool(history) and _ends_in_semicolon(history[-1])


class CellSignals:
    """SIGINT interrupts a running cell and is ignored between cells (the loop must survive)."""

    def __init__(self) -> None:
        self.active = False
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.active:
            interrupt = KeyboardInterrupt()
            # where it struck: a rank stopped inside torch.distributed was waiting for its peers
            where = frame.f_code.co_filename if frame is not None else ""
            interrupt.struck_in = where  # type: ignore[attr-defined]
            raise interrupt


class _RememberingTransformer(TransformerManager):
    """IPython's static input transform (tokenizing: ~17% of a trivial cell's time on a rank),
    remembered per cell text: a notebook re-runs the same cells. Its transforms are fixed at
    start; the dynamic part (prefilter, which reads the namespace) still runs every time."""

    @functools.lru_cache(maxsize=256)  # noqa: B019 (one per rank process, lives as long)
    def transform_cell(self, cell: str) -> str:
        return super().transform_cell(cell)


class RankShell(InteractiveShell):
    displayhook_class = _ValueHook
    display_pub_class = LiveDisplayPublisher
    input_transformer_manager = traitlets.Instance(_RememberingTransformer, ())
    last_traceback: list[str]
    #: the last cell's exception with its frames, for ``%cluster debug`` (as IPython keeps
    #: ``sys.last_traceback``); dropped when the next cell starts, since its frames may hold
    #: GPU memory
    failure: BaseException | None = None
    #: the notebook's modules this rank imported, reloaded when their file changes
    reloader: Reloader
    #: Called first when the cell raises: the rank stops taking interrupts and leaves its
    #: process group before it spends time formatting the traceback, so peers blocked on it are
    #: released at once.
    on_error: Callable[[], None] = staticmethod(lambda: None)

    @classmethod
    def for_rank(cls) -> RankShell:
        config = Config()
        config.HistoryManager.enabled = False  # ranks must not share one sqlite history file
        # The kernel refuses a top-level ``await`` before it ships a cell (``cell.compile_cell``),
        # so the ranks need not look for one: IPython compiles every cell once more to.
        config.InteractiveShell.autoawait = False
        shell = cls.instance(config=config, colors="nocolor")
        import torch
        import torch.distributed as dist

        shell.user_ns.update({"torch": torch, "dist": dist, "cluster_info": cluster_info})
        shell.last_traceback = []
        shell.reloader = Reloader(os.getcwd())  # the notebook's directory, or its copy
        shell.reloader.remember()  # what is loaded now (torch…): a cell's look sees only news
        figures_as_png(shell)
        shell._warm_up()
        return shell

    def init_prompts(self) -> None:
        """Leave ``sys.ps1`` unset: a rank is a torchrun-style child, not an interactive session
        (Lightning refuses ``strategy="ddp"`` where ``sys.ps1`` exists, and other frameworks
        take it to mean a notebook that must launch its own processes)."""

    def _warm_up(self) -> None:
        """Format one traceback now: the first one costs a loaded core a few hundred ms, and
        the first failure is when a peer waits for this rank."""
        try:
            raise RuntimeError("warm-up")
        except RuntimeError as exc:
            self.InteractiveTB.structured_traceback(type(exc), exc, exc.__traceback__)

    def showtraceback(self, *args: Any, **kwargs: Any) -> None:
        etype, value, tb = sys.exc_info()
        self.on_error()
        if isinstance(value, KeyboardInterrupt) or (value is not None and is_secondary(value)):
            # interrupted, or a consequence of another rank's failure: where is enough (a full
            # traceback through torch's frames takes a loaded core a few hundred ms)
            self.last_traceback = location.raised_at(tb, self)
            return
        self.last_traceback = self.InteractiveTB.structured_traceback(etype, value, tb, tb_offset=1)

    def _format_exception_for_storage(self, exception: BaseException, *args: Any, **kw: Any) -> Any:
        """IPython formats every error a second time for its history: reuse ours (the second
        formatting parses torch's sources and costs a loaded core a second)."""
        return {
            "ename": type(exception).__name__,
            "evalue": str(exception),
            "traceback": list(self.last_traceback),
        }

    def showsyntaxerror(self, *args: Any, **kwargs: Any) -> None:
        etype, value, tb = sys.exc_info()
        self.last_traceback = self.SyntaxTB.structured_traceback(etype, value, tb)


def dumps(obj: Any, what: str = "the value", limit: int | None = None) -> values.Pickled:
    """``obj`` pickled at protocol 5, arrays' memory and large bytes kept apart as buffers (not
    copied; a read-only one is copied once, so that every hop may send it on as it came).
    Over ``limit`` bytes it raises ``values.ValueTooLarge`` naming ``what``, before that copy."""
    buffers: list[pickle.PickleBuffer] = []
    buf = io.BytesIO()
    values.CpuPickler(buf, protocol=5, buffer_callback=buffers.append).dump(obj)
    data = buf.getvalue()
    if limit is not None:
        values.check_size(what, buffers, data, limit)
    writable = tuple(
        b if not b.raw().readonly else pickle.PickleBuffer(bytearray(b.raw())) for b in buffers
    )
    return values.Pickled(data, writable)


_held = sharednames.HeldNames()
#: Names the notebook put in this namespace (rather than a cell on the ranks): updated freely.
_from_notebook: set[str] = set()


def _bind_names(shell: RankShell, payload: CellPayload) -> None:
    """Bind the notebook names the cell reads; large ones arrive once and are re-read from cache."""
    ns = shell.user_ns
    for captured in payload.names:
        ns[captured.name] = _adopt(_held.value(captured), ns)
        _from_notebook.add(captured.name)


def _adopt(value: Any, ns: dict[str, Any]) -> Any:
    """Let notebook-defined functions and classes see the rank's namespace as their globals.

    cloudpickle gives them a private globals dict holding only what the notebook had, so a
    function using ``torch`` or ``model`` defined on the ranks would raise ``NameError``.
    """
    if isinstance(value, types.FunctionType) and value.__module__ == "__main__":
        return _rehome(value, ns)
    if isinstance(value, type) and value.__module__ == "__main__":
        for name, attr in list(vars(value).items()):
            fn = attr.__func__ if isinstance(attr, (staticmethod, classmethod)) else attr
            if isinstance(fn, types.FunctionType):
                moved = _rehome(fn, ns)
                setattr(value, name, moved if fn is attr else type(attr)(moved))
    return value


def _rehome(fn: types.FunctionType, ns: dict[str, Any]) -> types.FunctionType:
    for key, val in fn.__globals__.items():
        if key != "__builtins__" and (key not in ns or key in _from_notebook):
            ns[key] = val
            _from_notebook.add(key)
    moved = types.FunctionType(fn.__code__, ns, fn.__name__, fn.__defaults__, fn.__closure__)
    moved.__kwdefaults__ = fn.__kwdefaults__
    moved.__qualname__ = fn.__qualname__
    moved.__doc__ = fn.__doc__
    moved.__dict__.update(fn.__dict__)
    return moved


def _seed(seed: int, rank: int) -> None:
    import numpy
    import torch

    random.seed(seed + rank)
    numpy.random.seed(seed + rank)
    torch.manual_seed(seed + rank)


def run(
    shell: RankShell,
    payload: CellPayload,
    info: ClusterInfo,
    group: ProcessGroup,
    signals: CellSignals,
    debugger: RankDebugger,
) -> RankReply:
    """Run one cell; return the reply the agent relays (value only from rank 0, or all ranks)."""
    shell.display_pub.outputs.clear()
    shell.last_traceback = []
    _drop_failure(shell)
    debugger.begin_cell(payload.prompts)
    started, started_ns = time.perf_counter(), time.time_ns()
    reloaded, result, exc = _execute(shell, payload, info, signals, debugger)
    shell.reloader.remember()  # before the reply: an edit made after it is seen as one
    duration = time.perf_counter() - started
    timed = exc is None and duration >= timing.MIN_CELL_S
    collective = timing.last_collective(started_ns) if timed else None
    _from_notebook.difference_update(payload.defines)  # the cell rebound them: rank state now
    status, error, outputs = RankStatus.OK, None, _Outputs()
    if exc is None and (info.rank == 0 or payload.return_all):
        try:
            outputs = _outputs(shell, result.result if result else None, payload, info)
        except values.ValueTooLarge as refused:  # the cell fails; the gang carries on
            exc, shell.last_traceback = refused, [f"ValueTooLarge: {refused}"]
            refused.__traceback__ = None  # its frames hold the value and its pickle
    if exc is not None:
        interrupted = isinstance(exc, KeyboardInterrupt)
        status = RankStatus.INTERRUPTED if interrupted else RankStatus.ERROR
        error = RankError.raised(exc, shell.last_traceback, is_secondary(exc))
        _keep(shell, exc)
        exc = result = None
        group.destroy()
    if reloaded and info.rank == 0:
        outputs.notes.insert(0, reloaded_note(reloaded))
    return outputs.reply(info.rank, status, duration, error, collective)


def _execute(
    shell: RankShell,
    payload: CellPayload,
    info: ClusterInfo,
    signals: CellSignals,
    debugger: RankDebugger,
) -> tuple[list[str], Any, BaseException | None]:
    """The cell's run: the modules reloaded first, IPython's result, and what it raised."""
    result = None
    reloaded: list[str] = []
    try:
        reloaded = shell.reloader.reload()
        _bind_names(shell, payload)
        if payload.seed is not None:
            _seed(payload.seed, info.rank)
        shell.execution_count = payload.cell_id
        signals.active = True
        try:
            result = shell.run_cell(payload.source, store_history=True)
        finally:
            signals.active = False
            debugger.end_cell()
        return reloaded, result, result.error_before_exec or result.error_in_exec
    except KeyboardInterrupt as interrupt:
        return reloaded, result, interrupt
    except Exception as failure:  # reloading an edited module, unpickling a name, seeding
        shell.last_traceback = [f"{type(failure).__name__}: {failure}"]
        return reloaded, result, failure


def _keep(shell: RankShell, exc: BaseException) -> None:
    """Keep the failed frames in one place, ``shell.failure`` (for a post-mortem), and drop
    every other reference to them: they hold the old process group (its threads, its listener)
    and whatever tensors the cell had."""
    shell.last_execution_result = None
    for tb in (shell.InteractiveTB, shell.SyntaxTB):
        tb.tb = None
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            delattr(sys, name)
    shell.failure = exc


def _drop_failure(shell: RankShell) -> None:
    """A new cell: the last one's failed frames go (and what they held with them)."""
    exc, shell.failure = shell.failure, None
    if exc is not None:
        traceback.clear_frames(exc.__traceback__)
        exc.__traceback__ = None


@dataclasses.dataclass
class _Outputs:
    """What a cell's reply carries besides its outcome: the value (rank 0's, or every rank's),
    and on rank 0 its displays and pulled names; notes for the user."""

    value: values.Pickled | None = None
    value_repr: str | None = None
    displays: tuple[dict[str, Any], ...] = ()
    pulled: dict[str, values.Pickled] | None = None
    notes: list[str] = dataclasses.field(default_factory=list)

    def reply(
        self,
        rank: int,
        status: RankStatus,
        duration: float,
        error: RankError | None,
        collective: dict[str, Any] | None,
    ) -> RankReply:
        """The cell's reply with these outputs, finished now."""
        return RankReply(
            rank,
            status,
            duration,
            error,
            finished_at=time.time(),
            collective=collective,
            value=self.value,
            value_repr=self.value_repr,
            displays=self.displays,
            pulled=self.pulled,
            notes=tuple(self.notes),
            **preemption.report(),
        )


def _outputs(shell: RankShell, value: Any, payload: CellPayload, info: ClusterInfo) -> _Outputs:
    out = _Outputs()
    if value is not None:
        try:
            out.value = dumps(value, f"rank {info.rank}'s value", payload.max_value)
        except values.ValueTooLarge:
            raise
        except Exception as exc:
            out.value_repr = repr(value)[:10000]
            out.notes.append(
                f"rank {info.rank}'s value of type {type(value).__name__} could not be sent "
                f"({type(exc).__name__}: {exc}); showing its repr"
            )
    if info.rank == 0:
        out.displays = tuple(
            {"data": o["data"], "metadata": o.get("metadata") or {}}
            for o in shell.display_pub.outputs
        )
        out.pulled = {}
        for name in payload.pull:
            if name not in shell.user_ns:
                out.notes.append(f"--pull {name}: not defined on rank 0")
                continue
            try:
                out.pulled[name] = dumps(shell.user_ns[name], f"--pull {name}", payload.max_value)
            except values.ValueTooLarge:
                raise
            except Exception as exc:
                out.notes.append(f"--pull {name}: cannot be sent ({type(exc).__name__}: {exc})")
    return out
