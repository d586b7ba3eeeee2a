"""Local backend: one dask worker per virtual node on this machine (the embedded default).

Scheduler and workers listen on 127.0.0.1 with TLS (fresh certificates per gang). Workers ignore
SIGINT (a Jupyter interrupt signals the kernel's whole process group, workers included) and the
nanny does not force ``OMP_NUM_THREADS=1`` onto the ranks.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

from ..errors import SchedulingError
from ..node.daskconfig import DASK_CONFIG
from ..spec import ClusterSpec


class LocalProvisioner:
    backend = "local"

    def __init__(self) -> None:
        self._cluster: Any = None
        self._client: Any = None

    def provision(self, spec: ClusterSpec, gang_id: str) -> tuple[Any, list[str]]:
        import dask
        from distributed import Client, LocalCluster
        from distributed.security import Security

        security = Security.temporary()
        try:
            with dask.config.set(DASK_CONFIG):
                self._cluster = LocalCluster(
                    name=gang_id,
                    n_workers=spec.nodes,
                    threads_per_worker=1,
                    processes=True,
                    protocol="tls://",
                    host="127.0.0.1",
                    security=security,
                    dashboard_address="127.0.0.1:0",
                    memory_limit=0,
                    # a lost worker is reported as NodeLost; the scheduler's own errors
                    # about it would only add noise to the notebook
                    silence_logs=logging.CRITICAL,
                    preload=["jupyter_mn.node.agent"],
                )
                self._client = Client(
                    self._cluster, security=security, set_as_default=False, direct_to_workers=True
                )
                self._client.wait_for_workers(spec.nodes, timeout=spec.start_timeout)
        except Exception as exc:
            self.release()
            raise SchedulingError(f"could not start {spec.nodes} local node(s): {exc}") from exc
        workers = self._client.scheduler_info(n_workers=-1)["workers"]
        order = sorted(workers, key=lambda a: int(workers[a]["name"]))
        return self._client, order

    def launch_options(self) -> dict[str, Any]:
        # The workers are this gang's alone: an agent whose kernel is gone ends its worker too.
        return {"cwd": os.getcwd(), "exit_when_orphaned": True}

    def release(self) -> None:
        for thing in (self._client, self._cluster):
            if thing is not None:
                with contextlib.suppress(Exception):
                    thing.close()
        self._client = self._cluster = None
