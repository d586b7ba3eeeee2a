"""A job model as a kernel would write it, owned by this (live) test process."""

from __future__ import annotations

import os
import re
import time
from typing import Any

import psutil

from jupyter_mn.jobs.registry import JobModel, NodeModel

#: A number in scientific notation (``3.11e-05``) standing alone: not the digits, ``e`` and
#: dash inside an id (``train-bd328e-29dfd9b2``).
SCIENTIFIC = re.compile(r"(?<![\w.])\d+(?:\.\d+)?e-\d+(?!\w)")


def make_job(job_id: str = "jmn-1", **changes: Any) -> JobModel:
    """A READY 2×1 local job; ``changes`` override any field."""
    values: dict[str, Any] = dict(
        id=job_id,
        name=job_id,
        gang=job_id,
        backend="local",
        shape="2×1",
        gpus=1,
        world_size=2,
        state="READY",
        # after this test process started: it stands in for the job's kernel
        started=max(time.time() - 5, psutil.Process().create_time()),
        heartbeat=time.time(),
        pid=os.getpid(),  # alive: this test process stands in for the owning kernel
        nodes=[NodeModel(0, ranks=["ready"]), NodeModel(1, ranks=["ready"])],
    )
    values.update(changes)
    return JobModel(**values)
