"""Which errors are consequences of another rank's failure rather than a root cause.

A rank whose peer died sees "Connection reset by peer" or an aborted communicator; the result
names the rank that failed first instead. A leaf, read by cell ranks and by the node agent's
script runs (whose errors arrive as text).
"""

from __future__ import annotations

import os

#: Messages of errors that only say a peer went away: a consequence, not the root cause.
SECONDARY_MESSAGES = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "has been destroyed",
    "Application timeout caused pair closure",
    "process group has been aborted",
    "NCCL communicator was aborted",
    "Socket Timeout",
    "SIGABRT",
    "Connection refused",
)

_TORCH_DISTRIBUTED = f"{os.sep}torch{os.sep}distributed{os.sep}"


def says_secondary(message: str) -> bool:
    """An error message that only says a peer went away."""
    return any(s in message for s in SECONDARY_MESSAGES)


def is_secondary(exc: BaseException) -> bool:
    """A consequence of another rank's failure, or an interrupt that found this rank waiting
    for its peers inside torch.distributed (the rank that kept them waiting is the cause)."""
    if isinstance(exc, KeyboardInterrupt):
        return _TORCH_DISTRIBUTED in getattr(exc, "struck_in", "")
    return says_secondary(str(exc))
