"""Reach pod 0's dask scheduler from outside the cluster, through the API server.

A listener on 127.0.0.1 accepts the dask client's connections; each one gets its own
port-forward stream (``kubernetes.stream.portforward`` carries one TCP connection per stream),
and two threads copy bytes until either side closes. The stream factory is injected, so the
relay does not depend on where the bytes go. The dask traffic inside is TLS end to end.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from typing import Any

_CHUNK = 1 << 16


class PortForward:
    """Forward ``127.0.0.1:<port>`` to whatever ``open_stream()`` connects to."""

    def __init__(self, open_stream: Callable[[], Any]) -> None:
        self._open = open_stream
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._closed = threading.Event()
        self._sockets: set[Any] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name="jupyter-mn-forward").start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                local, _ = self._server.accept()
            except OSError:
                return
            try:
                remote = self._open()
            except Exception:  # the API server refused the stream: the client sees a reset
                local.close()
                continue
            with self._lock:
                self._sockets |= {local, remote}
            for src, dst in ((local, remote), (remote, local)):
                threading.Thread(
                    target=self._pump, args=(src, dst), daemon=True, name="jupyter-mn-pump"
                ).start()

    def _pump(self, src: Any, dst: Any) -> None:
        try:
            while data := src.recv(_CHUNK):
                dst.sendall(data)
        except OSError:
            pass
        finally:  # streams cannot half-close: end both directions, then close our source
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._sockets.discard(src)
            src.close()

    def close(self) -> None:
        """Stop accepting and cut every open connection."""
        self._closed.set()
        with contextlib.suppress(OSError):  # wakes the blocked accept(); close() alone does not
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        with self._lock:
            sockets, self._sockets = list(self._sockets), set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


def pod_stream(core: Any, namespace: str, pod: str, port: int) -> Callable[[], Any]:
    """A factory of port-forward streams to ``pod:port`` (``core``: ``CoreV1Api``)."""

    def open_stream() -> Any:
        from kubernetes.stream import portforward

        forward = portforward(
            core.connect_get_namespaced_pod_portforward, pod, namespace, ports=str(port)
        )
        return forward.socket(port)

    return open_stream
