"""Simulated nodes for the real control plane, as kwok makes them: no processes, only status.

Why: a 256-node cluster cannot run on one machine, but the API server, scheduler, Job
controller and Kueue only see Nodes, Leases and pod status; they do the same work for a node
that reports its pods Running as for one that runs them (what ``bench/k8s_gang.py`` measures).

One client and one event loop serve every simulated node, so the heartbeat cost is what the API
server pays: each node's Lease renewed every ``LEASE_RENEW_S`` (the kubelet's 10 s), spread over
the interval; its Node status posted when registered and then every ``STATUS_REPORT_S`` (the
kubelet's ``nodeStatusReportFrequency``). One watch on all pods: a pod bound to a simulated
node is patched Running and Ready at once; a pod being deleted gets its final DELETE (kwok's
pod controller does the same).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import json
import ssl
from typing import Any

import aiohttp

from tests.support.kube.control import condition, container_status, now
from tests.support.kube.node import NodeApi, Refused, _micro, first_to_end

#: The kubelet's defaults: Lease renewed every 10 s, Node status reported every 5 min.
LEASE_RENEW_S = 10.0
STATUS_REPORT_S = 300.0
#: What a simulated node advertises besides its GPUs.
RESOURCES = {"cpu": "64", "memory": "512Gi", "pods": "110"}
SIMULATED_LABEL = "jupyter-mn.io/simulated-node"


class SimulatedNodes:
    """``nodes`` (name → GPUs), registered with ``server`` through ``ssl`` (an identity that may
    write Nodes, Leases and pods/status: the admin, as kwok's). Run with ``Nodes`` (node.py):
    it is one entry there, named ``name``."""

    def __init__(
        self, server: str, context: ssl.SSLContext, nodes: dict[str, int], name: str = "simulated"
    ) -> None:
        self.server, self.ssl, self.gpus, self.name = server, context, nodes, name
        self.api: NodeApi
        self._leases: dict[str, dict[str, Any]] = {}
        self._ips = (f"10.{i // 65536}.{i // 256 % 256}.{i % 256}" for i in itertools.count(1))
        #: requests the API server refused (the same contract as ``RealNode.errors``)
        self.errors: list[str] = []

    async def run(self, ready: asyncio.Event) -> None:
        connector = aiohttp.TCPConnector(ssl=self.ssl, limit=16)
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with aiohttp.ClientSession(self.server, connector=connector, timeout=timeout) as s:
            self.api = NodeApi(s)
            await asyncio.gather(*(self._register(n) for n in self.gpus))
            ready.set()
            await first_to_end(self._leases_loop(), self._status_loop(), self._pods())

    # ---- Nodes and Leases
    def _status(self, name: str) -> dict[str, Any]:
        moment = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        resources = {**RESOURCES, "nvidia.com/gpu": str(self.gpus[name])}
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "simulated node",
            "lastHeartbeatTime": moment,
            "lastTransitionTime": moment,
        }
        return {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [ready],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "nodeInfo": {"kubeletVersion": "v1.37.2", "containerRuntimeVersion": "simulated://"},
        }

    async def _register(self, name: str) -> None:
        labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            SIMULATED_LABEL: "true",
        }
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
        try:
            created = await self.api.post("nodes", "", node)
        except Refused as exc:
            if exc.status != 409:
                raise
            created = await self.api.get("nodes", "", name)
        await self.api.patch("nodes", created, {"status": self._status(name)}, status=True)
        owner = {
            "apiVersion": "v1",
            "kind": "Node",
            "name": name,
            "uid": created["metadata"]["uid"],
        }
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": "kube-node-lease", "ownerReferences": [owner]},
            "spec": {
                "holderIdentity": name,
                "leaseDurationSeconds": 40,
                "renewTime": _micro(dt.datetime.now(dt.timezone.utc)),
            },
        }
        try:
            self._leases[name] = await self.api.post("leases", "kube-node-lease", lease)
        except Refused as exc:
            if exc.status != 409:
                raise
            self._leases[name] = await self.api.get("leases", "kube-node-lease", name)

    async def _leases_loop(self) -> None:
        """Each Lease renewed once per ``LEASE_RENEW_S``, the renewals spread evenly over it."""
        gap = LEASE_RENEW_S / max(1, len(self.gpus))
        while True:
            for name in self.gpus:
                await asyncio.sleep(gap)
                await self._guarded(self._renew(name))

    async def _renew(self, name: str) -> None:
        lease = self._leases[name]
        lease["spec"]["renewTime"] = _micro(dt.datetime.now(dt.timezone.utc))
        try:
            self._leases[name] = await self.api.put("leases", "kube-node-lease", lease)
        except Refused as exc:
            if exc.status != 409:  # 409: a stale resourceVersion; read it, renew next round
                raise
            self._leases[name] = await self.api.get("leases", "kube-node-lease", name)

    async def _status_loop(self) -> None:
        gap = STATUS_REPORT_S / max(1, len(self.gpus))
        while True:
            for name in self.gpus:
                await asyncio.sleep(gap)
                node = {"metadata": {"name": name}}
                await self._guarded(
                    self.api.patch("nodes", node, {"status": self._status(name)}, status=True)
                )

    # ---- pods
    async def _pods(self) -> None:
        """List, then watch from the list's resourceVersion; re-list when the watch ends."""
        while True:
            try:
                await self._list_and_watch()
            except (aiohttp.ClientError, asyncio.TimeoutError):
                await asyncio.sleep(1)

    async def _list_and_watch(self) -> None:
        async with self.api.session.get("/api/v1/pods") as resp:
            listed = await resp.json()
        for pod in listed.get("items", []):
            await self._guarded(self._sync(pod))
        params = {
            "watch": "1",
            "resourceVersion": listed["metadata"]["resourceVersion"],
            "allowWatchBookmarks": "true",
        }
        async with self.api.session.get("/api/v1/pods", params=params) as resp:
            async for line in resp.content:
                event = json.loads(line)
                if event["type"] == "ERROR":  # 410 Gone: re-list
                    return
                if event["type"] in ("ADDED", "MODIFIED"):
                    await self._guarded(self._sync(event["object"]))

    async def _sync(self, pod: dict[str, Any]) -> None:
        if pod["spec"].get("nodeName") not in self.gpus:
            return
        if pod["metadata"].get("deletionTimestamp"):
            await self.api.finish(pod)
            return
        status = pod.get("status") or {}
        if status.get("phase") != "Pending" or status.get("podIP"):
            return
        running = container_status(
            pod["spec"]["containers"][0], {"running": {"startedAt": now()}}, True
        )
        patch = {
            "status": {
                "phase": "Running",
                "podIP": next(self._ips),
                "hostIP": "127.0.0.1",
                "startTime": now(),
                "conditions": [condition("PodScheduled", True), condition("Ready", True)],
                "containerStatuses": [running],
            }
        }
        await self.api.patch("pods", pod, patch, status=True)

    async def _guarded(self, step: Any) -> None:
        """A refusal is recorded (5xx and 429 are the server's trouble: retried next time)."""
        try:
            await step
        except Refused as exc:
            if exc.status < 500 and exc.status != 429:
                self.errors.append(str(exc))
        except aiohttp.ClientError:
            pass
