"""The few admin requests that setting up a control plane needs, with the standard library.

The control plane starts before anything else of the tests runs (and from ``real.py up`` with
only ``cryptography`` and PyYAML installed), so its own set-up does not go through the
kubernetes client: it creates objects from manifests and polls a few conditions.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from typing import Any


class RestError(RuntimeError):
    """A request the API server refused: its status and the Status object's message."""

    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        super().__init__(f"{method} {path}: {status} {body}")
        self.status = status


class Rest:
    def __init__(self, server: str, context: ssl.SSLContext) -> None:
        self.server, self.context = server, context

    def request(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, context=self.context, timeout=30) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            raise RestError(exc.code, method, path, exc.read().decode(errors="replace")) from None

    def get(self, path: str) -> dict[str, Any]:
        return self.request("GET", path)

    def create(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", path, obj)

    def wait(self, path: str, check: Any, timeout: float, what: str) -> dict[str, Any]:
        """GET ``path`` until ``check(obj)`` is true (a missing object counts as not yet)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                obj = self.get(path)
                if check(obj):
                    return obj
            except RestError as exc:
                if exc.status != 404:
                    raise
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not after {timeout} s")
            time.sleep(0.1)
