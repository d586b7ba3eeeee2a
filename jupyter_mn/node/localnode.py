"""A local gang's dask processes: ``python -m distributed.cli.dask_spec`` (dask's ``dask spec``)
builds the scheduler with ``scheduler`` and each node's worker with ``worker`` here, every one
in a process of its own started by ``gang/local.py``.

Real subprocesses rather than a nanny's multiprocessing children: spawn re-imports the parent's
main module, so a script that makes a ``Cluster`` at its top level would run again in every
worker (ipyparallel starts its engines as subprocesses for the same reason). The gang's TLS
certificate arrives on stdin: neither argv (``ps``) nor the environment (the ranks inherit it)
shows it. A worker reads the scheduler's address there too, so all the processes start (import)
at once, and the scheduler picks its own port: none is chosen ahead and raced for.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from distributed import Scheduler, Worker
from distributed.security import Security

from . import template
from .entry import OrphanGuard


class _AnnouncedScheduler(Scheduler):
    """Says its address on stdout (one line) once it listens: the kernel waits for it."""

    async def start_unsafe(self) -> Scheduler:
        await super().start_unsafe()
        print(self.address, flush=True)
        return self


def scheduler(connect_timeout: float, **options: Any) -> Scheduler:
    """``dask spec``'s scheduler class: TLS files' contents from stdin (one line). It closes once
    the kernel's client has gone (a killed kernel leaves nothing: its workers close with it)."""
    pems = json.loads(sys.stdin.readline())
    return _AnnouncedScheduler(
        security=Security(require_encryption=True, **pems),
        plugins=[OrphanGuard(orphan_timeout=0, connect_timeout=connect_timeout)],
        **options,
    )


def worker(job: str, **options: Any) -> Worker:
    """``dask spec``'s worker class: the scheduler's address and the TLS files' contents from
    stdin (which the kernel writes, and closes, once the scheduler listens). ``job``'s rank
    template starts first: its imports overlap the worker's start and the gang's."""
    template.prestart(job)
    given = json.load(sys.stdin)
    address = given.pop("scheduler")
    return Worker(address, security=Security(require_encryption=True, **given), **options)
