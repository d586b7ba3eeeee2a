"""Jobs follow a renamed notebook: the kernel's ``JPY_SESSION_NAME`` is the name it started with,
while the server's sessions know the notebook's path now.

On each rename the contents service reports (``contents_service`` events: a file or a folder
above it), the sessions under the renamed path tell which kernels' notebook moved, and the
registry records each kernel's new path (``Registry.notebook_moved``), which the panel, ``jupyter
mn list`` and ``jupyter mn usage`` then show. JupyterLab renames the file first and moves its
session after: a session found at the old path or at the new one is the same notebook.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from tornado.ioloop import IOLoop

from ..jobs.registry import Registry

log = logging.getLogger(__name__)
#: The contents service's events (jupyter_server ≥ 2).
CONTENTS_EVENTS = "https://events.jupyter.org/jupyter_server/contents_service/v1"


def moved(path: str, old: str, new: str) -> str | None:
    """``path``'s name after ``old`` was renamed to ``new`` (None: not under either)."""
    for before in (old, new):
        if path == before:
            return new
        if path.startswith(before + "/"):
            return new + path[len(before) :]
    return None


def follow_renames(server_app: Any, registry: Registry) -> None:
    """Record the new path of every kernel's notebook that the server renames or moves."""
    root = server_app.root_dir
    sessions = server_app.session_manager

    async def renamed(logger: Any, schema_id: str, data: dict[str, Any]) -> None:
        """The event's listener (jupyter_events calls it by these names)."""
        if data.get("action") != "rename":
            return
        try:
            for session in await sessions.list_sessions():
                kernel = (session.get("kernel") or {}).get("id")
                path = moved(session.get("path") or "", data["source_path"], data["path"])
                if kernel and path:
                    where = os.path.join(root, path)
                    await IOLoop.current().run_in_executor(
                        None, registry.notebook_moved, kernel, where
                    )
        except Exception:  # a rename must never fail for the jobs' sake
            log.exception("jupyter_mn: could not record a renamed notebook's jobs")

    server_app.event_logger.add_listener(schema_id=CONTENTS_EVENTS, listener=renamed)
