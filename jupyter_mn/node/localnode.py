"""A local node's dask worker: ``python -m distributed.cli.dask_spec`` (dask's ``dask spec``)
builds it with ``worker`` here, in a process of its own started by ``gang/local.py``.

A real subprocess rather than a nanny's multiprocessing child: spawn re-imports the parent's main
module, so a script that makes a ``Cluster`` at its top level would run again in every worker
(ipyparallel starts its engines as subprocesses for the same reason). The gang's TLS certificate
arrives on stdin: neither argv (``ps``) nor the environment (the ranks inherit it) shows it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from distributed import Worker
from distributed.security import Security


def worker(scheduler: str, **options: Any) -> Worker:
    """``dask spec``'s worker class: a ``Worker`` whose TLS files' contents are read from stdin."""
    pems = json.load(sys.stdin)
    return Worker(scheduler, security=Security(require_encryption=True, **pems), **options)
