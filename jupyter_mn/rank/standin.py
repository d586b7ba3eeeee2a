"""A stand-in cell rank, for tests and bench only. It speaks the real rank protocol without torch.

A node agent starts it instead of ``python -m jupyter_mn.rank.runtime`` when its environment
sets ``JUPYTER_MN_RANK_PYTHON`` to ``python -m jupyter_mn.rank.standin``
(``tests/support/simulated.py``), so a simulated gang of 64 nodes × 8 ranks fits on one machine:
it imports neither torch nor IPython (about 15 MB each instead of a few hundred). What the agent
and the kernel see is the real thing: its ``ready``, its replies, its lines on stdout/stderr
flushed before each reply (``rank/sync.py``), SIGINT, stacks, re-forming (``reinit``) and
``stop``. It lives beside the rank runtime whose protocol it speaks, so that a change to the
protocol meets it here and the rank side's layering rules hold for it too.

A cell is plain Python run in one namespace per rank (its last expression is the value), with
``rank``, ``local_rank``, ``node_rank`` and ``world_size`` defined. It fails when the cell raises
("fails on request"); ``os._exit`` makes it a lost rank. ``collective(name)`` marks the moment
the rank enters a collective and the reply reports it as torch's flight recorder would
(``rank/timing.py``), which drives the straggler hints. There is no process group: nothing waits
for peers, so a failure has no secondary errors.
"""

from __future__ import annotations

import ast
import dataclasses
import linecache
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

from jupyter_mn.rank.env import CONTROL_FD, STACKS_FD
from jupyter_mn.rank.parent import exit_with_parent
from jupyter_mn.rank.sync import flush_output
from jupyter_mn.wire import valuefiles
from jupyter_mn.wire.events import RankError, RankReply, RankStatus
from jupyter_mn.wire.frames import encode, write_all
from jupyter_mn.wire.rankwhere import RankWhere, WhereRequest
from jupyter_mn.wire.rankwire import RankReady, Reform, Reformed, RunCell, Stop
from jupyter_mn.wire.sharednames import HeldNames, received
from jupyter_mn.wire.values import Pickled

BACKEND = "stand-in"


class _Cell:
    """What the stacks thread and SIGINT need to know about the running cell."""

    def __init__(self) -> None:
        self.active = False
        self.collective: dict[str, Any] | None = None
        self.collectives = 0
        self.started_ns = 0
        signal.signal(signal.SIGINT, self._interrupt)

    def _interrupt(self, signum: int, frame: Any) -> None:
        if self.active:
            raise KeyboardInterrupt

    def enter(self, name: str = "all_reduce") -> None:
        now = time.time_ns()
        self.collectives += 1
        self.collective = {
            "name": name,
            "key": [0, self.collectives],
            "entered_ns": now,
            "entered_s": (now - self.started_ns) / 1e9,
        }


def _compile(source: str, filename: str) -> tuple[Any, Any]:
    """The cell's statements, and its last expression apart (the value), as IPython splits them."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    tree = ast.parse(source, filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = compile(ast.Expression(tree.body.pop().value), filename, "eval")
    return compile(tree, filename, "exec"), last


def _cell_lines(frames: list[traceback.FrameSummary]) -> list[str]:
    """``Cell In[N], line L`` and the code, for the frames of cells (as ``rank/location.py``)."""
    lines = []
    for f in frames:
        if f.filename.startswith("Cell In["):
            lines.append(f"{f.filename}, line {f.lineno}")
            if f.line:
                lines.append(f"    {f.line.strip()}")
    return lines


def _dumps(value: Any, notes: list[str], what: str) -> Pickled | None:
    try:
        return Pickled(pickle.dumps(value))
    except Exception as exc:
        notes.append(f"{what} cannot be sent ({type(exc).__name__}: {exc})")
        return None


def run(payload: Any, ns: dict[str, Any], cell: _Cell, held: HeldNames) -> RankReply:
    """One cell; the reply has the fields ``rank/execute.py`` sends."""
    rank = ns["rank"]
    started = time.perf_counter()
    cell.started_ns, cell.collective = time.time_ns(), None
    value, error, status = None, None, RankStatus.OK
    try:
        for captured in payload.names:
            ns[captured.name] = held.value(captured)
        body, last = _compile(payload.source, f"Cell In[{payload.cell_id}]")
        cell.active = True
        try:
            exec(body, ns)
            if last is not None:
                value = eval(last, ns)
        finally:
            cell.active = False
    except BaseException as exc:
        interrupted = isinstance(exc, KeyboardInterrupt)
        status = RankStatus.INTERRUPTED if interrupted else RankStatus.ERROR
        frames = list(traceback.extract_tb(exc.__traceback__))
        error = RankError.raised(exc, [*_cell_lines(frames), f"{type(exc).__name__}: {exc}"])
    reply = RankReply(
        rank, status, time.perf_counter() - started, error, time.time(), cell.collective
    )
    if error is None and (rank == 0 or payload.return_all):
        return _with_outputs(reply, value, payload, ns)
    return reply


def _with_outputs(reply: RankReply, value: Any, payload: Any, ns: dict[str, Any]) -> RankReply:
    """``reply`` with the cell's value (and on rank 0 its pulled names), as ``execute.py``'s."""
    rank, notes = reply.rank, []
    data = _dumps(value, notes, f"rank {rank}'s value") if value is not None else None
    value_repr = None if data or value is None else repr(value)
    pulled = {}
    if rank == 0:
        for name in payload.pull:
            if name not in ns:
                notes.append(f"--pull {name}: not defined on rank 0")
            elif (blob := _dumps(ns[name], notes, f"--pull {name}")) is not None:
                pulled[name] = blob
    return dataclasses.replace(
        reply,
        value=data,
        value_repr=value_repr,
        pulled=pulled if rank == 0 else None,
        notes=tuple(notes),
    )


def main() -> None:
    conn = Connection(int(os.environ[CONTROL_FD]))
    lock = threading.Lock()

    def send(msg: Any, by_file: bool = False) -> None:
        with lock:
            valuefiles.send(conn.fileno(), msg, by_file)

    exit_with_parent()
    cell = _Cell()
    env = os.environ
    ns: dict[str, Any] = {
        "__name__": "__main__",
        "rank": int(env["RANK"]),
        "local_rank": int(env["LOCAL_RANK"]),
        "node_rank": int(env["NODE_RANK"]),
        "world_size": int(env["WORLD_SIZE"]),
        "collective": cell.enter,
    }
    main_thread = threading.main_thread().ident or 0
    stacks = Connection(int(env[STACKS_FD]))

    def answer_stacks() -> None:
        while True:
            try:
                if not isinstance(pickle.loads(stacks.recv_bytes()), WhereRequest):
                    continue  # an abort: a stand-in holds no connections
                frame = sys._current_frames().get(main_thread)
                stack = traceback.extract_stack(frame) if frame is not None else []
                lines = tuple(_cell_lines(list(stack)))
                where = RankWhere(ns["node_rank"], ns["rank"], cell.active, lines)
                write_all(stacks.fileno(), encode(where))
            except (EOFError, OSError):
                return

    threading.Thread(target=answer_stacks, name="standin-stacks", daemon=True).start()
    rank = ns["rank"]
    send(RankReady(rank, ns["local_rank"], os.getpid(), "cpu", BACKEND, socket.gethostname()))
    held = HeldNames()
    while True:
        try:
            msg = pickle.loads(conn.recv_bytes())  # rankwire's leaves: no torch, no IPython
        except (EOFError, OSError):
            break
        match msg:
            case RunCell(payload=payload, values_by_file=by_file):
                reply = run(received(conn.fileno(), payload), ns, cell, held)
                flush_output()  # as a real rank: into the pipes before the reply
                send(reply, by_file)
            case Reform():
                send(Reformed(rank, True))
            case Stop():
                break
    flush_output()
    os._exit(0)


if __name__ == "__main__":
    main()
