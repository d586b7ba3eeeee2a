"""Jupyter server extension: the REST API over the job registry that the Clusters panel reads.

Enabled automatically on install (``jupyter-config/server-config/jupyter_mn.json``).
"""

from __future__ import annotations

from typing import Any


def _load_jupyter_server_extension(server_app: Any) -> None:
    from ..registry import Registry
    from .handlers import setup_handlers

    setup_handlers(server_app.web_app, Registry(), server_app.root_dir)
    server_app.log.info("jupyter_mn: job API at /jupyter-mn/api/jobs")
