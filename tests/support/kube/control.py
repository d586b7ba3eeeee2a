"""A small control plane for the test API server: Job controller, scheduler, status kubelet.

Each reconciles from the server's store and acts through its HTTP API (so watchers see every
change as they would on a cluster): the Job controller makes one pod per completion index of an
unsuspended Indexed Job and fails the Job when a pod fails (``backoffLimit: 0``); the scheduler
binds pods to nodes with enough free GPUs, honouring the gang's pod anti-affinity, or marks them
Unschedulable with the scheduler's usual message; a kubelet brings bound pods to life.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import secrets
from collections.abc import Iterable
from typing import Any, Protocol

import aiohttp

from jupyter_mn.gang.kubernetes.manifests import COMPLETION_INDEX

MERGE = {"Content-Type": "application/merge-patch+json"}
TICK_S = 0.02


class Api:
    """Just enough of the API for the controllers (HTTP, like every other client)."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    @staticmethod
    def path(kind: str, namespace: str, name: str = "") -> str:
        base = "/api/v1" if kind == "pods" else "/apis/batch/v1"
        return f"{base}/namespaces/{namespace}/{kind}" + (f"/{name}" if name else "")

    async def create(self, kind: str, namespace: str, body: dict[str, Any]) -> None:
        async with self.session.post(self.path(kind, namespace), json=body) as resp:
            resp.raise_for_status()

    async def patch(
        self, kind: str, obj: dict[str, Any], body: dict[str, Any], status: bool
    ) -> None:
        meta = obj["metadata"]
        url = self.path(kind, meta["namespace"], meta["name"]) + ("/status" if status else "")
        async with self.session.patch(url, json=body, headers=MERGE) as resp:
            if resp.status != 404:  # deleted meanwhile
                resp.raise_for_status()

    async def delete(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        async with self.session.delete(self.path(kind, meta["namespace"], meta["name"])) as resp:
            if resp.status != 404:
                resp.raise_for_status()


class Kubelet(Protocol):
    async def sync(self, pod: dict[str, Any], api: Api) -> None:
        """Advance a pod bound to a node (start it, report it running, ready, exited)."""

    async def reap(self, live: set[str]) -> None:
        """Stop whatever runs for pods that no longer exist."""


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


def condition(kind: str, status: bool, reason: str = "", message: str = "") -> dict[str, str]:
    cond = {"type": kind, "status": "True" if status else "False", "lastTransitionTime": now()}
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    return cond


def container_status(
    container: dict[str, Any], state: dict[str, Any], ready: bool
) -> dict[str, Any]:
    """A container status as the kubelet reports it (the client's models need every field)."""
    return {
        "name": container["name"],
        "image": container["image"],
        "imageID": "",
        "restartCount": 0,
        "ready": ready,
        "started": "running" in state,
        "state": state,
    }


class StatusKubelet:
    """Runs nothing: a bound pod is Running and Ready at once; ``bad_images`` fail to pull."""

    def __init__(self, bad_images: Iterable[str] = ()) -> None:
        self.bad_images = set(bad_images)
        self._done: set[str] = set()
        self._ips = (f"10.0.0.{i}" for i in range(2, 250))

    async def sync(self, pod: dict[str, Any], api: Api) -> None:
        name = pod["metadata"]["name"]
        if name in self._done:
            return
        self._done.add(name)
        container = pod["spec"]["containers"][0]
        if container["image"] in self.bad_images:
            state = {
                "waiting": {
                    "reason": "ErrImagePull",
                    "message": f"pull {container['image']}: not found",
                }
            }
            status = {
                "phase": "Pending",
                "containerStatuses": [container_status(container, state, False)],
            }
        else:
            status = {
                "phase": "Running",
                "podIP": next(self._ips),
                "conditions": [condition("PodScheduled", True), condition("Ready", True)],
                "containerStatuses": [
                    container_status(container, {"running": {"startedAt": now()}}, True)
                ],
            }
        await api.patch("pods", pod, {"status": status}, status=True)

    async def reap(self, live: set[str]) -> None:
        self._done &= live


class ControlPlane:
    """Job controller + scheduler + a kubelet, reconciling every ``TICK_S``."""

    def __init__(self, server: Any, api: Api, nodes: dict[str, int], kubelet: Kubelet) -> None:
        self.server, self.api, self.nodes, self.kubelet = server, api, nodes, kubelet
        self._made: dict[str, set[int]] = {}
        self._failed: set[str] = set()
        self._unschedulable: dict[str, str] = {}
        self.gpu_resource = "nvidia.com/gpu"

    async def run(self) -> None:
        while True:
            await self.step()
            await asyncio.sleep(TICK_S)

    async def step(self) -> None:
        for job in self.server.live("jobs"):
            await self._job(job)
        pods = [p for p in self.server.live("pods") if not p["metadata"].get("deletionTimestamp")]
        for pod in pods:
            if not pod["spec"].get("nodeName"):
                await self._schedule(pod, pods)
            else:
                await self.kubelet.sync(pod, self.api)
        await self.kubelet.reap({p["metadata"]["name"] for p in pods})

    # ---- Job controller
    async def _job(self, job: dict[str, Any]) -> None:
        meta, spec = job["metadata"], job["spec"]
        uid = meta["uid"]
        mine = [
            p
            for p in self.server.live("pods")
            if any(o.get("uid") == uid for o in p["metadata"].get("ownerReferences") or [])
        ]
        failed = [p for p in mine if (p.get("status") or {}).get("phase") == "Failed"]
        if failed and uid not in self._failed:
            self._failed.add(uid)
            message = f"pod {failed[0]['metadata']['name']} failed (backoffLimit 0)"
            status = {"conditions": [condition("Failed", True, "BackoffLimitExceeded", message)]}
            await self.api.patch("jobs", job, {"status": status}, status=True)
            for pod in mine:
                if pod not in failed:
                    await self.api.delete("pods", pod)
        if spec.get("suspend") or uid in self._failed:
            return
        made = self._made.setdefault(uid, set())
        for index in range(spec.get("completions", 1)):
            if index not in made:
                made.add(index)
                await self.api.create("pods", meta["namespace"], self._pod(job, index))

    @staticmethod
    def _pod(job: dict[str, Any], index: int) -> dict[str, Any]:
        meta, template = job["metadata"], job["spec"]["template"]
        name = meta["name"]
        tmeta = template.get("metadata") or {}
        labels = {
            **(tmeta.get("labels") or {}),
            "batch.kubernetes.io/job-name": name,
            "batch.kubernetes.io/controller-uid": meta["uid"],
            COMPLETION_INDEX: str(index),
        }
        annotations = {**(tmeta.get("annotations") or {}), COMPLETION_INDEX: str(index)}
        owner = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": name,
            "uid": meta["uid"],
            "controller": True,
        }
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name}-{index}-{secrets.token_hex(3)[:5]}",
                "namespace": meta["namespace"],
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [owner],
            },
            "spec": {**template["spec"], "hostname": f"{name}-{index}"},
            "status": {"phase": "Pending"},
        }

    # ---- scheduler
    def _wants(self, pod: dict[str, Any]) -> int:
        return sum(
            int((c.get("resources") or {}).get("requests", {}).get(self.gpu_resource, 0))
            for c in pod["spec"]["containers"]
        )

    async def _schedule(self, pod: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        if pod["spec"].get("schedulingGates"):
            return await self._unplaced(pod, "SchedulingGated", "Scheduling is blocked by gates")
        bound = [
            p
            for p in pods
            if p["spec"].get("nodeName")
            and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        ]
        anti = self._anti_affinity(pod)
        short = clash = 0
        for node, capacity in self.nodes.items():
            here = [p for p in bound if p["spec"]["nodeName"] == node]
            if (
                any(all(p["metadata"]["labels"].get(k) == v for k, v in anti.items()) for p in here)
                and anti
            ):
                clash += 1
            elif capacity - sum(map(self._wants, here)) < self._wants(pod):
                short += 1
            else:
                self._unschedulable.pop(pod["metadata"]["name"], None)
                await self.api.patch("pods", pod, {"spec": {"nodeName": node}}, status=False)
                await self.api.patch(
                    "pods",
                    pod,
                    {"status": {"conditions": [condition("PodScheduled", True)]}},
                    status=True,
                )
                pod["spec"]["nodeName"] = node  # seen by the next pod of this pass
                bound.append(pod)
                return None
        parts = [f"{short} Insufficient {self.gpu_resource}"] if short else []
        parts += [f"{clash} node(s) didn't match pod anti-affinity rules"] if clash else []
        return await self._unplaced(
            pod, "Unschedulable", f"0/{len(self.nodes)} nodes are available: {', '.join(parts)}."
        )

    @staticmethod
    def _anti_affinity(pod: dict[str, Any]) -> dict[str, str]:
        terms = ((pod["spec"].get("affinity") or {}).get("podAntiAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        ) or []
        return {k: v for t in terms for k, v in t["labelSelector"]["matchLabels"].items()}

    async def _unplaced(self, pod: dict[str, Any], reason: str, message: str) -> None:
        name = pod["metadata"]["name"]
        if self._unschedulable.get(name) != message:
            self._unschedulable[name] = message
            cond = condition("PodScheduled", False, reason, message)
            await self.api.patch("pods", pod, {"status": {"conditions": [cond]}}, status=True)
