"""What every gang node the kernel connects back to runs, a Kubernetes pod (``pod.py``) or a
Slurm task (``slurm.py``): node 0 a TLS dask scheduler, every node one worker hosting its agent.

Dead-man switch: the scheduler exits when no kernel has been connected for ``orphan_timeout``
seconds (or none ever connected within ``connect_timeout``: ``OrphanGuard``, which a local gang's
scheduler also runs, ``localnode.py``); workers close when their scheduler goes, ranks exit with
their worker, so a dead kernel leaves nothing running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import Any

from distributed import Scheduler, Worker
from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.security import Security

from .daskconfig import DASK_CONFIG

log = logging.getLogger("jupyter_mn.scheduler")
#: The scheduler's own bookkeeping client, not a kernel.
_INTERNAL_CLIENTS = frozenset({"fire-and-forget"})


class OrphanGuard(SchedulerPlugin):
    """Close the scheduler once it has had no kernel client for ``orphan_timeout`` seconds, or
    once its last worker has gone (their agents stop them when the kernel falls silent)."""

    name = "jupyter-mn-orphan-guard"

    def __init__(self, orphan_timeout: float, connect_timeout: float) -> None:
        self.orphan_timeout = orphan_timeout
        self.connect_timeout = connect_timeout
        self.scheduler: Any = None
        self._timer: asyncio.TimerHandle | None = None
        self._closing: asyncio.Task[Any] | None = None

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self._arm(self.connect_timeout)

    def _kernels(self) -> list[str]:
        return [c for c in self.scheduler.clients if c not in _INTERNAL_CLIENTS]

    def add_client(self, scheduler: Any, client: str) -> None:
        if client not in _INTERNAL_CLIENTS and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def remove_client(self, scheduler: Any, client: str) -> None:
        if not [c for c in self._kernels() if c != client]:
            self._arm(self.orphan_timeout)

    def _arm(self, delay: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(delay, self._expire)

    def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        if not scheduler.workers:
            self._close("the nodes are gone")

    def _expire(self) -> None:
        self._timer = None
        if not self._kernels():
            log.warning("no kernel connected for %s s: shutting the gang down", self.orphan_timeout)
            self._close("the kernel is gone")

    def _close(self, why: str) -> None:
        if self._closing is None:
            self._closing = asyncio.ensure_future(self.scheduler.close(reason=f"jupyter-mn: {why}"))


#: Where the scheduler's and the worker's HTTP servers listen (``/info``, ``/json``, ``/metrics``,
#: in plain HTTP, which nothing of the gang uses): on loopback, a random port (never the readiness
#: port), not on the pod's or the Slurm node's network.
_HTTP = "127.0.0.1:0"


def security_of(ca: str, cert: str, key: str) -> Security:
    """TLS everywhere with one certificate (a path, or PEM text: dask takes either)."""
    return Security(
        require_encryption=True,
        tls_ca_file=ca,
        tls_scheduler_cert=cert,
        tls_scheduler_key=key,
        tls_worker_cert=cert,
        tls_worker_key=key,
        tls_client_cert=cert,
        tls_client_key=key,
    )


async def serve_node(
    *,
    node: int,
    host: str,
    scheduler: str,
    port: int,
    security: Security,
    orphan_timeout: float,
    connect_timeout: float,
    ready_port: int | None = None,
) -> None:
    """One node of a gang the kernel connects back to (a pod, a Slurm task): node 0 also runs
    the TLS scheduler on ``port`` (with the ``OrphanGuard``), every node one worker named after
    its node rank, listening on ``host``; ``ready_port`` opens once the worker has registered.
    Returns when the worker closes (its scheduler went, or SIGTERM)."""
    import dask

    loop = asyncio.get_running_loop()
    with dask.config.set(DASK_CONFIG):
        sched = None
        if node == 0:
            sched = await _scheduler(port, security, OrphanGuard(orphan_timeout, connect_timeout))
        worker = await Worker(
            scheduler,
            name=str(node),
            host=host,
            nthreads=1,
            security=security,
            preload=["jupyter_mn.node.agent"],
            memory_limit=0,
            death_timeout=connect_timeout,
            dashboard_address=_HTTP,
        )
        ready = None
        if ready_port is not None:
            ready = await asyncio.start_server(_hang_up, host, ready_port)
        # a plain handler, which the node agent replaces while it lives (node/preemption.py)
        closing: list[asyncio.Future[Any]] = []
        signal.signal(
            signal.SIGTERM,
            lambda *_: loop.call_soon_threadsafe(
                lambda: closing.append(asyncio.ensure_future(worker.close()))
            ),
        )
        try:
            await worker.finished()
        finally:
            if ready is not None:
                ready.close()
            if sched is not None:
                await sched.close(reason="jupyter-mn: node stopping")


async def _scheduler(port: int, security: Security, guard: OrphanGuard) -> Scheduler:
    """Node 0's TLS scheduler, on all interfaces: a port-forward arrives on the pod's
    loopback."""
    return await Scheduler(
        host="0.0.0.0",
        port=port,
        protocol="tls",
        security=security,
        dashboard=False,
        dashboard_address=_HTTP,
        plugins=[guard],
    )


async def _hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
