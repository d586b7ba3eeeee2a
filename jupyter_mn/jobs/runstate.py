"""The states of a submitted run (``jupyter mn submit``), apart from a gang's: a run is a
notebook's whole execution, whose cells make and release gangs of their own.

Leaf module: the registry reads it to know which runs are over.
"""

from __future__ import annotations

from enum import Enum


class RunState(str, Enum):
    #: recorded by ``submit``; its runner has not started the kernel yet (on Slurm: the job is
    #: queued, or requeued to start over)
    SUBMITTED = "SUBMITTED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    #: a cell raised, or the kernel died (the job's ``error`` says which)
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


#: The states after which nothing of a run is left.
RUN_ENDED = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED})
