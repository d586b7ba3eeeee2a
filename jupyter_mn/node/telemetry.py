"""What a node reports besides output: GPU samples, the NCCL transport, and the ``--rdma`` setup.

The node agent owns one ``NodeTelemetry``. It adds the ranks' NCCL/torch debug variables (NCCL's
INFO lines go to a file per rank, so the user's stream stays clean unless they asked for
``--debug`` or set ``NCCL_DEBUG`` themselves), samples GPUs about once a second while a cell
runs, and publishes a ``TransportReport`` whenever NCCL's lines prove something new.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path

from ..errors import TransportError
from ..rank.flight import FR_BUFFER_SIZE
from ..wire.events import GpuSample, OnEvent, TransportReport
from ..wire.launchspec import Launch
from . import rdma
from .gpu import GpuSampler, RankProcess
from .nccllog import NcclLog

SAMPLE_S = 1.0
DEBUG_ENV = {
    "NCCL_DEBUG": "INFO",
    "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
    "TORCH_SHOW_CPP_STACKTRACES": "1",
}


class NodeTelemetry:
    """Per-node GPU and transport reporting; ``publish`` sends an event (any thread)."""

    def __init__(self, node: int, launch: Launch, publish: OnEvent) -> None:
        self.node, self.publish = node, publish
        self.debug = launch.debug
        self.plan = rdma.plan(nccl_version=rdma.installed_nccl_version()) if launch.rdma else None
        self.nnodes = launch.nnodes
        # one node uses no network: --require-rdma has nothing to require there (gang/transport)
        needed = launch.require_rdma and launch.nnodes > 1
        if self.plan is not None and needed and not self.plan.usable:
            raise TransportError(
                f"--require-rdma: node {node} has no usable RDMA port: "
                + "; ".join(self.plan.labels)
            )
        user_env = {**os.environ, **launch.env}
        #: NCCL lines come through the ranks' pipes (shown) rather than a file (hidden)
        self.from_streams = self.debug or "NCCL_DEBUG" in user_env
        sweep_stale()
        self.dir = Path(
            tempfile.mkdtemp(prefix=f"{_PREFIX}{launch.job}-node{node}-p{os.getpid()}-")
        )
        self._log = NcclLog()
        self._lock = threading.Lock()
        self._offsets: dict[Path, int] = {}
        self._ranks: list[RankProcess] = []
        self._backend = "nccl"
        self._published: TransportReport | None = None
        self._sampler: GpuSampler | None = None
        self._noted = False
        self._running = False
        self._final = False  # one last look is due: a cell ended
        self._poll_lock = threading.Lock()

    # ---- before the ranks start
    def rank_env(self, rank: int, env: dict[str, str]) -> dict[str, str]:
        """Variables to add for one rank (never overriding what the user or node set)."""
        extra = {"TORCH_FR_BUFFER_SIZE": FR_BUFFER_SIZE}
        if self.plan is not None:
            extra.update(self.plan.env)
        if self.debug:
            extra.update(DEBUG_ENV)
        elif not self.from_streams:
            extra.update(
                NCCL_DEBUG="INFO",
                NCCL_DEBUG_SUBSYS="INIT,NET",
                NCCL_DEBUG_FILE=str(self.dir / f"nccl-rank{rank}.log"),
            )
        return {k: v for k, v in extra.items() if k not in env}

    # ---- once the ranks are up
    def started(self, ranks: list[RankProcess], backends: set[str]) -> None:
        self._ranks = ranks
        self._backend = "nccl" if "nccl" in backends else "gloo"
        self._sampler = GpuSampler()
        self._sample()
        self.poll(force=True)

    def restarted(self, ranks: list[RankProcess]) -> None:
        """The node's ranks were replaced (one was lost): sample the new processes."""
        self._ranks = ranks

    def line(self, text: str) -> None:
        """A line a rank printed (on the agent's loop); NCCL's are parsed as they come."""
        if self.from_streams and "NCCL" in text:
            with self._lock:
                self._log.feed(text)

    def cell(self, running: bool) -> bool:
        """A cell starts or ends; the agent's periodic task does the looking (off the cell's path).
        Returns whether a last look is due now.

        Nothing is re-sent at a cell's start: the kernel keeps each node's last report and
        shows it to the new cell's view (``Gang.replay``), so a trivial cell costs no events.
        """
        self._running = running
        self._final = self._final or (not running and not self.idle)
        return self._final

    @property
    def idle(self) -> bool:
        """A look would find nothing new: no GPU to sample (that was said once) and gloo, whose
        transport no NCCL line changes. Then a cell's end costs no look (a thread hop, a glob)."""
        sampler = self._sampler
        no_gpu = sampler is not None and bool(sampler.note) and self._noted
        return self._backend == "gloo" and no_gpu

    def due(self, period_over: bool) -> bool:
        """Whether to ``look`` now: every ``SAMPLE_S`` while a cell runs, once at its end."""
        return self._final or (self._running and period_over)

    def look(self) -> None:
        """Sample the GPUs and read NCCL's lines (blocking: the agent calls it in a thread)."""
        self._final = False
        self._sample()
        self.poll()

    def report(self) -> TransportReport:
        hcas = self.plan.labels if self.plan is not None else ()
        if self._backend == "gloo":
            one_node = self.nnodes == 1
            return TransportReport(node=self.node, backend="gloo", hcas=hcas, one_node=one_node)
        with self._lock:
            return self._log.report(self.node, hcas, self.nnodes)

    def poll(self, force: bool = False) -> None:
        """Read what NCCL appended to the rank files; publish the report if it changed."""
        with self._poll_lock:
            if not self.from_streams:
                for path in sorted(self.dir.glob("nccl-rank*.log")):
                    self._read(path)
            report = self.report()
            if force or report != self._published:
                self._published = report
                self.publish(report)

    def _read(self, path: Path) -> None:
        offset = self._offsets.get(path, 0)
        with contextlib.suppress(OSError), path.open("rb") as f:
            if os.fstat(f.fileno()).st_size < offset:  # a relaunched rank truncated its file
                offset = 0
            f.seek(offset)
            data = f.read()
            complete = data.rfind(b"\n") + 1  # leave a half-written line for next time
            self._offsets[path] = offset + complete
            with self._lock:
                self._log.feed_all(data[:complete].decode("utf-8", "replace").splitlines())

    def _sample(self) -> None:
        sampler = self._sampler
        if sampler is None or (sampler.note and self._noted):
            return  # "no GPU" is said once
        self._noted = bool(sampler.note)
        self.publish(GpuSample(self.node, sampler.sample(self._ranks), sampler.note))

    def close(self) -> None:
        if self._sampler is not None:
            self._sampler.close()
        shutil.rmtree(self.dir, ignore_errors=True)


#: The NCCL log folders of node agents: ``jupyter-mn-nccl-<job>-node<N>-p<agent pid>-<random>``;
#: the pid is the last ``-node<N>-p<pid>-`` of the name (a job may be called ``bert-node2-p4``),
#: and no other folder of a gang starts so (its copy of the notebook's directory included).
_PREFIX = "jupyter-mn-nccl-"
_OWNER = re.compile(r"-node\d+-p(\d+)-[^-]+$")


def sweep_stale() -> None:
    """Remove this user's NCCL log folders whose agent is gone (killed before its ``close``):
    every agent that starts cleans up after those that crashed."""
    for folder in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*-node*-p*-*"):
        found = _OWNER.search(folder.name)
        with contextlib.suppress(OSError):
            if found and folder.lstat().st_uid == os.getuid() and not _alive(int(found[1])):
                shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
