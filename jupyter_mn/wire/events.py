"""Events shared by both sides: node agents publish them, views and the registry consume them.

They cross dask's event channel (``log_event`` / ``subscribe_topic``), which carries msgpack, so
each event travels as a plain dict tagged with its kind and is rebuilt with ``from_msg``.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import pickle
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .rankwhere import RankWhere
from .values import Pickled

_KINDS: dict[str, type] = {}


class _Text(str, enum.Enum):
    """An enum whose members are their text: in messages, views and f-strings alike."""

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:  # a list of statuses prints as the strings it compares equal to
        return repr(self.value)

    __format__ = str.__format__


class GangStatus(_Text):
    """The gang's lifecycle (its allowed moves: ``gang/lifecycle.py``)."""

    PENDING = "PENDING"
    SCHEDULING = "SCHEDULING"
    RENDEZVOUS = "RENDEZVOUS"
    READY = "READY"
    RUNNING = "RUNNING"
    BROKEN = "BROKEN"
    CLOSED = "CLOSED"

    @property
    def usable(self) -> bool:
        return self in (GangStatus.READY, GangStatus.RUNNING)

    @property
    def idle(self) -> bool:
        return self == GangStatus.READY


class RankStatus(_Text):
    """A rank's life (started, ready, exited, lost between cells) and its outcome of a run."""

    STARTED = "started"
    READY = "ready"
    EXITED = "exited"
    #: died while no cell ran: nobody waits for it, so the gang re-forms it itself
    LOST_IDLE = "lost-idle"
    OK = "ok"
    ERROR = "error"
    LOST = "lost"
    INTERRUPTED = "interrupted"


class HoursUnit(_Text):
    """What a gang's count of held devices is in: GPUs, or CPU ranks where there are none."""

    GPU = "GPU-hours"
    RANK = "rank-hours"


class CellOutcome(_Text):
    """How a cell ended, as its view says it: kept apart from the gang's state (a failed cell
    leaves a READY gang)."""

    DONE = "DONE"
    FAILED = "FAILED"
    #: a rank (or its node) was lost while the cell ran
    LOST = "LOST"
    INTERRUPTED = "INTERRUPTED"
    #: interrupted (the stop button, ``--timeout``, ``--hang-timeout``) with a hang verdict
    HUNG = "HUNG"
    PREEMPTED = "PREEMPTED"


def _event(cls: type) -> type:
    _KINDS[cls.__name__] = cls
    return cls


@_event
@dataclass(frozen=True)
class LogLines:
    """Lines a node's ranks wrote, batched (~5 ms). ``seq`` counts batches per node agent."""

    node: int
    seq: int
    #: (rank, "out" | "err", lines) in the order each rank wrote them ("error": a root cause's
    #: traceback, in a job's logs)
    items: tuple[tuple[int, str, tuple[str, ...]], ...]
    #: (rank, stream, text): the line each rank is still writing, after ``items`` (a progress
    #: bar redrawn with \r; "": none any more). A finished line in ``items`` ends its rank's.
    partial: tuple[tuple[int, str, str], ...] = ()


@dataclass(frozen=True)
class DisplayOutput:
    """One of rank 0's display calls: ``display`` (new output), ``update`` (``update_display``
    of ``display_id``) or ``clear`` (``clear_output``; ``wait``: when the next output comes)."""

    kind: str
    #: the mime bundle (``image/png`` base64, ``text/html``, ``text/plain``, …) and its metadata
    data: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    display_id: str = ""
    wait: bool = False


@_event
@dataclass(frozen=True)
class Displays:
    """Rank 0's display outputs while a cell runs, batched and compacted by its node agent (what
    a later ``clear`` or ``update`` makes moot is dropped). ``seq`` counts with ``LogLines``."""

    node: int
    seq: int
    rank: int
    outputs: tuple[DisplayOutput, ...] = ()


@_event
@dataclass(frozen=True)
class RankState:
    """A rank process changed state: started, ready, exited (with code / signal)."""

    node: int
    rank: int
    state: RankStatus
    detail: str = ""
    #: the cell run the state belongs to (0: none); events can arrive after the run's replies
    run: int = 0
    #: this rank's failure is a cause, not a consequence of another rank's (the others stop)
    primary: bool = False


@_event
@dataclass(frozen=True)
class GangState:
    """The gang moved to ``state``."""

    state: GangStatus
    detail: str = ""


@dataclass(frozen=True)
class GpuStat:
    """One GPU at one instant (NVML). Memory in MiB; ``ranks`` are the ranks using it."""

    index: int
    name: str
    util: int
    mem_used: int
    mem_total: int
    power_w: float | None = None
    temp_c: int | None = None
    ranks: tuple[int, ...] = ()


@_event
@dataclass(frozen=True)
class GpuSample:
    """A node's GPUs, sampled ~1 Hz while a cell runs; ``note`` says why there are none."""

    node: int
    gpus: tuple[GpuStat, ...] = ()
    note: str = ""


#: What a one-node gang's transport says in place of a network.
NO_NETWORK = "no network (one node)"


@_event
@dataclass(frozen=True)
class TransportReport:
    """How a node's ranks talk: what NCCL chose (from its INFO lines), or gloo on CPU.

    ``node`` is -1 for a report built from arbitrary log files (``python -m jupyter_mn.nccl``).
    """

    node: int = -1
    backend: str = "nccl"
    #: "IB", "RoCE", "EFA", "Socket", another plugin's name, or "" when not known yet
    network: str = ""
    inter_node: tuple[str, ...] = ()
    intra_node: tuple[str, ...] = ()
    gdr: bool = False
    nvls: bool = False
    #: NCCL uses TCP sockets where RDMA was possible or asked for
    fallback: bool = False
    reasons: tuple[str, ...] = ()
    evidence: tuple[str, ...] = ()
    #: RDMA ports found on the node (``--rdma``), e.g. "mlx5_0:1 RoCE v2 GID 3 (eth1)"
    hcas: tuple[str, ...] = ()
    #: the gang has one node: its ranks use no network (nothing can fall back)
    one_node: bool = False

    @property
    def summary(self) -> str:
        if self.backend == "gloo":
            return "gloo (CPU)"
        parts = []
        if self.inter_node:
            parts.append("inter-node " + ", ".join(self.inter_node))
        elif self.one_node:
            parts.append(NO_NETWORK)
        elif self.network:
            parts.append(f"network {self.network}")
        elif not self.intra_node:
            return "NCCL (no transport lines yet)"
        if self.intra_node:
            parts.append("intra-node " + ", ".join(self.intra_node))
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        """The CLI's shape: keys network, inter_node, intra_node, gdr, fallback, evidence, …"""
        out = dataclasses.asdict(self)
        for key in ("node", "hcas"):
            out.pop(key)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}


@dataclass(frozen=True)
class RankTiming:
    """Where one rank's time went in a cell (for the straggler hint).

    ``collective`` is the last collective the rank entered during the cell (torch's flight
    recorder), ``entered_s`` how long after the rank's cell start it got there, and
    ``waited_s`` how long it then waited for the last rank to arrive.
    """

    rank: int
    node: int
    status: RankStatus
    cell_s: float | None = None
    collective: str = ""
    entered_s: float | None = None
    waited_s: float | None = None


@_event
@dataclass(frozen=True)
class CellDone:
    """A cell finished on the gang, ``outcome`` saying how."""

    cell_id: int
    elapsed: float
    ranks: tuple[RankTiming, ...] = ()
    #: the root cause in one line when the cell failed ("rank 1 (node 0) raised …")
    error: str = ""
    #: rank 0's value as text (its repr, shortened), for a view that cannot have the object: a
    #: page reloaded while the cell ran
    value: str = ""
    outcome: CellOutcome = CellOutcome.DONE
    #: nodes × GPUs × this cell's seconds, and the gang's count so far (``model/usage.py``)
    hours: float = 0.0
    gang_hours: float = 0.0
    unit: HoursUnit = HoursUnit.GPU
    #: why it was stopped (``interrupted by the user``, ``--timeout 5 s reached``); "": it was not
    stopped: str = ""
    #: the hang verdict when it was stopped while ranks waited in a collective
    verdict: str = ""
    #: the root-cause rank (-1: none) and its traceback: the job's logs keep them
    cause_rank: int = -1
    cause_node: int = -1
    traceback: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """Every rank finished the cell (no rank failed, none was stopped or lost)."""
        return self.outcome is CellOutcome.DONE


@_event
@dataclass(frozen=True)
class Note:
    """A line for the user from the kernel side (waiting for workers, preflight passed, a retry,
    ranks restarted, …)."""

    text: str


@_event
@dataclass(frozen=True)
class RankPaused:
    """A rank of a running cell stopped at a ``breakpoint()``; its pdb waits for the kernel
    (``NodeAgent.debug``), and the cell's ``--timeout`` waits with it."""

    node: int
    rank: int
    run: int
    #: where it stopped, in the notebook's terms (``Cell In[4], line 7``)
    where: str = ""


@_event
@dataclass(frozen=True)
class RunStarted:
    """A cell, script or command started on the gang: the registry counts cells from it and
    marks the logs (``what``: ``In[7]``, ``%cluster run train.py``)."""

    run: int
    what: str
    #: the notebook cell's number, for a cell (0: not a cell)
    cell: int = 0


@_event
@dataclass(frozen=True)
class RankResumed:
    """The user let a paused rank go on (``c``, ``q``) or the cell was stopped at its prompt."""

    node: int
    rank: int
    run: int


@_event
@dataclass(frozen=True)
class Stacks:
    """Where every rank was when a cell was interrupted or timed out, or on request: its stack
    in the cell's own line numbers (``Cell In[5], line 3``, innermost last) and its latest
    collectives; ``verdict`` explains a hang in one line (``verdict.py``), "" when none."""

    reason: str
    ranks: tuple[RankWhere, ...]
    verdict: str = ""
    #: taken by a stop: the cell's error says the verdict, so the text view does not
    stop: bool = False


@_event
@dataclass(frozen=True)
class Hung:
    """The hang watchdog (``--hang-timeout``) fired: no rank completed a collective or ended
    the cell for ``silent_s`` while some waited in one. The cell keeps running; ``over`` when the
    ranks progress again after it fired."""

    verdict: str
    silent_s: float
    over: bool = False


@_event
@dataclass(frozen=True)
class NodesWaiting:
    """Nodes not up yet, and why (Kubernetes: the pods' pending reason); no nodes: the gang."""

    nodes: tuple[int, ...]
    reason: str
    message: str = ""

    @property
    def text(self) -> str:
        if not self.nodes:
            who = "gang"
        else:
            who = ("node " if len(self.nodes) == 1 else "nodes ") + number_ranges(self.nodes)
        return f"{who}: {self.reason}" + (f" ({self.message})" if self.message else "")


def number_ranges(numbers: tuple[int, ...]) -> str:
    """``(0, 1, 2, 5)`` → ``"0-2, 5"``: many nodes named in one short line."""
    parts: list[str] = []
    for n in sorted(numbers):
        if parts and parts[-1].split("-")[-1] == str(n - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{n}"
        else:
            parts.append(str(n))
    return ", ".join(parts)


class PreemptCause(_Text):
    """Who asked a node to go: a Slurm job's signal (preemption, requeue, ``--signal=TERM@S``
    before its time limit), a pod's deletion (eviction, preemption), or a SIGTERM to a node
    process elsewhere."""

    SLURM = "slurm"
    POD = "pod"
    SIGNAL = "signal"

    @property
    def text(self) -> str:
        return {
            PreemptCause.SLURM: "Slurm sent SIGTERM (preemption, requeue or time limit)",
            PreemptCause.POD: "its pod is being deleted (eviction or preemption)",
            PreemptCause.SIGNAL: "its process got SIGTERM",
        }[self]


@_event
@dataclass(frozen=True)
class Preemption:
    """Node ``node`` was told to go and will be stopped at ``deadline`` (wall-clock seconds):
    its agent tells the kernel, the kernel every node, each node its ranks
    (``checkpoint.preempted()``, ``cluster_info().preemption``)."""

    node: int
    cause: PreemptCause
    deadline: float
    signal: str = "SIGTERM"

    def left(self, now: float | None = None) -> float:
        """Seconds of the grace period left."""
        return max(self.deadline - (time.time() if now is None else now), 0.0)

    @property
    def text(self) -> str:
        return f"node {self.node}: {self.cause.text}"


@_event
@dataclass(frozen=True)
class RankError:
    """A rank's exception, as text: its type, message and traceback in the cell's lines."""

    ename: str
    evalue: str
    traceback: tuple[str, ...] = ()
    #: a consequence of another rank's failure (a broken collective, an interrupt)
    secondary: bool = False
    #: the rank's node agent stopped answering (``NodeLost``), which explains its peers' kills
    node_lost: bool = False

    def line(self) -> str:
        return f"{self.ename}: {self.evalue}" if self.evalue else self.ename

    @classmethod
    def raised(
        cls, exc: BaseException, traceback: Iterable[str], secondary: bool = False
    ) -> RankError:
        """What a rank's cell raised, with its traceback as the rank formatted it."""
        return cls(type(exc).__name__, str(exc), tuple(traceback), secondary)

    @classmethod
    def lost(cls, reason: str, tail: Iterable[str] = (), crash: Iterable[str] = ()) -> RankError:
        """A rank process that ended without a reply: how it ended (``reason``), its last
        output lines and, from a fatal signal, where it crashed."""
        last = tuple(tail)
        return cls("RankLost", reason, (*(("last lines:", *last) if last else ()), *crash))


@_event
@dataclass(frozen=True)
class RankReply:
    """One rank's outcome of a cell (its process sends it: ``rankwire.py``) or a script (its
    node agent judges it: ``node/script.py``)."""

    rank: int
    #: ``RankStatus.OK | ERROR | INTERRUPTED | LOST``
    status: RankStatus
    duration: float | None = None
    error: RankError | None = None
    #: wall-clock time the rank finished (orders failures: the first one is the cause)
    finished_at: float | None = None
    #: the last collective of the cell (``rank.timing``), for the straggler hint
    collective: dict[str, Any] | None = None
    #: rank 0's value, pickled; its ``repr`` when it could not be
    value: Pickled | None = None
    value_repr: str | None = None
    displays: tuple[Any, ...] = ()
    pulled: dict[str, Pickled] | None = None
    notes: tuple[str, ...] = ()
    #: a script's exit status
    exit_code: int | None = None
    #: the newest checkpoint this rank saw COMPLETE after a preemption notice, and how many
    #: seconds after the notice (``checkpoint.save``)
    checkpoint: str = ""
    checkpoint_after_s: float | None = None


@_event
@dataclass(frozen=True)
class NodeReply:
    """A node agent's answer to a cell or a script: its ranks' outcomes, and the number of the
    last log batch it sent before answering (the kernel shows lines up to it first)."""

    node: int
    seq: int
    ranks: tuple[RankReply, ...] = ()
    #: the ranks whose replies went to the kernel ahead of this one, their values with them
    #: (``valueahead.py``); here those replies have no value
    ahead: tuple[int, ...] = ()

    @property
    def failed(self) -> bool:
        return any(r.status != RankStatus.OK for r in self.ranks)

    def with_ahead(self, replies: dict[int, RankReply]) -> NodeReply:
        """This reply with the rank ``replies`` it names as ahead in their places; the others
        (a reply cut short by its rank's death) are dropped."""
        if not self.ahead:
            return self
        ranks = tuple(replies[r.rank] if r.rank in self.ahead else r for r in self.ranks)
        return dataclasses.replace(self, ranks=ranks, ahead=())

    def packed(self) -> bytes:
        """What the agent returns to the kernel: the reply pickled once, as it is. Dask sizes
        and frames a bytes result at once (a nested dict cost it a recursive ``sizeof``), and
        unpickling rebuilds the frozen parts directly, where ``from_msg`` rebuilt each rank's
        from a dict (most of the kernel's CPU for a cell at 8 nodes × 8 ranks)."""
        return pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def of(cls, packed: bytes | NodeReply) -> NodeReply:
        """From ``packed()`` bytes (an actor call's reply), or as the cell stream decoded it."""
        reply = pickle.loads(packed) if isinstance(packed, bytes) else packed
        if not isinstance(reply, NodeReply):
            raise TypeError(f"expected a NodeReply, got {type(reply).__name__}")
        return reply


Event = (
    LogLines
    | Displays
    | RankState
    | GangState
    | GpuSample
    | TransportReport
    | CellDone
    | Note
    | NodesWaiting
    | Stacks
    | Hung
    | Preemption
)
#: What views, listeners and the run protocol are called with.
OnEvent = Callable[[Event], None]
#: Fields holding nested parts, rebuilt by ``from_msg`` after the msgpack trip: (type, many).
_NESTED: dict[type, dict[str, tuple[type, bool]]] = {
    GpuSample: {"gpus": (GpuStat, True)},
    Displays: {"outputs": (DisplayOutput, True)},
    CellDone: {"ranks": (RankTiming, True)},
    RankReply: {"error": (RankError, False)},
    NodeReply: {"ranks": (RankReply, True)},
}
#: Fields that travel as an enum's value and are rebuilt as its member.
_ENUMS: dict[type, dict[str, type[enum.Enum]]] = {
    GangState: {"state": GangStatus},
    RankState: {"state": RankStatus},
    RankReply: {"status": RankStatus},
    RankTiming: {"status": RankStatus},
    Preemption: {"cause": PreemptCause},
    CellDone: {"unit": HoursUnit, "outcome": CellOutcome},
}


def to_msg(event: Any) -> dict[str, Any]:
    msg = dataclasses.asdict(event, dict_factory=_plain)
    msg["kind"] = type(event).__name__
    return msg


def _plain(fields: list[tuple[str, Any]]) -> dict[str, Any]:
    """A message's fields with enum members as their values: dask's event channel takes only
    exact builtin types."""
    return {k: v.value if isinstance(v, enum.Enum) else v for k, v in fields}


def from_msg(msg: dict[str, Any]) -> Any:
    return _build(_KINDS[msg["kind"]], msg)


def _build(cls: type, msg: dict[str, Any]) -> Any:
    names = _field_names(cls)
    msg = {k: v for k, v in msg.items() if k in names}  # dask adds e.g. "worker"
    if cls is LogLines:
        msg["items"] = tuple((r, s, tuple(lines)) for r, s, lines in msg["items"])
        msg["partial"] = tuple(tuple(p) for p in msg.get("partial", ()))
    for name, (part, many) in _NESTED.get(cls, {}).items():
        value = msg.get(name)
        if many:
            msg[name] = tuple(_build(part, p) for p in value or ())
        elif value is not None:
            msg[name] = _build(part, value)
    for name, kind in _ENUMS.get(cls, {}).items():
        msg[name] = kind(msg[name])
    return cls(**_tuples(msg))


@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    """An event's field names (``dataclasses.fields`` walks the class each call: every event
    from an agent, and every rank's report on the agents)."""
    return frozenset(f.name for f in dataclasses.fields(cls))


def _tuples(values: dict[str, Any]) -> dict[str, Any]:
    """msgpack turns tuples into lists; frozen events keep tuples."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
