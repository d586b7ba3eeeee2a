"""Local backend: one dask worker per virtual node on this machine (the embedded default).

The scheduler runs in the kernel; each node's worker is a subprocess (``node/localnode.py``) in
a session of its own, so neither a script's top-level code runs again in it (as a spawned nanny's
child would re-import the main module) nor does a Jupyter interrupt (SIGINT to the kernel's
process group) reach it. Everything listens on 127.0.0.1 with TLS (fresh certificates per gang,
handed to the workers on stdin). Ranks are the workers' children: closing kills what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import time
from typing import Any

import dask
from distributed import Client, Scheduler, SpecCluster
from distributed.deploy.subprocess import Subprocess
from distributed.security import Security

from ..errors import SchedulingError
from ..node.daskconfig import DASK_CONFIG
from ..node.process import rank_command
from ..spec import ClusterSpec

#: What a worker process gets besides the kernel's dask config: quiet logs, and glibc returning
#: freed memory as dask's nanny would have set it (the ranks inherit both).
_WORKER_CONFIG = {"logging": {"distributed": "critical"}}
_WORKER_ENV = {"MALLOC_TRIM_THRESHOLD_": "65536"}
#: How often a start-up checks whether a worker process has already exited.
_EXIT_CHECK_S = 0.5
_TLS_FIELDS = (
    "tls_ca_file",
    "tls_worker_cert",
    "tls_worker_key",
    "tls_client_cert",
    "tls_client_key",
)


class LocalNode(Subprocess):
    """One node: ``dask spec`` running ``node.localnode.worker`` in a session of its own."""

    def __init__(self, scheduler: str, name: str, security: Security) -> None:
        super().__init__()
        self.scheduler, self.name, self._security = scheduler, name, security

    async def _start(self) -> None:
        spec = {
            "cls": "jupyter_mn.node.localnode.worker",
            "opts": {
                "name": self.name,
                "host": "127.0.0.1",
                "nthreads": 1,
                "memory_limit": 0,
                "preload": ["jupyter_mn.node.agent"],
            },
        }
        config = dask.config.merge(dask.config.config, _WORKER_CONFIG)
        env = {
            **os.environ,
            **_WORKER_ENV,
            "DASK_INTERNAL_INHERIT_CONFIG": dask.config.serialize(config),
        }
        self.process = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "distributed.cli.dask_spec", self.scheduler),
            *("--spec", json.dumps(spec)),
            stdin=asyncio.subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        pems = {f: getattr(self._security, f) for f in _TLS_FIELDS}
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(pems).encode())
        await self.process.stdin.drain()
        self.process.stdin.close()


class LocalProvisioner:
    backend = "local"

    def __init__(self) -> None:
        self._cluster: Any = None
        self._client: Any = None

    def provision(self, spec: ClusterSpec, gang_id: str) -> tuple[Any, list[str]]:
        rank_command()  # the workers inherit this environment: a bad command, before they start
        security = Security.temporary()
        try:
            with dask.config.set(DASK_CONFIG):
                self._cluster = SpecCluster(
                    name=gang_id,
                    scheduler={
                        "cls": Scheduler,
                        "options": {
                            "protocol": "tls://",
                            "host": "127.0.0.1",
                            "security": security,
                            "dashboard": False,
                            "dashboard_address": "127.0.0.1:0",  # its HTTP server (health)
                        },
                    },
                    workers={
                        i: {"cls": LocalNode, "options": {"name": str(i), "security": security}}
                        for i in range(spec.nodes)
                    },
                    security=security,
                    # a lost worker is reported as NodeLost; the scheduler's own errors
                    # about it would only add noise to the notebook
                    silence_logs=logging.CRITICAL,
                )
                self._client = Client(
                    self._cluster, security=security, set_as_default=False, direct_to_workers=True
                )
                self._wait_for_nodes(spec.nodes, spec.start_timeout)
        except Exception as exc:
            self.release()
            raise SchedulingError(f"could not start {spec.nodes} local node(s): {exc}") from exc
        workers = self._client.scheduler_info(n_workers=-1)["workers"]
        order = sorted(workers, key=lambda a: int(workers[a]["name"]))
        return self._client, order

    def _wait_for_nodes(self, n: int, timeout: float) -> None:
        """Wait for ``n`` workers, but fail as soon as a worker process has exited: dask's
        ``wait_for_workers`` alone would wait out ``timeout`` for a node that can never come."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._client.wait_for_workers(n, timeout=min(_EXIT_CHECK_S, timeout))
                return
            except TimeoutError:
                for name, node in self._cluster.workers.items():
                    code = node.process.returncode if node.process is not None else None
                    if code is not None:
                        raise SchedulingError(
                            f"node {name}'s worker process exited with code {code} while "
                            "starting (its error is above, on the kernel's stderr)"
                        ) from None
                if time.monotonic() >= deadline:
                    raise

    def launch_options(self) -> dict[str, Any]:
        # The workers are this gang's alone: an agent whose kernel is gone ends its worker too.
        return {"cwd": os.getcwd(), "exit_when_orphaned": True}

    def release(self) -> None:
        for thing in (self._client, self._cluster):
            if thing is not None:
                with contextlib.suppress(Exception):
                    thing.close()
        self._client = self._cluster = None
