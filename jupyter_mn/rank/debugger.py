"""pdb on a rank, answered from the notebook (docs/architecture.md, "Debugging a rank").

A rank has no terminal: its stdin is ``/dev/null`` and its output goes to its agent's pipes. So
its pdb reads and writes a ``LineChannel`` over the control socket: what pdb writes is kept
until it reads a line, then sent with its prompt (``DebugPrompt``); the line comes back as a
``DebugLine``. ``breakpoint()`` and ``pdb.set_trace()`` open one where they are called, while the
cell runs; ``DebugStart`` opens one on the rank's last exception between cells.
"""

from __future__ import annotations

import io
import os
import pdb
import sys
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any, Protocol

from ..wire.debugwire import DebugEnded, DebugLine, DebugPrompt

#: Frames ``n`` and ``s`` step over: the rank's runtime and IPython around the cell, and bdb.
_NOT_THE_USERS = ["jupyter_mn.*", "IPython.*", "traitlets.*", "bdb"]


class Control(Protocol):
    """The rank's end of its control socket (``runtime.py``)."""

    def send(self, msg: Any) -> None: ...

    def recv(self) -> Any: ...

    def push_back(self, msg: Any) -> None: ...


class LineChannel(io.TextIOBase):
    """pdb's stdin and stdout (and ``sys``'s while it prompts: ``!print(x)``, ``interact``)."""

    def __init__(self, control: Control, rank: int, where: Callable[[], str]) -> None:
        self._control, self._rank, self._where = control, rank, where
        self._out: list[str] = []

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._out.append(text)
        return len(text)

    def take(self) -> str:
        text, self._out = "".join(self._out), []
        return text

    def readline(self, size: int | None = -1) -> str:
        """Send what was written (its unfinished last line is the prompt) and wait for a line;
        "" (end of input) when another message comes instead (the agent stops the rank)."""
        output, _, prompt = self.take().rpartition("\n")
        if "rank" not in prompt:  # ``interact``'s ">>> " says whose prompt it is too
            prompt = f"[rank {self._rank}] {prompt}"
        self._control.send(
            DebugPrompt(self._rank, output + "\n" if output else "", prompt, self._where())
        )
        msg = self._control.recv()
        if isinstance(msg, DebugLine):
            return msg.text + "\n"
        self._control.push_back(msg)
        return ""


class RankPdb(pdb.Pdb):
    """pdb on a ``LineChannel``; it says when it lets go (``DebugEnded``), so the kernel can
    prompt for the next rank. ``q`` at a breakpoint lets the rank go on and stops debugging it
    for the rest of the cell (the stop button stops the cell)."""

    def __init__(
        self, control: Control, rank: int, shell: Any, on_quit: Callable[[], None]
    ) -> None:
        self._control, self._rank, self._shell, self._on_quit = control, rank, shell, on_quit
        self.channel = LineChannel(control, rank, self._where)
        super().__init__(
            stdin=self.channel,
            stdout=self.channel,
            skip=_NOT_THE_USERS,
            nosigint=True,
            readrc=False,
        )
        self.prompt = f"(Pdb rank {rank}) "
        self._letting_go = False

    def _where(self) -> str:
        frame = getattr(self, "curframe", None)
        return describe(frame, self._shell) if frame is not None else ""

    def _cmdloop(self) -> None:
        """A Ctrl-C at the prompt interrupts the cell, as everywhere else on a rank (pdb's own
        loop would only cancel the command and prompt again)."""
        self.cmdloop()

    def interaction(self, frame: FrameType | None, tb: TracebackType | None) -> None:
        self._letting_go = False
        saved = sys.stdin, sys.stdout
        sys.stdin = sys.stdout = self.channel
        try:
            super().interaction(frame, tb)
        finally:
            sys.stdin, sys.stdout = saved
        if self._letting_go or tb is not None:  # else it stops again soon (``n``, ``s``)
            self.let_go()

    def let_go(self, error: str = "") -> None:
        self._control.send(DebugEnded(self._rank, self.channel.take(), error))

    def do_continue(self, arg: str) -> bool:
        self._letting_go = True
        return bool(super().do_continue(arg))

    do_c = do_cont = do_continue

    def do_quit(self, arg: str) -> bool:
        self._letting_go = True
        if self.botframe is None:  # a post-mortem: nothing runs on
            return bool(super().do_quit(arg))
        self.clear_all_breaks()
        self._on_quit()
        self.set_continue()
        return True

    do_q = do_exit = do_quit

    def do_EOF(self, arg: str) -> bool:
        self.message("")
        return self.do_quit(arg)


class _TorchPdb:
    """What ``torch.distributed.breakpoint`` makes and calls ``set_trace()`` on: this rank's
    pdb, stopped in the caller's frame (torch's note to type ``up`` first does not apply)."""

    def __init__(self, debugger: RankDebugger) -> None:
        self._debugger = debugger

    def message(self, text: str) -> None:
        pass

    def set_trace(self) -> None:
        self._debugger.set_trace(frame=sys._getframe(2))


def describe(frame: FrameType, shell: Any) -> str:
    """``Cell In[4], line 7``, or ``path:line, in function`` outside the notebook's cells."""
    code = frame.f_code
    name = shell.compile.format_code_name(code.co_filename)
    if name:
        return f"{name[0]} {name[1]}, line {frame.f_lineno}"
    return f"{code.co_filename}:{frame.f_lineno}, in {code.co_name}"


class RankDebugger:
    """This rank's debugging: the breakpoint hook, and the post-mortem of its last failure."""

    def __init__(self, control: Control, rank: int, shell: Any) -> None:
        self._control, self._rank, self._shell = control, rank, shell
        #: the kernel can answer a prompt during this cell (not papermill, not a ``--bg`` cell)
        self.prompts = False
        self._quit = False
        self._skipped = False
        self._opened = False  # a pdb traced this cell

    def install(self) -> None:
        """``breakpoint()``, ``pdb.set_trace()`` and ``torch.distributed.breakpoint()`` open
        this rank's pdb (torch's reads ``/dev/stdin``, which a rank does not have)."""
        sys.breakpointhook = self.breakpoint
        pdb.set_trace = self.set_trace
        import torch.distributed as dist

        if hasattr(dist, "_make_distributed_pdb"):  # its own timeout and barrier stay
            dist._make_distributed_pdb = lambda: _TorchPdb(self)

    def begin_cell(self, prompts: bool) -> None:
        self.prompts, self._quit, self._skipped, self._opened = prompts, False, False, False

    def end_cell(self) -> None:
        """The cell is over: a pdb still stepping lets go before the runtime's own code runs."""
        if self._opened:
            sys.settrace(None)

    def debugger(self) -> RankPdb:
        return RankPdb(self._control, self._rank, self._shell, self._stop_debugging)

    def _stop_debugging(self) -> None:
        self._quit = True

    def breakpoint(self, *args: Any, **kwargs: Any) -> None:
        self.set_trace(frame=sys._getframe(1))

    def set_trace(self, *, header: str | None = None, frame: FrameType | None = None) -> None:
        frame = frame or sys._getframe(1)
        if self._quit or os.environ.get("PYTHONBREAKPOINT") == "0":
            return
        if not self.prompts or threading.current_thread() is not threading.main_thread():
            self._skip(frame)
            return
        self._opened = True
        debugger = self.debugger()
        if header is not None:
            debugger.message(header)
        debugger.set_trace(frame)
        debugger.set_next(frame)  # the caller's next line, not what runs before it returns

    def _skip(self, frame: FrameType) -> None:
        """Nothing can answer a prompt: go on, and say so once a cell."""
        if not self._skipped:
            self._skipped = True
            why = (
                "nothing can answer a prompt here (a frontend without stdin, a --bg cell)"
                if not self.prompts
                else "only the main thread can prompt"
            )
            print(
                f"jupyter_mn: rank {self._rank} skipped breakpoint() at "
                f"{describe(frame, self._shell)}: {why}",
                file=sys.stderr,
            )

    def post_mortem(self, failure: BaseException | None) -> None:
        """pdb on ``failure``'s frames, from the cell's own on; ``DebugEnded`` says why not when
        this rank kept none."""
        if failure is None or failure.__traceback__ is None:
            self._control.send(
                DebugEnded(self._rank, error=f"rank {self._rank} has no failed cell to debug")
            )
            return
        tb = failure.__traceback__
        while tb.tb_next is not None and tb.tb_frame.f_globals is not self._shell.user_ns:
            tb = tb.tb_next  # the runtime's and IPython's frames above the cell
        debugger = self.debugger()
        debugger.reset()
        debugger.message(f"{type(failure).__name__}: {failure}")
        debugger.interaction(None, tb)
