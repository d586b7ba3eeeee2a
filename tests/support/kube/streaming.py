"""The kubelet's own API port, for what the API server forwards to it: pod port-forward and
pod logs (``pods/log``: ``/containerLogs/<namespace>/<pod>/<container>``, ``follow=true``
streaming until the container's process ends).

``kubectl port-forward`` and the official client's ``portforward`` talk to the API server, which
proxies the upgraded connection to the pod's node: ``https://<InternalIP>:<kubeletEndpoint
port>/portForward/<namespace>/<pod>?port=N``, authenticating with its kubelet-client certificate
and checking ours against ``--kubelet-certificate-authority``. A client speaking WebSocket
``v4.channel.k8s.io`` is proxied as it is (the API server translates only the newer tunnelling
protocol to SPDY), so that is what this port serves: per forwarded port a data channel (0) and
an error channel (1), each opened by announcing the port (two bytes, little-endian), then the
data channel's bytes to and from the pod's IP.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web

#: Reads a pod (namespace, name) → the object, with the node's credentials.
PodSource = Callable[[str, str], Awaitable[dict[str, Any]]]
#: A pod's container log (pod name) → its file (None: no such pod here) and whether it runs.
LogSource = Callable[[str], tuple[Path | None, bool]]
#: How often a followed log is read again for what its process wrote since.
FOLLOW_S = 0.2


class KubeletServer:
    """HTTPS on 127.0.0.1 at a free port; only clients with a certificate of the cluster CA."""

    def __init__(self, pod: PodSource, logs: LogSource, context: ssl.SSLContext) -> None:
        self.pod, self.logs, self.context = pod, logs, context
        self.port = 0
        app = aiohttp.web.Application()
        app.router.add_get("/containerLogs/{namespace}/{name}/{container}", self._log)
        app.router.add_get("/portForward/{namespace}/{name}", self._port_forward)
        app.router.add_get("/portForward/{namespace}/{name}/{uid}", self._port_forward)
        self._runner = aiohttp.web.AppRunner(app, access_log=None)

    async def start(self) -> None:
        await self._runner.setup()
        site = aiohttp.web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.context)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        await self._runner.cleanup()

    async def _log(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        path, running = self.logs(request.match_info["name"])
        if path is None or not path.exists():
            return aiohttp.web.Response(status=404, text="no such container here")
        follow = request.query.get("follow") == "true"
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        with path.open("rb") as f:
            while True:
                chunk = f.read(1 << 16)
                if chunk:
                    await response.write(chunk)
                    continue
                if not follow or not running:  # read to its end after the process ended
                    break
                await asyncio.sleep(FOLLOW_S)
                running = self.logs(request.match_info["name"])[1]
        await response.write_eof()
        return response

    async def _port_forward(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        pod = await self.pod(request.match_info["namespace"], request.match_info["name"])
        ip = (pod.get("status") or {}).get("podIP")
        if not ip:
            return aiohttp.web.Response(status=404, text="the pod has no IP yet")
        port = int(request.query["port"].split(",")[0])
        ws = aiohttp.web.WebSocketResponse(protocols=("v4.channel.k8s.io",))
        await ws.prepare(request)
        for channel in (0, 1):
            await ws.send_bytes(bytes([channel]) + port.to_bytes(2, "little"))
        try:
            reader, writer = await asyncio.open_connection(ip, port)
        except OSError as exc:
            await ws.send_bytes(b"\x01" + f"connect {ip}:{port}: {exc}".encode())
            await ws.close()
            return ws
        with contextlib.suppress(Exception):
            await asyncio.gather(_upstream(ws, writer), _downstream(reader, ws))
        writer.close()
        return ws


async def _upstream(ws: aiohttp.web.WebSocketResponse, writer: asyncio.StreamWriter) -> None:
    async for msg in ws:
        if msg.type == aiohttp.WSMsgType.BINARY and msg.data[:1] == b"\x00":
            writer.write(msg.data[1:])
            await writer.drain()
    writer.close()


async def _downstream(reader: asyncio.StreamReader, ws: aiohttp.web.WebSocketResponse) -> None:
    while data := await reader.read(1 << 16):
        await ws.send_bytes(b"\x00" + data)
    await ws.close()
