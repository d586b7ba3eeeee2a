"""Nodes for the real control plane: our process kubelet, speaking to a real API server.

What a real API server needs from a kubelet (virtual-kubelet's and kwok's node controllers do
the same): a Node with capacity, allocatable and a Ready condition; a Lease in
``kube-node-lease`` renewed well within the controller-manager's grace period (the Lease is
the heartbeat: a node whose Lease expires goes NotReady, then its pods are evicted), and its
status posted again when the server's is not Ready (only a kubelet lifts that); pod status
through ``pods/status``; and, for a pod being deleted (``deletionTimestamp`` set), its process
stopped, then the final DELETE with ``gracePeriodSeconds: 0``, or it stays Terminating forever.

Each node authenticates as ``system:node:<name>`` in ``system:nodes``, so the Node authorizer
and NodeRestriction admission judge it as they judge a kubelet: it may read only the Secrets of
pods bound to it and change only its own Node, Lease and pods.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from jupyter_mn.model.kubespec import KubeOptions
from tests.support.kube.control import MERGE, Api
from tests.support.kube.kubelet import ClusterDns, ProcessKubelet
from tests.support.kube.pki import Authority
from tests.support.kube.streaming import KubeletServer

if TYPE_CHECKING:
    from tests.support.kube.simnodes import SimulatedNodes

#: The backend's default ``--rdma-resource``, which a node with RDMA advertises.
RDMA_RESOURCE = KubeOptions.rdma_resource
#: How often a node renews its Lease and reconciles its pods.
RENEW_S = 2.0
TICK_S = 0.1
#: Tries of one renewal that meets conflicts (the kubelet's ``maxUpdateRetries``).
LEASE_TRIES = 5


def _micro(moment: dt.datetime) -> str:
    """A MicroTime, the format Lease times must have (RFC 3339 with microseconds)."""
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def first_to_end(*loops: Coroutine[Any, Any, None]) -> None:
    """Run ``loops`` together until one ends, raising its error; the others are cancelled with
    it, so that none runs on (as ``gather`` would leave them: a heartbeat left behind renews
    the Lease beside the restarted kubelet's, each meeting the other's writes as conflicts)."""
    tasks = [asyncio.ensure_future(loop) for loop in loops]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in done:
        task.result()


class Refused(RuntimeError):
    """A request the real API server refused, with its Status message: what a test shows."""

    def __init__(self, status: int, what: str, text: str) -> None:
        super().__init__(f"{what}: {status} {text}")
        self.status = status


async def _checked(resp: aiohttp.ClientResponse, what: str, ok: tuple[int, ...] = ()) -> Any:
    if resp.status >= 400 and resp.status not in ok:
        raise Refused(resp.status, what, await resp.text())
    return await resp.json()


class NotYet(Exception):
    """A pod's Secret that is not there yet, or that the Node authorizer no longer lets this
    node read (403: its pod is gone meanwhile): the pod waits, as a kubelet's does."""


class NodeApi(Api):
    """The kubelet's requests: nodes, leases, secrets, pod status and final deletes; every
    refusal raises ``Refused`` with the server's own message."""

    @staticmethod
    def path(kind: str, namespace: str, name: str = "") -> str:
        if kind == "leases":
            base = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        else:  # the core group; no namespace: cluster-scoped (nodes) or all namespaces
            base = f"/api/v1/namespaces/{namespace}/{kind}" if namespace else f"/api/v1/{kind}"
        return base + (f"/{name}" if name else "")

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        url = self.path(kind, namespace, name)
        async with self.session.get(url) as resp:
            return await _checked(resp, f"GET {url}")

    async def list(self, kind: str, namespace: str, **params: str) -> list[dict[str, Any]]:
        url = self.path(kind, namespace)
        async with self.session.get(url, params=params) as resp:
            return (await _checked(resp, f"GET {url}"))["items"]

    async def put(self, kind: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        url = self.path(kind, namespace, body["metadata"]["name"])
        async with self.session.put(url, json=body) as resp:
            return await _checked(resp, f"PUT {url}")

    async def post(self, kind: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        url = self.path(kind, namespace)
        async with self.session.post(url, json=body) as resp:
            return await _checked(resp, f"POST {url}")

    async def patch(
        self, kind: str, obj: dict[str, Any], body: dict[str, Any], status: bool
    ) -> None:
        meta = obj["metadata"]
        url = self.path(kind, meta.get("namespace", ""), meta["name"])
        url += "/status" if status else ""
        async with self.session.patch(url, json=body, headers=MERGE) as resp:
            await _checked(resp, f"PATCH {url} {body}", ok=(404,))  # 404: deleted meanwhile

    async def finish(self, pod: dict[str, Any]) -> None:
        """The final delete of a terminating pod (its process is gone); 404 and 409: deleted
        already, or a new pod of that name."""
        meta = pod["metadata"]
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
        url = self.path("pods", meta["namespace"], meta["name"])
        async with self.session.delete(url, json=body) as resp:
            await _checked(resp, f"DELETE {url}", ok=(404, 409))


class RealNode:
    """One node: its Node object and Lease, and a ``ProcessKubelet`` running its pods."""

    def __init__(
        self,
        name: str,
        server: str,
        pki: Authority,
        root: Path,
        gpus: int,
        dns: ClusterDns,
        cpus: int = 16,
    ) -> None:
        """``dns``: the cluster's, shared by its nodes."""
        self.name, self.server, self.gpus, self.cpus, self.dns = name, server, gpus, cpus, dns
        pair = pki.client(f"node-{name}", f"system:node:{name}", "system:nodes")
        self.ssl = ssl.create_default_context(cafile=str(pki.cert))
        self.ssl.load_cert_chain(pair.cert, pair.key)
        serving = pki.serving(f"kubelet-{name}", ["127.0.0.1", name])
        self.serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.cert))
        self.serving.load_cert_chain(serving.cert, serving.key)
        self.serving.verify_mode = ssl.CERT_REQUIRED  # the API server's kubelet-client cert
        self.root = root / name
        self.root.mkdir(parents=True, exist_ok=True)
        self.api: NodeApi
        self.kubelet: ProcessKubelet
        #: the kubelet's API port (port-forward), serving once the node runs
        self.endpoint: KubeletServer
        self._uid = ""
        #: requests the API server refused while the node ran
        self.errors: list[str] = []

    async def run(self, ready: asyncio.Event) -> None:
        connector = aiohttp.TCPConnector(ssl=self.ssl)
        async with aiohttp.ClientSession(self.server, connector=connector) as session:
            self.api = NodeApi(session)
            host, _, port = self.server.removeprefix("https://").rpartition(":")
            self.kubelet = ProcessKubelet(
                self._secret, self.root, dns=self.dns, project=self._project, service=(host, port)
            )
            self.endpoint = KubeletServer(self._pod, self.kubelet.log_of, self.serving)
            await self.endpoint.start()
            try:
                await self._register()
                ready.set()
                await first_to_end(self._heartbeat(), self._pods())
            finally:
                await self.endpoint.stop()
                await asyncio.to_thread(self.kubelet.shutdown)

    async def _pod(self, namespace: str, name: str) -> dict[str, Any]:
        return await self.api.get("pods", namespace, name)

    async def _secret(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            return await self.api.get("secrets", namespace, name)
        except Refused as exc:
            if exc.status in (403, 404):
                raise NotYet(str(exc)) from exc
            raise

    async def _project(self, pod: dict[str, Any], projected: dict[str, Any]) -> dict[str, bytes]:
        """A projected volume's files, as a kubelet makes those of the ServiceAccount admission's
        ``kube-api-access-*`` volume: a token from the TokenRequest API bound to the pod (the
        Node authorizer lets a node ask only for its own pods'), ConfigMap keys (``ca.crt`` of
        ``kube-root-ca.crt``) and downward-API fields (the namespace)."""
        meta = pod["metadata"]
        files: dict[str, bytes] = {}
        for source in projected.get("sources") or []:
            if "serviceAccountToken" in source:
                token = source["serviceAccountToken"]
                account = pod["spec"].get("serviceAccountName") or "default"
                ref = {"kind": "Pod", "apiVersion": "v1", "name": meta["name"], "uid": meta["uid"]}
                spec = {"expirationSeconds": token.get("expirationSeconds", 3600)}
                spec |= {"boundObjectRef": ref}
                if token.get("audience"):
                    spec["audiences"] = [token["audience"]]
                url = f"{NodeApi.path('serviceaccounts', meta['namespace'], account)}/token"
                async with self.api.session.post(url, json={"spec": spec}) as resp:
                    issued = await _checked(resp, f"POST {url}")
                files[token["path"]] = issued["status"]["token"].encode()
            elif "configMap" in source:
                ref = source["configMap"]
                try:
                    found = await self.api.get("configmaps", meta["namespace"], ref["name"])
                except Refused as exc:  # not published yet: the pod waits, as a kubelet's does
                    raise NotYet(str(exc)) from exc
                data = found.get("data") or {}
                for item in ref.get("items") or [{"key": k, "path": k} for k in data]:
                    files[item["path"]] = data[item["key"]].encode()
            elif "downwardAPI" in source:
                for item in source["downwardAPI"]["items"]:
                    section, _, key = item["fieldRef"]["fieldPath"].partition(".")
                    files[item["path"]] = str(pod[section][key]).encode()
        return files

    # ---- the Node and its Lease
    def _status(self) -> dict[str, Any]:
        moment = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        resources = {
            "cpu": str(self.cpus),
            "memory": "64Gi",
            "pods": "110",
            "nvidia.com/gpu": str(self.gpus),
            RDMA_RESOURCE: "1000",  # a shared RDMA device: as many pods as ask
        }
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "jupyter_mn test kubelet is posting ready status",
            "lastHeartbeatTime": moment,
            "lastTransitionTime": moment,
        }
        return {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [ready],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": self.name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.endpoint.port}},
            "nodeInfo": {
                "kubeletVersion": "v1.37.2",
                "operatingSystem": "linux",
                "architecture": "amd64",
                "containerRuntimeVersion": "process://jupyter-mn",
            },
        }

    async def _register(self) -> None:
        labels = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
        }
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": labels},
            "status": self._status(),
        }
        try:
            created = await self.api.post("nodes", "", node)
        except Refused as exc:  # a kubelet restarting finds its Node
            if exc.status != 409:
                raise
            created = await self.api.get("nodes", "", self.name)
        self._uid = created["metadata"]["uid"]
        await self.api.patch("nodes", created, {"status": self._status()}, status=True)
        await self._renew()

    async def _renew(self) -> None:
        """Create or renew the Lease (the heartbeat the node lifecycle controller reads) as a
        kubelet's lease controller does: from the latest read, and on a conflict (a write since
        that read, such as a renewal that timed out here but landed there) read it again and
        retry, up to ``LEASE_TRIES`` times."""
        for attempt in range(1, LEASE_TRIES + 1):
            try:
                lease = await self.api.get("leases", "kube-node-lease", self.name)
            except Refused as exc:
                if exc.status != 404:
                    raise
                await self.api.post("leases", "kube-node-lease", self._lease())
                return
            lease["spec"]["renewTime"] = _micro(dt.datetime.now(dt.timezone.utc))
            try:
                await self.api.put("leases", "kube-node-lease", lease)
                return
            except Refused as exc:
                if exc.status != 409 or attempt == LEASE_TRIES:
                    raise

    def _lease(self) -> dict[str, Any]:
        owner = {"apiVersion": "v1", "kind": "Node", "name": self.name, "uid": self._uid}
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.name,
                "namespace": "kube-node-lease",
                "ownerReferences": [owner],
            },
            "spec": {
                "holderIdentity": self.name,
                "leaseDurationSeconds": 40,
                "renewTime": _micro(dt.datetime.now(dt.timezone.utc)),
            },
        }

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(RENEW_S)
            await self._guarded(self._renew())
            await self._guarded(self._report())

    async def _report(self) -> None:
        """Post the Node's status again once the server's says other than Ready, as a kubelet
        does when its computed status differs: the node lifecycle controller marks a node
        whose Lease it saw go stale (an API server restart longer than its grace period) Ready
        ``Unknown`` and taints it, and never marks it Ready again; only the kubelet does."""
        node = await self.api.get("nodes", "", self.name)
        conditions = (node.get("status") or {}).get("conditions") or []
        if not any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            await self.api.patch("nodes", node, {"status": self._status()}, status=True)

    # ---- pods
    async def _pods(self) -> None:
        """Reconcile this node's pods every ``TICK_S``, from a list (a kubelet's relist). A
        refused request is kept in ``errors`` (and the node goes on, as a kubelet does): a
        test asserts there are none, which is how a difference from kmock shows."""
        while True:
            await self._guarded(self._sync())
            await asyncio.sleep(TICK_S)

    async def _guarded(self, step: Coroutine[Any, Any, None]) -> None:
        """One step of a loop: a refusal is recorded; a Secret not readable yet, a lost
        connection, a timed-out request, 5xx and 429 (the API server restarting or busy) are
        retried next time."""
        try:
            await step
        except NotYet:
            pass
        except Refused as exc:
            if exc.status < 500 and exc.status != 429:  # else the server's trouble: retry
                self.errors.append(str(exc))
        except (aiohttp.ClientError, TimeoutError):
            pass

    async def _sync(self) -> None:
        pods = await self.api.list("pods", "", fieldSelector=f"spec.nodeName={self.name}")
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        for pod in live:
            await self.kubelet.sync(pod, self.api)
        await self.kubelet.reap({p["metadata"]["name"] for p in live})
        for pod in pods:
            if pod["metadata"].get("deletionTimestamp"):
                await self.api.finish(pod)


class Nodes:
    """Nodes running on an event loop of their own, in a thread: usable from sync code (the
    pytest fixture, ``real.py up``) while the test talks to the API server directly."""

    def __init__(self, nodes: list[RealNode | SimulatedNodes]) -> None:
        self.nodes = {n.name: n for n in nodes}
        self._loop = asyncio.new_event_loop()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="nodes")

    def __enter__(self) -> Nodes:
        self._thread.start()
        try:
            self.start(*self.nodes)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop every node and its pods' processes (the Node objects stay, as after a crash)."""
        self.stop(*self._tasks)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def dead(self) -> list[str]:
        """The nodes whose kubelet ended by itself (an error its loops do not retry), and why:
        such a node is lost to every later user of the cluster."""
        return [
            f"node {name}: {task.exception()!r}" if not task.cancelled() else f"node {name}"
            for name, task in self._tasks.items()
            if task.done()
        ]

    def call(self, step: Coroutine[Any, Any, Any], timeout: float = 60) -> Any:
        """Run ``step`` on the nodes' loop (where their kubelets run) and return its result."""
        return asyncio.run_coroutine_threadsafe(step, self._loop).result(timeout)

    def loops_of(self, name: str) -> list[str]:
        """The loops still running for node ``name`` (their coroutines' names): none once its
        kubelet has ended, as a stopped kubelet renews no Lease and syncs no pod."""

        async def running() -> list[str]:
            node = self.nodes[name]
            return sorted(
                t.get_coro().__qualname__
                for t in asyncio.all_tasks()
                if (frame := getattr(t.get_coro(), "cr_frame", None)) is not None
                and frame.f_locals.get("self") is node
            )

        return self.call(running())

    def start(self, *names: str) -> None:
        """Start (or restart: the kubelet finds its Node) these nodes; return once registered."""
        asyncio.run_coroutine_threadsafe(self._start(names), self._loop).result(60)

    def stop(self, *names: str) -> None:
        """Stop these nodes' kubelets (their Leases are no longer renewed) and the processes of
        their pods (SIGTERM, as at a kubelet's shutdown); the pods stay bound to the node."""
        asyncio.run_coroutine_threadsafe(self._stop(names), self._loop).result(60)

    async def _start(self, names: tuple[str, ...]) -> None:
        ready = {name: asyncio.Event() for name in names}
        for name in names:
            self._tasks[name] = asyncio.create_task(self.nodes[name].run(ready[name]))
        while not all(r.is_set() for r in ready.values()):
            for name in names:
                if self._tasks[name].done():
                    self._tasks[name].result()  # raises why the node could not register
                    raise RuntimeError(f"node {name} stopped while registering")
            await asyncio.sleep(0.05)

    async def _stop(self, names: tuple[str, ...]) -> None:
        tasks = [self._tasks.pop(name) for name in names]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
