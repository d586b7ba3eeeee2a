"""Authorizers for the authorization tests: a logged-in user who may not touch jupyter_mn, and
one who may use jupyter_mn but not run code in a kernel."""

from __future__ import annotations

from typing import Any

from jupyter_server.auth import Authorizer


class NoJobs(Authorizer):
    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        return resource != "jupyter_mn"


class NoKernels(Authorizer):
    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        return (action, resource) != ("execute", "kernels")
