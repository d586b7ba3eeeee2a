"""A cell that loops on all_reduce, as training does, and a listener that breaks something once
rank 1 says it loops: the fault cases on test hosts (tests and ``bench/faults.py --hosts``)."""

from __future__ import annotations

import time
from collections.abc import Callable

from jupyter_mn.events import LogLines

#: Both ranks loop on all_reduce, as training does; "looping" says when to break something.
#: They agree when to stop (one more collective on one rank alone would wait forever).
LOOP = """
import time
print("looping", flush=True)
t = torch.ones(1)
end = time.monotonic() + {seconds}
going = torch.ones(1)
while going.item():
    dist.all_reduce(t)
    going = torch.tensor([float(time.monotonic() < end)])
    dist.all_reduce(going, op=dist.ReduceOp.MIN)
dist.get_world_size()
"""


def when_looping(action: Callable[[], None]) -> Callable[[object], None]:
    """An event listener that runs ``action`` once, when rank 1 says it loops."""
    done: list[float] = []

    def on_event(event: object) -> None:
        if done or not isinstance(event, LogLines):
            return
        if any(rank == 1 and "looping" in lines for rank, _, lines in event.items):
            action()
            done.append(time.monotonic())

    on_event.done = done  # type: ignore[attr-defined]
    return on_event
