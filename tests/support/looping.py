"""A cell that loops on all_reduce, as training does, and a listener that breaks something once
rank 1 says it loops: the fault cases on test hosts (tests and ``bench/faults.py --hosts``)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from jupyter_mn.wire.events import LogLines
from tests.support.hosts import Host
from tests.support.procs import processes, rank_processes

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


def link_down(host: Host) -> tuple[Callable[[], None], Callable[[], None]]:
    """Cut ``host``'s link (no FIN, no RST reaches anyone), and bring it back (idempotent)."""
    return (
        lambda: host.run("ip", "link", "set", "eth0", "down"),
        lambda: host.run("ip", "link", "set", "eth0", "up"),
    )


def frozen(pid: int) -> tuple[Callable[[], None], Callable[[], None]]:
    """Freeze process ``pid`` (SIGSTOP: alive, silent), and thaw it."""
    return lambda: os.kill(pid, signal.SIGSTOP), lambda: os.kill(pid, signal.SIGCONT)


@dataclass
class KernelCut:
    """An action that cuts ``host`` off from ``gateway`` alone (where the kernel and the
    scheduler are), so its ranks still reach their peers, and notes when those ranks are gone."""

    host: Host
    gateway: str
    ranks: list[psutil.Process] = field(default_factory=list)
    gone: list[float] = field(default_factory=list)

    def __call__(self) -> None:
        self.ranks.extend(rank_processes(processes(*self.host.pids())))
        self.host.drop(peer=self.gateway)
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        psutil.wait_procs(
            self.ranks, timeout=60, callback=lambda _: self.gone.append(time.monotonic())
        )
