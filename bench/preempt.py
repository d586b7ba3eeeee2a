"""A preempted 2×2 gang: SIGTERM to node 1's process mid-training, to a COMPLETE checkpoint and to
training resumed on a new gang.

Run: ``.venv/bin/python -m bench.preempt [--reps N]`` (local gang, CPU ranks, gloo; a ~25 MB DDP
model whose loop calls ``checkpoint.preempted()`` every step). Medians of ``--reps`` rounds:

- *notice*: SIGTERM → the kernel has the node's ``Preemption`` event;
- *steps late*: how many steps rank 0 printed after the SIGTERM before every rank agreed;
- *COMPLETE*: SIGTERM → the preemption checkpoint is COMPLETE (the ranks' own clock from the
  notice, plus the notice's latency);
- *resumed*: SIGTERM → the new gang's first training step from that checkpoint.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time

from bench.localnodes import local_node
from jupyter_mn import Cluster
from jupyter_mn.wire.events import LogLines, Preemption

TRAIN = """
import time
from torch.nn.parallel import DistributedDataParallel as DDP
from jupyter_mn import checkpoint

torch.manual_seed(0)
model = DDP(torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(6)]))
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
last = checkpoint.latest(CKPT)
start = checkpoint.load(last, {"model": model, "opt": opt})["step"] if last else 0
if last is None:
    checkpoint.save({"model": model, "opt": opt}, CKPT, 0)  # a warm loop: DCP imported
for step in range(start, 100_000):
    loss = model(torch.ones(8, 1024)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if dist.get_rank() == 0:
        print(f"step {step}" + (" resumed" if step == start and last else ""), flush=True)
    if last is not None and step >= start + 2:
        break
    if checkpoint.preempted():
        checkpoint.save({"model": model, "opt": opt}, CKPT, step + 1)
        break
"""


class Round:
    """One preemption: the SIGTERM at rank 0's step 10, and when each stage was seen."""

    def __init__(self) -> None:
        self.sent_at = self.notice_at = self.resumed_at = 0.0
        self.sent_step = self.last_step = -1

    def __call__(self, event: object) -> None:
        if isinstance(event, Preemption) and not self.notice_at:
            self.notice_at = time.monotonic()
        if not isinstance(event, LogLines):
            return
        for _, _, texts in event.items:
            for text in texts:
                if not text.startswith("step "):
                    continue
                if text.endswith(" resumed") and not self.resumed_at:
                    self.resumed_at = time.monotonic()
                elif not self.resumed_at:
                    self.last_step = int(text.split()[1])
                if self.last_step >= 10 and not self.sent_at:
                    os.kill(local_node(1).pid, signal.SIGTERM)  # rank 2's node
                    self.sent_at, self.sent_step = time.monotonic(), self.last_step


def one_round(folder: str) -> dict[str, float]:
    watch = Round()
    with Cluster(nodes=2, gpus=2) as cluster:
        first = cluster.run(TRAIN, namespace={"CKPT": folder}, on_event=watch)
        outcome = first.preemption
        assert outcome is not None and outcome.checkpoint, first.notes
        resumed = cluster.run(TRAIN, namespace={"CKPT": folder}, on_event=watch)
        assert resumed.ok and watch.resumed_at, resumed.unwrap()
    notice = watch.notice_at - watch.sent_at
    return {
        "notice": notice,
        "steps late": watch.last_step - watch.sent_step,
        "COMPLETE": notice + (outcome.after_s or 0.0),
        "resumed": watch.resumed_at - watch.sent_at,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    rounds = []
    for rep in range(args.reps):
        with tempfile.TemporaryDirectory() as folder:
            rounds.append(one_round(folder))
        print(f"  round {rep + 1}/{args.reps}: {rounds[-1]}", file=sys.stderr)
    print("SIGTERM to node 1 of a 2×2 local gang (CPU, gloo), medians of", args.reps)
    for key, unit in (("notice", "s"), ("steps late", ""), ("COMPLETE", "s"), ("resumed", "s")):
        value = statistics.median(r[key] for r in rounds)
        print(f"  {key:>10}: {value:.2f} {unit}".rstrip())


if __name__ == "__main__":
    main()
