"""A training script on one node's ranks (``%cluster run train.py``), the way torchrun runs it.

Each rank is a fresh ``python -u SCRIPT ARGS`` (or ``-m MODULE``) process with torchrun's
environment and its own rendezvous port (the warm gang's rank 0 keeps its TCPStore on
MASTER_PORT), so an unchanged script that calls ``init_process_group()`` (env://) works. Output
goes through the node agent's log path like a cell's. As torchrun does, the first rank to fail
stops the others; its traceback comes from torchelastic's error file (``@record``) or else from
its last stderr lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..rank import nobreak
from ..rank.causes import says_secondary
from ..rank.env import rank_env
from ..wire.events import RankError, RankReply, RankStatus
from ..wire.launchspec import Launch, Script
from .exits import describe_exit
from .netif import socket_ifname
from .nodelink import NodeLink
from .pipes import TAIL_LINES, PipeReader
from .process import STOP_GRACE_S, signal_session, start_in_session

ERR_TAIL_LINES = 200
_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s?")
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::\s?(.*))?$")


class ScriptRank:
    """One script process: its pipes go to the agent's log like a cell rank's; no control socket."""

    def __init__(
        self,
        agent: NodeLink,
        local_rank: int,
        rank: int,
        argv: list[str],
        env: dict[str, str],
        cwd: str | None,
    ) -> None:
        self.local_rank = local_rank
        self.rank = rank
        self.pipes = PipeReader(agent, rank, err_lines=ERR_TAIL_LINES)
        self.stopped_by: str = ""
        self._outcome: RankReply | None = None
        self.duration: float | None = None
        self.finished_at: float | None = None
        self.error_file = env["TORCHELASTIC_ERROR_FILE"]
        self.started = time.perf_counter()
        self.proc = start_in_session(argv, env, cwd)
        self.pipes.start(self.proc)

    def signal(self, signum: int) -> None:
        signal_session(self.proc.pid, signum)

    async def finished(self) -> ScriptRank:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.proc.wait)
        self.duration = time.perf_counter() - self.started
        self.finished_at = time.time()
        await self.pipes.drained()  # both pipes read to the end
        return self

    def outcome(self) -> RankReply:
        """Status, exit code and error; fixed once the process has exited."""
        if self._outcome is None:
            out = self._judge()
            if self.proc.returncode is None:
                return out
            self._outcome = out
        return self._outcome

    def _judge(self) -> RankReply:
        code = self.proc.returncode
        status, error = self._failure(code)
        return RankReply(self.rank, status, self.duration, error, self.finished_at, exit_code=code)

    def _failure(self, code: int | None) -> tuple[RankStatus, RankError | None]:
        """How the process ended: ok, or the status and error its exit code and output say."""
        # an uncaught exception ends in exit code 1, or in SIGABRT when gloo aborts at exit
        raised = self._raised(code) if code and (code > 0 or code == -signal.SIGABRT) else None
        if self.stopped_by:
            return RankStatus.INTERRUPTED, RankError("Stopped", self.stopped_by, secondary=True)
        if raised:
            return RankStatus.ERROR, raised
        if code is not None and code < 0:
            return RankStatus.LOST, RankError.lost(describe_exit(code), self.pipes.tail)
        if code:
            lines = [_RANK_PREFIX.sub("", line) for line in self.pipes.err_tail]
            return RankStatus.ERROR, _from_lines(lines[-TAIL_LINES:], code, traceback=False)
        return RankStatus.OK, None

    def _raised(self, code: int) -> RankError | None:
        """The script's uncaught exception: torchelastic's error file (``@record``), else stderr."""
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            message = json.loads(Path(self.error_file).read_text())["message"]
            lines = message["extraInfo"]["py_callstack"].rstrip().splitlines()
            return _from_lines(lines, code, traceback=True)
        # torch prefixes an uncaught exception's lines with "[rankN]: " (its excepthook)
        lines = [_RANK_PREFIX.sub("", line) for line in self.pipes.err_tail]
        start = _last_traceback(lines)
        return None if start is None else _from_lines(lines[start:], code, traceback=True)


def _last_traceback(lines: list[str]) -> int | None:
    """Where the last Python traceback in ``lines`` starts."""
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent")]
    return starts[-1] if starts else None


def _from_lines(lines: list[str], code: int, traceback: bool) -> RankError:
    """The exception a Python traceback ends with, else the exit code and the last line."""
    if traceback:  # the exception line ends the last traceback's frames; what follows came later
        start = _last_traceback(lines)
        candidates = lines if start is None else lines[start + 1 :]
    else:
        candidates = lines[::-1]
    last = next((ln for ln in candidates if ln.strip() and not ln.startswith(" ")), "")
    found = _EXCEPTION_LINE.match(last) if traceback else None
    if found:
        ename, evalue = found.group(1), f"{found.group(2) or ''} ({describe_exit(code)})".lstrip()
    else:
        ename, evalue = "ScriptExit", describe_exit(code) + (f": {last}" if last else "")
    return RankError(ename, evalue, tuple(lines), says_secondary(evalue))


class ScriptRun:
    """This node's script processes: started at once, stopped together when one fails."""

    def __init__(self, agent: NodeLink, launch: Launch) -> None:
        assert launch.script is not None
        self.agent = agent
        self.folder = tempfile.mkdtemp(prefix="jupyter-mn-script-")
        argv = [sys.executable, "-u", *self._target(launch.script), *launch.script.args]
        self.ranks = [self._start(launch, argv, local) for local in range(launch.gpus)]
        for r in self.ranks:
            agent.rank_state(r.rank, RankStatus.STARTED, f"pid {r.proc.pid}")

    def _start(self, launch: Launch, argv: list[str], local: int) -> ScriptRank:
        node = self.agent.node
        rank = node * launch.gpus + local
        error_file = os.path.join(self.folder, f"error-{rank}.json")
        env = rank_env(  # torchrun's variables, and ours
            launch,
            node,
            local,
            error_file=error_file,
            socket_ifname=socket_ifname(launch.master_addr),
        )
        env.setdefault("PYTHONBREAKPOINT", nobreak.HOOK)  # no prompt can reach a script
        return ScriptRank(self.agent, local, rank, argv, env, launch.cwd)

    def _target(self, script: Script) -> list[str]:
        """``-m MODULE``, or the script's path (written here when the kernel sent its bytes)."""
        if script.module:
            return ["-m", script.path]
        path = script.path
        if script.source is not None:  # this node lacks it: the kernel sent its bytes
            path = os.path.join(self.folder, path)
            Path(path).write_bytes(script.source)
        return [path]

    async def wait(self) -> list[RankReply]:
        """Until every process exits (then their outcomes); the first failure stops this node's
        others at once."""
        pending = {asyncio.ensure_future(r.finished()) for r in self.ranks}
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    r = task.result()
                    status = r.outcome().status
                    if status not in (RankStatus.OK, RankStatus.INTERRUPTED):
                        self.agent.rank_state(r.rank, status, primary=True)
                        await self.stop(signal.SIGTERM, f"rank {r.rank} failed")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
        return [r.outcome() for r in self.ranks]

    def notify(self) -> None:
        """This node's preemption notice: SIGTERM to the processes still running (a script's own
        handler, Lightning's for one, saves); the agent kills what is left at the deadline."""
        for r in self.ranks:
            if r.proc.poll() is None:
                r.signal(signal.SIGTERM)

    async def stop(self, signum: int = signal.SIGTERM, why: str = "stopped by the kernel") -> None:
        """``signum`` to the processes still running, SIGKILL after a grace period."""
        running = [r for r in self.ranks if r.proc.poll() is None]
        for r in running:
            r.stopped_by = r.stopped_by or why
            r.signal(signum)
        await asyncio.gather(*(self._reap(r) for r in running))

    @staticmethod
    async def _reap(r: ScriptRank) -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(None, r.proc.wait, STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            r.signal(signal.SIGKILL)
