"""The flight recorder read back (``rank/flight.py``) in a real single-rank gloo group: the
latest collective of each live group with its op, sizes, dtypes and completion, and nothing of
a group a re-forming destroyed (the ring still holds its entries, under the same names)."""

from __future__ import annotations

import dataclasses
import os
import pickle
import subprocess
import sys

from jupyter_mn.rank.flight import FR_BUFFER_SIZE
from jupyter_mn.wire.rankwhere import Collective

SCRIPT = """
import pickle, sys, time, torch, torch.distributed as dist
from jupyter_mn.rank import flight

def settled(*args):
    # gloo counts a collective completed from its own thread, just after wait() returns
    deadline = time.monotonic() + 10
    while True:
        records = flight.latest(flight.trace(), *args)
        if all(c.completed for c in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.01)

before = flight.latest(flight.trace())
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
dist.all_reduce(torch.ones(3))
dist.all_reduce(torch.ones(3, dtype=torch.float64))
experts = dist.new_group([0], group_desc="experts")
dist.barrier(group=experts)
first = settled(0, flight.group_ranks())
dist.destroy_process_group()
formed = time.time_ns()
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
dist.broadcast(torch.ones(2, 5, dtype=torch.int64), 0)
second = settled(formed)
sys.stdout.buffer.write(pickle.dumps((before, first, second)))
"""


def latest_records() -> tuple[tuple[Collective, ...], ...]:
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": FR_BUFFER_SIZE}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, timeout=120, check=True
    )
    return pickle.loads(out.stdout)


def without_time(records: tuple[Collective, ...]) -> list[Collective]:
    assert all(c.entered_ns > 0 for c in records)
    return [dataclasses.replace(c, entered_ns=0) for c in records]


def test_each_live_group_gives_its_latest_collective_and_a_destroyed_one_nothing():
    before, first, second = latest_records()
    assert before == ()  # no group yet
    assert without_time(first) == [
        Collective("0", "default_pg", 2, "all_reduce", ((3,),), ("float64",), 0, True, (0,)),
        Collective("1", "experts", 1, "barrier", (), (), 0, True, (0,)),
    ]
    assert first[1].group == "pg 1 (experts)" and first[0].signature == "all_reduce(float64[3])"
    # the re-formed default group is "0" again (as on every rank, restarted or not), from #1
    assert without_time(second) == [
        Collective("0", "default_pg", 1, "broadcast", ((2, 5),), ("int64",), 0, True)
    ]
