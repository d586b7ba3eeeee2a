"""Jupyter server extension: the REST API over the job registry that the Multi-node jobs panel
reads, the endpoint of JupyterLab's "Submit notebook" command (``submitapi``), the kernel
status JupyterLab shows kept right while a cell runs (``kernelstatus``), and jobs that follow
their notebook's renames (``renames``).

Enabled automatically on install (``jupyter-config/server-config/jupyter_mn.json``).
"""

from __future__ import annotations

from typing import Any


def _load_jupyter_server_extension(server_app: Any) -> None:
    from ..jobs.registry import Registry
    from .handlers import setup_handlers
    from .kernelstatus import untrack_subshell_messages
    from .renames import follow_renames
    from .submitapi import setup_submit_handler

    registry = Registry()
    setup_handlers(server_app.web_app, registry, server_app.root_dir)
    setup_submit_handler(server_app.web_app, registry, server_app.root_dir)
    untrack_subshell_messages(server_app)
    follow_renames(server_app, registry)
    server_app.log.info("jupyter_mn: job API at /jupyter-mn/api/jobs")
