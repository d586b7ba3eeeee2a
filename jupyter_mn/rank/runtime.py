"""A rank process's main loop: join the group, then run what the agent sends until told to stop.

Started by the node agent as ``python -m jupyter_mn.rank.runtime`` in its own session, with stdout
and stderr on pipes to the agent, a control socket (fd ``JUPYTER_MN_CONTROL_FD``) for cells, read
by the main thread between cells (a reader thread handing them over cost a wake-up per cell), and
a stacks socket (``JUPYTER_MN_STACKS_FD``) answered by a thread while the main thread is busy (it
also brings a preemption notice: ``preemption.py``).
Its environment follows the contract in ``env.py``; the group lives in ``group.py``, a cell's run
in ``execute.py``.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import os
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from ..wire import sharednames, valuefiles
from ..wire.debugwire import DebugStart
from ..wire.events import Preemption
from ..wire.frames import encode, write_all
from ..wire.rankwhere import AbortRequest, RankWhere
from ..wire.rankwire import LeaveGroup, RankReady, Reform, Reformed, RunCell, StartFailed, Stop
from . import env as contract
from . import execute, flight, location, preemption
from .debugger import RankDebugger
from .group import ProcessGroup
from .info import ClusterInfo, cluster_info
from .parent import exit_with_parent
from .sync import flush_output


class _Control:
    """The control socket: read by the main thread; written by it and by any thread of the cell
    that displays something on rank 0, so one message at a time."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._lock = threading.Lock()
        self._back: list[Any] = []  # read by a pdb that waited for a line instead (debugger.py)

    def send(self, msg: Any, by_file: bool = False) -> None:
        """Send ``msg``; a reply's big values as files when ``by_file`` (``valuefiles.py``)."""
        with self._lock:
            valuefiles.send(self.conn.fileno(), msg, by_file)

    def recv(self) -> Any:
        """The next message from the agent (main thread only)."""
        if self._back:
            return self._back.pop()
        msg = self.conn.recv()
        if isinstance(msg, RunCell):  # the files of its shared names follow it
            msg = dataclasses.replace(
                msg, payload=sharednames.received(self.conn.fileno(), msg.payload)
            )
        return msg

    def push_back(self, msg: Any) -> None:
        self._back.append(msg)


def _answer_stacks(
    conn: Connection, shell: Any, signals: execute.CellSignals, group: ProcessGroup
) -> None:
    """Stacks thread: where the main thread is, at once (it may be blocked in a collective),
    the connections closed when an interrupt finds it blocked there, and a preemption notice
    kept for ``checkpoint.preempted()`` (no answer)."""
    info = group.info
    while True:
        try:
            msg = conn.recv()
            if isinstance(msg, Preemption):
                preemption.hear(msg)
                continue
            if isinstance(msg, AbortRequest):
                group.abort(msg.generation)
                continue
            stack = location.main_thread(shell) if msg.stack else []
            collectives = flight.latest(flight.trace(), group.formed_ns, flight.group_ranks())
            busy, now = signals.active, time.time_ns()
            where = RankWhere(
                info.node_rank, info.rank, busy, tuple(stack), collectives, taken_ns=now
            )
            write_all(conn.fileno(), encode(where))
        except (EOFError, OSError):
            return


def _line_buffered() -> None:
    """Write stdout and stderr a line at a time, as to a terminal: ``print("line", 6)`` is one
    write, not four, so the agent never mistakes a line cut between writes for a line still being
    written (a progress bar). ``\\r`` flushes too, so a redrawn bar still arrives as drawn.
    (``PYTHONUNBUFFERED`` stays set for the rank's own Python children.)"""
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True, write_through=False)  # type: ignore[union-attr]


def main() -> None:
    faulthandler.enable(all_threads=False)  # a segfault leaves its Python stack in the log
    _line_buffered()
    control = _Control(Connection(int(os.environ[contract.CONTROL_FD])))
    exit_with_parent()
    preemption.shield()
    signals = execute.CellSignals()
    info = cluster_info()
    try:
        group, shell = _join(info)
    except Exception as exc:
        control.send(StartFailed(f"{type(exc).__name__}: {exc}"))
        flush_output()
        os._exit(1)
    _Rank(control, info, signals, group, shell).serve()
    group.destroy()
    flush_output()
    os._exit(0)


def _join(info: ClusterInfo) -> tuple[ProcessGroup, execute.RankShell]:
    """Join the process group (the generation the agent set), then make the cells' shell."""
    group = ProcessGroup(info, float(os.environ.get(contract.PG_TIMEOUT, "1800")))
    if not group.cuda:
        os.environ.setdefault(contract.ACCELERATE_CPU, "true")
    group.init(int(os.environ.get(contract.GENERATION, "0")))
    return group, execute.RankShell.for_rank()


class _Rank:
    """A rank that joined its group, serving its agent's messages (``rankwire.py``) until told
    to stop or the agent is gone."""

    def __init__(
        self,
        control: _Control,
        info: ClusterInfo,
        signals: execute.CellSignals,
        group: ProcessGroup,
        shell: execute.RankShell,
    ) -> None:
        self.control, self.info, self.signals = control, info, signals
        self.group, self.shell = group, shell
        shell.on_error = self._on_error
        self.debugger = RankDebugger(control, info.rank, shell)
        self.debugger.install()
        if info.rank == 0:  # its displays show in the notebook while the cell runs
            shell.display_pub.send = control.send
        threading.Thread(
            target=_answer_stacks,
            args=(Connection(int(os.environ[contract.STACKS_FD])), shell, signals, group),
            name="jupyter-mn-stacks",
            daemon=True,
        ).start()

    def _on_error(self) -> None:
        self.signals.active = False  # a late interrupt must not replace the real error
        self.group.destroy()

    def serve(self) -> None:
        info, host = self.info, os.uname().nodename
        ready = RankReady(
            info.rank, info.local_rank, os.getpid(), info.device, self.group.backend, host
        )
        self.control.send(ready)
        while True:
            try:
                msg = self.control.recv()
            except (EOFError, OSError):  # the agent is gone
                return
            if not self._take(msg):
                return

    def _take(self, msg: Any) -> bool:
        """Do what ``msg`` asks; False: stop."""
        group = self.group
        match msg:
            case DebugStart():
                self.debugger.post_mortem(self.shell.failure)
            case RunCell(payload=payload, values_by_file=by_file):
                reply = execute.run(
                    self.shell, payload, self.info, group, self.signals, self.debugger
                )
                flush_output()  # into the pipes: the agent reads them to empty at the reply
                self.control.send(reply, by_file)
                group.release()
            case LeaveGroup(generation=generation):
                if generation == group.generation:  # a late request must not hit a new group
                    group.destroy()
            case Reform(generation=generation, reconnect=reconnect):
                try:
                    group.reinit(generation, reconnect=reconnect)
                except Exception as exc:
                    self.control.send(
                        Reformed(self.info.rank, False, f"{type(exc).__name__}: {exc}")
                    )
                else:
                    self.control.send(Reformed(self.info.rank, True))
            case Stop():
                return False
        return True


if __name__ == "__main__":
    main()
