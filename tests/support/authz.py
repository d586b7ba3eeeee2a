"""An Authorizer for the authorization test: a logged-in user who may not touch jupyter_mn."""

from __future__ import annotations

from typing import Any

from jupyter_server.auth import Authorizer


class NoJobs(Authorizer):
    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        return resource != "jupyter_mn"
