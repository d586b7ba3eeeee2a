"""One rank process as its node agent sees it: launched, read, signalled, stopped.

The process runs ``python -m jupyter_mn.rank.runtime`` (``rank_command``) in its own session (a
Jupyter interrupt never reaches it), with stdout/stderr on pipes (C-level output included) and a
control socket. Its pipes (``pipes.py``) and its control socket (``frames.py``) are read on the
agent's event loop whenever they are readable, with no thread between; its death shows as EOF at
once. A big reply to a cell whose run allows it goes to the kernel as it is read
(``valuerelay.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import pickle
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection
from typing import Any

from ..errors import RendezvousError
from ..rank import location
from ..rank.env import CONTROL_FD, STACKS_FD
from ..wire import valuefiles
from ..wire.debugwire import DebugAnswer, DebugEnded, DebugPrompt
from ..wire.events import DisplayOutput, RankError, RankReply, RankStatus
from ..wire.frames import SOCKET_BUFFER, Frames, Undecodable
from ..wire.rankwhere import RankWhere
from ..wire.rankwire import RankReady, Reformed, StartFailed, Stop
from .exits import describe_exit
from .nodelink import NodeLink
from .pdbrelay import PdbRelay
from .pipes import PipeReader, read_frames
from .ranksocket import RankStacks
from .sending import OrderedSend
from .valuerelay import Ahead, ReplyRelay

STOP_GRACE_S = 3.0
_SESSION_GRACE_S = 1.0
#: The agent's environment may name another command for its cell ranks (see ``rank_command``).
RANK_PYTHON = "JUPYTER_MN_RANK_PYTHON"
_DEFAULT_COMMAND = [sys.executable, "-m", "jupyter_mn.rank.runtime"]


def rank_command(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The command a cell rank is started with: ``python -m jupyter_mn.rank.runtime``, unless
    the agent's environment sets ``JUPYTER_MN_RANK_PYTHON``.

    That variable exists for simulation: the scale tests and bench start light stand-in ranks
    (``jupyter_mn/rank/standin.py``, which speak this protocol without torch) so that 64 nodes × 8
    ranks fit on one machine. A command that cannot run is refused before any rank starts.
    """
    raw = environ.get(RANK_PYTHON, "")
    if not raw.strip():
        return list(_DEFAULT_COMMAND)
    try:
        argv = shlex.split(raw)
    except ValueError as exc:
        raise RendezvousError(f"{RANK_PYTHON}={raw!r} cannot be parsed: {exc}") from None
    if shutil.which(argv[0]) is None:
        raise RendezvousError(f"{RANK_PYTHON}={raw!r}: {argv[0]!r} is not an executable")
    return argv


def start_in_session(
    argv: list[str], env: dict[str, str], cwd: str | None, pass_fds: tuple[int, ...] = ()
) -> subprocess.Popen[bytes]:
    """Start a rank (a cell's or a script's) in its own session, its output on two pipes."""
    return subprocess.Popen(
        argv,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=pass_fds,
        start_new_session=True,
    )


def signal_session(pid: int, signum: int) -> None:
    """Signal a rank process and what it started (it leads its own session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


def pack(msg: Any) -> bytes:
    """A message to a rank (``rankwire.py``) as its control socket carries it
    (``Connection.recv`` unpickles)."""
    return pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)


class RankHandle:
    """One cell rank process as its agent sees it."""

    def __init__(
        self,
        agent: NodeLink,
        local_rank: int,
        rank: int,
        env: dict[str, str],
        cwd: str | None,
        command: list[str],
        start: Callable[..., Any] = start_in_session,
    ) -> None:
        """``start``: how its process starts (``start_in_session``'s signature and result:
        a ``Popen``, or one forked from the node's template, ``template.py``)."""
        self.agent = agent
        self.local_rank = local_rank
        self.rank = rank
        self.pipes = PipeReader(agent, rank)
        #: what the rank said that nobody expects at once (``ready``, ``reformed``); None: the
        #: control socket ended
        self.messages: asyncio.Queue[Any] = asyncio.Queue()
        self.pdb = PdbRelay(rank, lambda where: agent.paused(rank, self.running or 0, where))
        #: the run this rank is busy with (None between cells)
        self.running: int | None = None
        #: who takes this rank's next cell replies (oldest first), and where each may go ahead
        self._expecting: deque[tuple[int, Callable[[RankReply], None], Ahead | None]] = deque()
        self._dead = False  # its control socket ended: no reply will come
        self._answering: asyncio.Future[None] | None = None  # "lost" to those expecting one
        self.killed_because = ""  # why the agent killed it (shown with its exit status)
        self.stopping = False
        self._lost_report: asyncio.Future[None] | None = None  # of a death between cells
        parent, child = socket.socketpair()
        child.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)  # the rank's value
        stacks_parent, stacks_child = socket.socketpair()
        env = {**env, CONTROL_FD: str(child.fileno()), STACKS_FD: str(stacks_child.fileno())}
        #: named in a start failure when it is not the usual one (``JUPYTER_MN_RANK_PYTHON``)
        self.command = "" if command == _DEFAULT_COMMAND else shlex.join(command)
        try:
            self.proc = start(command, env, cwd, pass_fds=(child.fileno(), stacks_child.fileno()))
        except OSError as exc:
            parent.close()
            stacks_parent.close()
            raise RendezvousError(f"rank {rank}: cannot run {shlex.join(command)}: {exc}") from None
        finally:
            child.close()
            stacks_child.close()
        self.conn = Connection(parent.detach())
        self._sender = OrderedSend(self.conn)
        self.stacks = RankStacks(Connection(stacks_parent.detach()), self.proc, agent.node, rank)
        self.pipes.start(self.proc)
        self._frames = Frames()
        self._control = socket.socket(fileno=os.dup(self.conn.fileno()))  # read with its files
        self._files = valuefiles.Inbound(self._control)
        self._loop = asyncio.get_running_loop()
        watch = functools.partial(self._loop.add_reader, self.conn.fileno(), self._read_control)
        watch()
        self._relay = ReplyRelay(self.conn.fileno(), self._frames, watch)

    def expect(
        self, run_id: int, on_reply: Callable[[RankReply], None], ahead: Ahead | None = None
    ) -> None:
        """Run ``run_id`` is being sent: the rank is busy until its reply, which goes to
        ``on_reply`` straight from the loop's read of the control socket (a task waiting for it
        would cost the reply a loop turn or two), or a "lost" outcome if the rank dies first.
        A big reply may go ``ahead`` as it is read; ``on_reply`` then gets it without its value."""
        self.running = run_id
        self._expecting.append((run_id, on_reply, ahead))
        if self._dead:
            self._answer_lost()

    # ---- event loop: the control socket is readable
    def _read_control(self) -> None:
        if self._relay.active:
            messages = self._relay.read()
        else:
            messages = read_frames(self._loop, self.conn, self._frames, self._files)
        if messages is not None:
            for msg in messages:
                self._dispatch(msg)
            if self._expecting and (ahead := self._expecting[0][2]) is not None:
                self._relay.begin(self._expecting[0][0], ahead)
            return
        self.messages.put_nowait(None)
        self.pdb.over(f"rank {self.rank} exited")
        self._gone()

    def _dispatch(self, msg: Any) -> None:
        """One message from the rank (``rankwire.py``), to whoever takes its type."""
        match msg:
            case Undecodable(error=error):  # said in the rank's log, not lost silently
                note = f"[jupyter_mn: the agent could not read a message: {error}]"
                self.agent.log(self.rank, "err", note)
            case DebugPrompt() | DebugEnded():
                self.pdb.answer(msg)
            case DisplayOutput():  # rank 0's display() while the cell runs
                self.agent.display(self.rank, msg)
            case RankReply() if self._expecting:
                self.running = None
                self.pdb.over("the cell ended")
                self._expecting.popleft()[1](valuefiles.attached(msg, self._files))
            case _:
                self.messages.put_nowait(msg)

    async def debug(self, message: Any = None) -> DebugAnswer:
        """Send ``message`` (``DebugStart``, a ``DebugLine``, or None: a paused rank's prompt)
        to the rank's pdb and return what it says next: a prompt, or that it let go."""
        if self._dead:
            return DebugEnded(self.rank, error=f"rank {self.rank} exited")
        return await self.pdb.ask(message, self.send)

    def _gone(self) -> None:
        """The process went away: the cells waiting for its reply get a "lost" outcome (and so
        do those sent to it from now on); when no cell was running, nobody else would notice."""
        self._dead = True
        self._relay.void()
        if self._expecting:
            self._answer_lost()
        elif not self.stopping and self.running is None:
            self._lost_report = asyncio.ensure_future(self._report_lost())

    async def _report_lost(self) -> None:
        reason = self.exit_reason(await self.exit_code())
        self.agent.rank_state(
            self.rank, RankStatus.LOST_IDLE, self.explain(f"died between cells: {reason}")
        )

    def _answer_lost(self) -> None:
        self.running = None
        if self._answering is None or self._answering.done():
            self._answering = asyncio.ensure_future(self._answer_expecting())

    async def _answer_expecting(self) -> None:
        lost = await self._lost()
        while self._expecting:  # those that came while it was awaited too
            self._expecting.popleft()[1](lost)

    # ---- event loop side
    async def send(self, msg: Any) -> bool:
        """Send one of ``rankwire.py``'s messages; whether it went."""
        return await self.send_packed(pack(msg))

    def send_packed(self, data: bytes, files: Sequence[int] = ()) -> asyncio.Future[bool]:
        """Send a ``pack``ed message, and ``files`` after it, in order (``OrderedSend``)."""
        return self._sender.send(data, files)

    async def ready(self) -> RankReady:
        """The rank joined its group; a ``RendezvousError`` saying why when it could not."""
        msg = await self.messages.get()
        if isinstance(msg, RankReady):
            return msg
        failed = msg.error if isinstance(msg, StartFailed) else ""
        reason = failed or describe_exit(await self.exit_code())
        started_as = f" (started as {self.command})" if self.command else ""
        raise RendezvousError(self.explain(f"failed to start{started_as}: {reason}"))

    async def reformed(self) -> Reformed:
        """The rank's answer to a ``Reform``, or a failed one when the process died first."""
        msg = await self.messages.get()
        if isinstance(msg, Reformed):
            return msg
        return Reformed(self.rank, False, f"RankLost: {self.exit_reason(await self.exit_code())}")

    async def _lost(self) -> RankReply:
        """The cell's reply of a rank that died before it sent one."""
        code = await self.exit_code()
        await self.pipes.drained()  # its last lines are still on their way
        crash = location.crash_summary(self.pipes.crash)
        error = RankError.lost(self.exit_reason(code), self.pipes.tail, crash)
        return RankReply(self.rank, RankStatus.LOST, error=error, exit_code=code)

    def exit_reason(self, code: int | None) -> str:
        why = describe_exit(code)
        return f"{why} ({self.killed_because})" if self.killed_because else why

    async def where(self, stack: bool = True) -> RankWhere:
        """Where the rank is (``RankStacks.where``)."""
        return await self.stacks.where(stack, busy=self.running is not None)

    async def exit_code(self) -> int | None:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(None, self.proc.wait, STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            return None

    def explain(self, what: str) -> str:
        lines = "\n".join(f"    {line}" for line in self.pipes.tail)
        return f"rank {self.rank} (node {self.agent.node}) {what}" + (
            f"\n  last lines:\n{lines}" if lines else ""
        )

    def signal(self, signum: int) -> None:
        signal_session(self.proc.pid, signum)

    def kill(self, reason: str) -> None:
        if self.proc.poll() is None:
            self.killed_because = reason
            self.signal(signal.SIGKILL)

    async def stop(self) -> None:
        self.stopping = True
        if self.proc.poll() is None:
            await self.send(Stop())
            if await self.exit_code() is None:
                self.signal(signal.SIGKILL)
                await self.exit_code()
        await self._session_gone()
        self.signal(signal.SIGKILL)  # children the rank left in its session (DataLoader workers)
        for conn in (self.conn, self.stacks.conn):
            if not conn.closed:
                self._loop.remove_reader(conn.fileno())  # never a closed fd on the loop
                conn.close()
        self._files.close()
        self._control.close()
        if not self._dead:  # its end was not read: the socket is closed now
            self._gone()

    async def _session_gone(self) -> None:
        """Give what the rank started a moment to end on its own: multiprocessing's resource
        tracker unlinks the shared memory a dead rank leaked, and it ignores SIGTERM."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _SESSION_GRACE_S
        while loop.time() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except (ProcessLookupError, PermissionError):
                return
            await asyncio.sleep(0.02)
