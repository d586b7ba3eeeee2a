"""A Kubernetes API server for tests: kmock's emulator plus what the gang code relies on.

kmock's ``KubernetesEmulator`` keeps objects in memory and serves list, watch, create, patch and
delete over real HTTP. Added here, as a real API server does it: uids, resourceVersions and
creation timestamps; label selectors on list and watch; garbage collection of dependents by
ownerReference (all owners gone → deleted, cascading); the server version and API discovery at
the paths the official client uses (``/version/``, ``/apis/``); and pod port-forwarding over
WebSocket (``v4.channel.k8s.io``) to the pod's IP, which is where a pod's loopback would be.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import itertools
import re
import uuid
from typing import Any

import aiohttp
import aiohttp.web
import attrs
import pytest

kmock = pytest.importorskip("kmock", reason="kmock (the API server emulator) needs Python 3.11+")

BUILTIN = {
    "v1/pods": "Pod",
    "v1/services": "Service",
    "v1/secrets": "Secret",
    "batch/v1/jobs": "Job",
    "networking.k8s.io/v1/networkpolicies": "NetworkPolicy",
    "coordination.k8s.io/v1/leases": "Lease",
    "scheduling.k8s.io/v1/priorityclasses": "PriorityClass",
}
_PORTFORWARD = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<pod>[^/]+)/portforward$")


def matches(obj: dict[str, Any], selector: str) -> bool:
    """Equality-based label selectors (``a=b,c``), what the gang code uses."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, selector.split(",")):
        key, eq, value = term.partition("=")
        if (eq and labels.get(key) != value) or (not eq and key not in labels):
            return False
    return True


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesEmulator):
    minor: int = 37
    _versions: itertools.count = attrs.field(factory=lambda: itertools.count(1), init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.fallback["get /version/"] << self._serve_server_version
        self.fallback["get /apis/"] << self._serve_apis
        for resource, kind in BUILTIN.items():
            self.resources[resource] = kmock.ResourceInfo(kind=kind, namespaced=True)

    def serve(self, resource: str, kind: str) -> None:
        """Make a custom resource (a CRD) known to discovery."""
        self.resources[resource] = kmock.ResourceInfo(kind=kind, namespaced=True)

    async def _serve_server_version(self, request: Any) -> dict[str, str]:
        return {
            "major": "1",
            "minor": str(self.minor),
            "gitVersion": f"v1.{self.minor}.0",
            "gitCommit": "0" * 40,
            "gitTreeState": "clean",
            "buildDate": "2026-11-01T00:00:00Z",
            "goVersion": "go1.25",
            "compiler": "gc",
            "platform": "linux/amd64",
        }

    async def _handle(self, request: Any) -> aiohttp.web.StreamResponse:
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", dt.datetime.now(dt.timezone.utc).isoformat())
            meta["resourceVersion"] = str(next(self._versions))
            if request.namespace:
                meta.setdefault("namespace", request.namespace)
        response = await super()._handle(request)
        if request.action == kmock.action.DELETE and request.name is not None:
            await self.collect_garbage()
        return response

    async def collect_garbage(self) -> None:
        """Delete objects all of whose owners are gone, until nothing more goes."""
        while True:
            async with self._lock:
                live = {obj.raw["metadata"].get("uid") for obj in self._live()}
                doomed = [
                    (key, obj)
                    for key, obj in self.objects.items()
                    if not obj.deleted
                    and (refs := obj.raw["metadata"].get("ownerReferences"))
                    and not any(ref.get("uid") in live for ref in refs)
                ]
                for (resource, _, _), obj in doomed:
                    raw = obj.raw
                    obj.delete()
                    await self._buses[resource].put({"type": "DELETED", "object": raw})
            if not doomed:
                return

    def _live(self) -> list[Any]:
        return [obj for obj in self.objects.values() if not obj.deleted]

    def live(self, plural: str | None = None) -> list[dict[str, Any]]:
        """Every object that exists now (of one resource, e.g. ``"pods"``), for assertions."""
        return [
            obj.raw
            for (resource, _, _), obj in self.objects.items()
            if not obj.deleted and plural in (None, resource.plural)
        ]

    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return next(
            (
                o
                for o in self.live(plural)
                if o["metadata"].get("namespace") == namespace and o["metadata"]["name"] == name
            ),
            None,
        )

    async def _serve_list(self, request: Any) -> Any:
        result = await super()._serve_list(request)
        selector = request.params.get("labelSelector")
        if selector:
            result["items"] = [o for o in result["items"] if matches(o, selector)]
        return result

    async def _serve_watch(self, request: Any) -> Any:
        selector = request.params.get("labelSelector")
        async for event in super()._serve_watch(request):
            if not selector or not isinstance(event, dict) or matches(event["object"], selector):
                yield event

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        found = _PORTFORWARD.match(raw.path)
        if found and raw.headers.get("Upgrade", "").lower() == "websocket":
            return await self._port_forward(raw, found["ns"], found["pod"])
        return await super().__call__(raw)

    async def _port_forward(
        self, raw: aiohttp.web.BaseRequest, namespace: str, name: str
    ) -> aiohttp.web.StreamResponse:
        pod = self.get("pods", namespace, name)
        if pod is None or "podIP" not in (pod.get("status") or {}):
            return aiohttp.web.Response(status=404, text=f"pod {name} has no IP")
        port = int(raw.query["ports"])
        ws = aiohttp.web.WebSocketResponse(protocols=("v4.channel.k8s.io",))
        await ws.prepare(raw)
        reader, writer = await asyncio.open_connection(pod["status"]["podIP"], port)
        for channel in (0, 1):  # data and error channels each announce the port first
            await ws.send_bytes(bytes([channel]) + port.to_bytes(2, "little"))

        async def upstream() -> None:
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.BINARY and msg.data[:1] == b"\x00":
                    writer.write(msg.data[1:])
                    await writer.drain()
            writer.close()

        async def downstream() -> None:
            while data := await reader.read(1 << 16):
                await ws.send_bytes(b"\x00" + data)
            await ws.close()

        with contextlib.suppress(Exception):
            await asyncio.gather(upstream(), downstream())
        writer.close()
        return ws
