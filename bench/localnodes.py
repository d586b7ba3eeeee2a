"""The processes of the local gang a benchmark started: a node's worker, found by its name."""

from __future__ import annotations

import psutil


def local_node(node: int) -> psutil.Process:
    """Node ``node``'s worker process (``dask spec``, named by its node index), a child of this
    process (its ranks are the children of the template the gang's nodes share, or its own)."""
    name = f'"name": "{node}"'
    for proc in psutil.Process().children():
        try:
            command = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if "dask_spec" in command and name in command:
            return proc
    raise RuntimeError(f"node {node} is not running")
