"""Checkpoints of a ~100 MB DDP model on a 2×2 gang: the 0.1 format against DCP, sync vs async.

Run: ``.venv/bin/python -m bench.checkpoint [--reps N]`` (a 2×2 local gang, CPU ranks, gloo).

Side by side in one run, medians of ``--reps`` rounds, each round measuring every way once:

- *0.1 format*: what ``checkpoint.save`` did before DCP (each rank ``torch.save``s its whole
  state, fsync, barrier, rank 0 writes the manifest and ``COMPLETE``): the model is written
  once per rank.
- *DCP*: ``checkpoint.save`` (replicated tensors written once, spread over the ranks).
- *DCP async*: ``checkpoint.save(..., async_=True)``; "save time" is until ``COMPLETE``.

"step stall" is how long the training step waited in ``save()``; "next step" is the DDP step
after it (for async: while the write goes on) against the step before it. On a shared CPU box a
step (a 100 MB all-reduce over gloo) varies by a second or more from one to the next, so compare
the stall, not the loop.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

from jupyter_mn import Cluster

SETUP = """
import json, os, shutil, time
from pathlib import Path
from torch.nn.parallel import DistributedDataParallel as DDP
from jupyter_mn import checkpoint

torch.manual_seed(0)
model = DDP(torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(6)]))
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
MB = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6

def step():
    loss = model(torch.randn(4, 2048)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()

def save_0_1(directory, n):
    '''The 0.1 path: every rank torch.saves its whole state; COMPLETE after a barrier.'''
    path = Path(directory) / f"step-{n:09d}"
    if dist.get_rank() == 0:
        path.mkdir(parents=True)
    dist.barrier()
    shard = {"state": {"model": model.state_dict(), "opt": opt.state_dict()}}
    with open(path / f"rank-{dist.get_rank():05d}.pt", "wb") as f:
        torch.save(shard, f)
        f.flush()
        os.fsync(f.fileno())
    dist.barrier()
    if dist.get_rank() == 0:
        (path / "manifest.json").write_text(json.dumps({"format": 1, "step": n}))
        (path / "COMPLETE").write_text("ok\\n")
    dist.barrier()

def written(directory):
    return sum(f.stat().st_size for f in Path(directory).rglob("*") if f.is_file()) / 1e6

def measure(kind, directory):
    '''(MB written, s until COMPLETE, s blocked in save(), s of the step before, of the next)'''
    state = {"model": model, "opt": opt}
    save = {
        "0.1 format": lambda: save_0_1(directory, 1),
        "DCP": lambda: checkpoint.save(state, directory, 1),
        "DCP async": lambda: checkpoint.save(state, directory, 1, async_=True),
    }[kind]
    dist.barrier()
    t = time.perf_counter()
    step()
    before = time.perf_counter() - t
    t = time.perf_counter()
    save()
    blocked = time.perf_counter() - t
    t = time.perf_counter()
    step()
    after = time.perf_counter() - t
    checkpoint.wait()
    dist.barrier()
    size, done = written(directory), blocked
    if kind == "DCP async":  # again, waited for at once: the time until COMPLETE
        t = time.perf_counter()
        save()
        checkpoint.wait()
        done = time.perf_counter() - t
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(directory, ignore_errors=True)
    return size, done, blocked, before, after
"""

KINDS = ("0.1 format", "DCP", "DCP async")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="rounds (median)")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    runs: dict[str, list[tuple[float, ...]]] = {k: [] for k in KINDS}
    with (
        tempfile.TemporaryDirectory(prefix="jmn-bench-ckpt-") as root,
        Cluster(nodes=2, gpus=2) as c,
    ):
        size = c.run(SETUP + "MB").unwrap()
        c.run(f"measure('DCP', '{root}/warm')").unwrap()  # DDP buckets, checkpoint group
        for rep in range(args.reps):
            for kind in KINDS:
                where = f"{root}/{rep}-{kind.replace(' ', '-')}"
                runs[kind].append(c.run(f"measure({kind!r}, {where!r})").unwrap())
            print(f"  round {rep + 1}/{args.reps} done", file=sys.stderr)

    print(
        f"\ncheckpoint of a {size:.1f} MB DDP model (SGD) on a 2×2 local gang (CPU, gloo), "
        f"{args.reps} rounds, medians, load {load:.1f}"
    )
    head = (
        f"{'':12} {'MB written':>11} {'save time':>10} {'step stall':>11} "
        f"{'step before':>12} {'next step':>10}"
    )
    print(head)
    print("-" * len(head))
    for kind in KINDS:
        size, done, blocked, before, after = (
            statistics.median(r[i] for r in runs[kind]) for i in range(5)
        )
        print(
            f"{kind:12} {size:11.1f} {done:8.2f} s {blocked:9.2f} s {before:10.2f} s {after:8.2f} s"
        )


if __name__ == "__main__":
    main()
