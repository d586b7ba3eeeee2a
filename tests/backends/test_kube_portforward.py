"""Port-forward through the API server (WebSocket, v4.channel.k8s.io), one stream per connection."""

from __future__ import annotations

import os
import socket
import socketserver
import threading
from collections.abc import Iterator

import pytest

from jupyter_mn.gang.kubernetes.portforward import PortForward, pod_stream
from tests.support.kube.cluster import NAMESPACE, FakeCluster


class Echo(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        self.connections = 0

        class Handler(socketserver.BaseRequestHandler):
            def handle(inner) -> None:
                self.connections += 1
                while data := inner.request.recv(65536):
                    inner.request.sendall(data)

        super().__init__(("127.0.0.1", 0), Handler)


@pytest.fixture
def echo() -> Iterator[Echo]:
    server = Echo()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def roundtrip(port: int, payload: bytes) -> bytes:
    """Send, read the echo back, close (port-forward streams cannot half-close)."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(payload)
        received = b""
        while len(received) < len(payload) and (data := sock.recv(65536)):
            received += data
    return received


def test_each_connection_gets_its_own_stream_to_the_pod(tmp_path, echo):
    from kubernetes import client, config

    with FakeCluster(tmp_path, nodes={}) as cluster:  # no nodes: the pod stays where we put it
        api = config.new_client_from_config(str(cluster.kubeconfig))
        core = client.CoreV1Api(api)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p0"},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        }
        core.create_namespaced_pod(NAMESPACE, pod)
        core.patch_namespaced_pod_status("p0", NAMESPACE, {"status": {"podIP": "127.0.0.1"}})
        forward = PortForward(pod_stream(core, NAMESPACE, "p0", echo.server_address[1]))
        try:
            big = os.urandom(1 << 18)
            results: dict[str, bytes] = {}
            threads = [
                threading.Thread(
                    target=lambda k=k, p=p: results.__setitem__(k, roundtrip(forward.port, p))
                )
                for k, p in (("small", b"hello pod 0"), ("big", big))
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert results == {"small": b"hello pod 0", "big": big}
            assert echo.connections == 2
        finally:
            forward.close()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", forward.port), timeout=2)
        api.close()
