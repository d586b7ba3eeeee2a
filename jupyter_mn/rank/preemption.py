"""What this rank knows of a preemption: the notice its agent forwarded, whether the gang agrees
it was given, and the checkpoint completed since.

The notice arrives on the stacks socket's thread (``runtime.py``) while the main thread runs the
cell; ``checkpoint.preempted()`` reads it there, and ``checkpoint.save`` reports what it
completed, so the rank's reply tells the kernel whether the grace period was used.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

from ..wire.events import Preemption

#: how long a rank that learns of a notice from its peers waits for its own copy
_PEER_NOTICE_S = 2.0
_heard = threading.Event()
_notice: Preemption | None = None
_heard_at = 0.0
#: the newest checkpoint completed after the notice, and seconds after it
_saved: tuple[str, float] | None = None
#: whether forked children get SIGTERM's default back (registered once)
_shielded = False


def shield() -> None:
    """Keep running on SIGTERM: Slurm signals every process of a job's step, ranks included,
    when it preempts or requeues the job; the notice reaches the rank through its agent, and the
    agent stops it at the deadline. (A handler, not SIG_IGN, which the rank's own children would
    inherit through exec; and a child it forks, a DataLoader's worker, gets the default back, so
    that its ``terminate()`` ends it.)"""
    global _shielded
    signal.signal(signal.SIGTERM, _noted_elsewhere)
    if not _shielded:
        _shielded = True
        os.register_at_fork(after_in_child=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))


def _noted_elsewhere(signum: int, frame: Any) -> None:
    """The node's agent got the same signal and sends the notice."""


def hear(notice: Preemption) -> None:
    """Keep the first notice (each node's agent and the kernel may both send it)."""
    global _notice, _heard_at
    if _notice is None:
        _notice, _heard_at = notice, time.monotonic()
        _heard.set()


def notice(wait: float = 0.0) -> Preemption | None:
    """The notice, waiting up to ``wait`` s for it (a peer heard it first)."""
    if wait:
        _heard.wait(wait)
    return _notice


def saved(location: str) -> None:
    """``checkpoint.save`` completed ``location`` (every rank calls it)."""
    global _saved
    if _notice is not None:
        _saved = (location, time.monotonic() - _heard_at)


def report() -> dict[str, object]:
    """The rank reply's fields for the checkpoint completed since the notice (none: empty)."""
    if _saved is None:
        return {}
    return {"checkpoint": _saved[0], "checkpoint_after_s": round(_saved[1], 3)}


def agree() -> bool:
    """Whether any rank has heard a notice: one all-reduce of a flag over the default group, so
    every rank answers alike at the same call (Lightning agrees on its SIGTERM flag the same
    way). A rank that learns it from its peers waits briefly for its own copy of the notice (the
    kernel sends it to every node at once), so ``cluster_info().preemption`` then says which."""
    import torch
    import torch.distributed as dist

    heard = _notice is not None
    if not (dist.is_available() and dist.is_initialized()):
        return heard
    cuda = dist.get_backend() == "nccl"
    flag = torch.tensor([int(heard)], device=torch.cuda.current_device() if cuda else "cpu")
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    agreed = bool(flag.item())
    if agreed and not heard:
        notice(wait=_PEER_NOTICE_S)
    return agreed
