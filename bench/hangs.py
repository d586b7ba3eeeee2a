"""Time from a hang to its verdict, per case, next to what plain torch.distributed gives.

Run: ``.venv/bin/python -m bench.hangs [--reps N] [--hang-timeout S]`` (a 2×2 local gang, CPU
ranks, gloo).

Each case hangs at once (a rank 3 that skips the all_reduce, ranks calling different ops or
sizes, a rank 2 that SIGSTOPs itself inside the all_reduce 0.5 s in). Two numbers per case,
medians: when the watchdog's verdict arrived (``--hang-timeout S``, counted from the cell's
start: S plus the watchdog's own cost), and how long after ``--timeout`` the cell's error (the
verdict as its message) came. Plain torch.distributed on gloo says nothing until its
process-group timeout (1800 s by default), and then only "Timed out" on the waiting ranks; that
peer is measured side by side with a short timeout (``bench/faults.py``'s ``plain_peer``).
NCCL's own watchdog (``TORCH_NCCL_DUMP_ON_TIMEOUT``) needs GPUs: not measured here.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass

from bench.faults import GLOO_DEFAULT_S, plain_peer
from jupyter_mn import Cluster
from jupyter_mn.wire.events import Hung

ALL_REDUCE = "t = torch.ones(1)\ndist.all_reduce(t)\nt.item()"


@dataclass
class Case:
    name: str
    code: str


CASES = [
    Case(
        "missing: rank 3 skips the all_reduce",
        "import time\nt = torch.ones(1)\nif dist.get_rank() != 3:\n    dist.all_reduce(t)\n"
        "else:\n    time.sleep(600)",
    ),
    Case(
        "mismatch: all_reduce on 0, 1; barrier on 2, 3",
        "t = torch.ones(1)\nif dist.get_rank() < 2:\n    dist.all_reduce(t)\nelse:\n"
        "    dist.barrier()",
    ),
    Case(
        "mismatch: rank 3 reduces 2 elements, the others 1",
        "t = torch.ones(2 if dist.get_rank() == 3 else 1)\ndist.all_reduce(t)",
    ),
    Case(
        "stuck: rank 2 SIGSTOPped inside the all_reduce",
        "import os, signal, threading, time\nt = torch.ones(1)\nif dist.get_rank() == 2:\n"
        "    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGSTOP)).start()\nelse:\n"
        "    time.sleep(1.0)\ndist.all_reduce(t)",
    ),
]


def measure(cluster: Cluster, case: Case, hang_timeout: float, timeout: float) -> tuple:
    """(seconds to the watchdog's verdict, seconds from --timeout to the error, the verdict)."""
    assert cluster.run(ALL_REDUCE).value == 4.0  # ready, and any re-forming finished
    verdicts: list[tuple[float, str]] = []
    started = time.perf_counter()

    def on_event(event: object) -> None:
        if isinstance(event, Hung):
            verdicts.append((time.perf_counter() - started, event.verdict))

    result = cluster.run(case.code, timeout=timeout, hang_timeout=hang_timeout, on_event=on_event)
    ended = time.perf_counter() - started - timeout
    assert not result.ok and verdicts, f"{case.name}: no verdict"
    return verdicts[0][0], ended, verdicts[0][1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="repetitions per case (median)")
    parser.add_argument("--hang-timeout", type=float, default=2.0, help="the watchdog's S")
    parser.add_argument("--peer-timeout", type=float, default=10.0, help="PG timeout of the peer")
    args = parser.parse_args()
    timeout = args.hang_timeout + 6  # room for the looks at a frozen rank (1 s each)
    load = os.getloadavg()[0]
    rows = []
    with Cluster(nodes=2, gpus=2) as cluster:
        cluster.up()
        for case in CASES:
            runs = [measure(cluster, case, args.hang_timeout, timeout) for _ in range(args.reps)]
            rows.append((case, runs))
    peer = plain_peer(args.peer_timeout)
    print(f"2×2 local gang, gloo, {args.reps} runs each, load {load:.1f} at the start")
    print(f"--hang-timeout {args.hang_timeout:g} s, --timeout {timeout:g} s\n")
    print("| case | verdict (watchdog), from the cell's start | error, after --timeout |")
    print("|---|---|---|")
    for case, runs in rows:
        seen = statistics.median(r[0] for r in runs)
        ended = statistics.median(r[1] for r in runs)
        print(f"| {case.name} | {seen:.2f} s | {ended:.2f} s |")
    print(
        f"| plain torch.distributed (gloo), any case | never: the waiting ranks raise "
        f"'Timed out' after the PG timeout ({GLOO_DEFAULT_S} s; measured with "
        f"{args.peer_timeout:g} s: {peer:.1f} s), naming no rank | — |\n"
    )
    for case, runs in rows:
        print(f"{case.name}:\n  {runs[0][2]}")


if __name__ == "__main__":
    main()
