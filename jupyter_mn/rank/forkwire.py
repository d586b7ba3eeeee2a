"""The messages between a node agent and its rank template (``rank/prefork.py``), both ways.

The agent sends ``ForkRank`` with the new process's file descriptors beside it (SCM_RIGHTS on
a SOCK_SEQPACKET socket: one message a packet); the template answers ``Forked`` (or
``ForkFailed``) and later ``Exited`` for each process it forked, since only a parent may
collect its children's exit status. Both ends import this module: a leaf, stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The template's modules to import, comma-separated, in its environment (not on its command
#: line, which its ranks overwrite with theirs: ``procview.py``).
PRELOAD = "JUPYTER_MN_TEMPLATE_PRELOAD"
#: The template's ends of its sockets, one per agent it serves (descriptor numbers, comma-
#: separated), in its environment.
SOCKET_FD = "JUPYTER_MN_TEMPLATE_FD"
#: The node process a node's own template serves, in its environment (a SIGTERM to the
#: template goes on to it); unset for the local backend's template, which the kernel starts for
#: all of a gang's nodes and which learns them from their requests (``ForkRank.node``).
NODE_PID = "JUPYTER_MN_TEMPLATE_NODE_PID"
#: Largest message either end reads (a rank's environment is a few KiB).
MAX_MESSAGE = 1 << 20


@dataclass(frozen=True)
class TemplateReady:
    """Template → agent: its imports are done (CUDA untouched); it forks from now on. ``env``:
    what it started with (a rank whose variables read at a start differ starts anew), ``room``:
    the bytes its command line and its environment take (``procview.room``)."""

    pid: int
    env: dict[str, str]
    room: tuple[int, int]


@dataclass(frozen=True)
class TemplateFailed:
    """Template → agent: an import failed (or initialized CUDA); it exits, ranks start anew."""

    error: str


@dataclass(frozen=True)
class ForkRank:
    """Agent → template: fork a process that runs ``python -m module`` would, in ``cwd`` with
    exactly ``env``. Beside it travel its stdout and stderr (pipes' write ends), then one
    descriptor for each of ``fds``: the numbers they must have in the new process (the agent's
    own numbers, which ``env`` names)."""

    module: str
    env: dict[str, str]
    cwd: str | None
    fds: tuple[int, ...] = ()
    #: the asking node's process (its agent's pid): where a SIGTERM from this rank goes on to
    node: int = 0


@dataclass(frozen=True)
class Forked:
    """Template → agent: the new process runs as ``pid``, leading its own session."""

    pid: int


@dataclass(frozen=True)
class ForkFailed:
    """Template → agent: it could not fork (the agent starts that rank anew instead)."""

    error: str


@dataclass(frozen=True)
class Exited:
    """Template → agent: a process it forked ended; ``returncode`` as ``Popen`` has it
    (``-N``: killed by signal N)."""

    pid: int
    returncode: int
