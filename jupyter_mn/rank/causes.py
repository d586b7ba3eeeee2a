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
    for its peers inside torch.distributed (the rank that kept them waiting is the cause).

    An interrupt that ends a wait in gloo may strike only once the wait has failed (the
    interrupt closed the connections) and that error has left torch's frames: it then strikes
    in the cell while a consequence is on its way out, and is one too."""
    if isinstance(exc, KeyboardInterrupt):
        context = exc.__context__
        struck = _TORCH_DISTRIBUTED in getattr(exc, "struck_in", "")
        return struck or (context is not None and is_secondary(context))
    return says_secondary(str(exc))
