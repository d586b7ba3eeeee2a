"""``FakeCluster``: the test API server and its control plane on a background event loop.

Tests talk to it like to a cluster: through a kubeconfig (``KUBECONFIG``) and the official
client. It also answers what a test asserts: which objects exist, which requests were made.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import threading
from collections.abc import Coroutine, Iterable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import yaml

from jupyter_mn.gang.kubernetes.manifests import MANAGED_BY, MANAGER
from tests.support.hosts import HostNet
from tests.support.kube.apiserver import ApiServer
from tests.support.kube.control import Api, ControlPlane, StatusKubelet
from tests.support.kube.kubelet import ProcessKubelet

NAMESPACE = "notebooks"


class FakeCluster:
    def __init__(
        self,
        root: Path,
        *,
        minor: int = 37,
        nodes: dict[str, int] | None = None,
        processes: bool = False,
        bad_images: Iterable[str] = (),
        crds: dict[str, str] | None = None,
        net: HostNet | None = None,
        hidden: Sequence[str] = (),
    ) -> None:
        """``processes``: run the pods' containers (``ProcessKubelet``), each on a test host of
        ``net`` when given, where the ``hidden`` directories are empty (a pod's filesystem is
        not the kernel's)."""
        self.root = root
        self.minor = minor
        self.nodes = nodes if nodes is not None else {"node-a": 2, "node-b": 2}
        self.processes = processes
        self.bad_images = tuple(bad_images)
        self.crds = crds or {}
        self.net = net
        self.hidden = tuple(hidden)
        self.kubeconfig = root / "kubeconfig"
        self.server: ApiServer
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._stop: asyncio.Event
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, daemon=True, name="fake-cluster")

    # ---- lifecycle
    def __enter__(self) -> FakeCluster:
        self._thread.start()
        self._started.wait(30)
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported to __enter__ if it happens while starting
            self._error = exc
            self._started.set()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with ApiServer(minor=self.minor) as server, kmock.Server(server) as http:
            self.server = server
            for resource, kind in self.crds.items():
                server.serve(resource, kind)
            self._write_kubeconfig(str(http.url).rstrip("/"))
            kubelet = (
                ProcessKubelet(self._secret, self.root, self.net, self.hidden)
                if self.processes
                else StatusKubelet(self.bad_images)
            )
            async with aiohttp.ClientSession(str(http.url)) as session:
                control = ControlPlane(server, Api(session), self.nodes, kubelet)
                task = asyncio.create_task(control.run())
                self._started.set()
                await self._stop.wait()
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if isinstance(kubelet, ProcessKubelet):
                await asyncio.to_thread(kubelet.shutdown)

    async def _secret(self, namespace: str, name: str) -> dict[str, Any]:
        return self.server.get("secrets", namespace, name)

    def _write_kubeconfig(self, url: str) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": url}}],
            "users": [{"name": "tester", "user": {"token": "test-token"}}],
            "contexts": [
                {
                    "name": "fake",
                    "context": {"cluster": "fake", "user": "tester", "namespace": NAMESPACE},
                }
            ],
            "current-context": "fake",
        }
        self.kubeconfig.write_text(yaml.safe_dump(config))

    # ---- for tests
    def call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on the cluster's loop (e.g. an object the test plays a controller for)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    def live(self, plural: str | None = None) -> list[dict[str, Any]]:
        """Live objects (of one resource), read on the cluster's own loop."""

        async def read() -> list[dict[str, Any]]:
            return copy.deepcopy(self.server.live(plural))

        return self.call(read())

    def ours(self) -> list[dict[str, Any]]:
        """Every live object jupyter_mn made (pods included: they carry its labels)."""
        return [
            o for o in self.live() if (o["metadata"].get("labels") or {}).get(MANAGED_BY) == MANAGER
        ]

    def add_node(self, name: str, gpus: int) -> None:
        """A node joins (capacity frees up), on the loop the scheduler runs on."""

        async def add() -> None:
            self.nodes[name] = gpus

        self.call(add())

    def requests(self, method: str) -> list[Any]:
        async def read() -> list[Any]:
            return [r for r in self.server if r.method.value == method.upper()]

        return self.call(read())
