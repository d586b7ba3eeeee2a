"""Time to a clean failure, per fault, next to what a peer would wait: the process-group timeout.

Run: ``.venv/bin/python -m bench.faults [--reps N]`` (a 2×2 local gang, CPU ranks, gloo);
``--hosts`` (root): the network faults instead, on test hosts (``bench/faults_hosts.py``: a
partition, a frozen node, a kernel ↔ node cut, plain torch.distributed beside them, and busbw
against a shaped line rate).

For each fault the table gives the median time from the cell's start to its error (for a
``--timeout`` fault: from the timeout), the median time until the next cell ran (the group
re-formed, or the node's ranks restarted), and what a notebook running plain torch.distributed
(ipyparallel, jupyter-distributed) waits instead: the peers of a failed rank block until the
process-group timeout (30 min for gloo, 10 min for NCCL by default). That peer is measured here too,
side by side, with a short timeout: it waits exactly its timeout.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass

import psutil

from bench.localnodes import local_node
from jupyter_mn import Cluster

GLOO_DEFAULT_S, NCCL_DEFAULT_S = 1800, 600
ALL_REDUCE = "t = torch.ones(1)\ndist.all_reduce(t)\nt.item()"


@dataclass
class Fault:
    name: str
    code: str
    timeout: float | None = None


def on_rank(rank: int, body: str) -> str:
    return f"if dist.get_rank() == {rank}:\n" + textwrap.indent(body, "    ") + "\n" + ALL_REDUCE


FAULTS = [
    Fault("rank 3 raises before all_reduce", on_rank(3, "raise ValueError('boom')")),
    Fault(
        "rank 3 raises inside all_reduce",
        "t = torch.ones(1)\ndist.all_reduce('bad' if dist.get_rank() == 3 else t)",
    ),
    Fault("rank 3 raises after all_reduce", ALL_REDUCE + "\n" + on_rank(3, "raise ValueError()")),
    Fault("rank 3 SIGKILL", on_rank(3, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")),
    Fault("rank 3 os._exit(3)", on_rank(3, "import os\nos._exit(3)")),
    Fault("rank 1 segfault (ctypes)", on_rank(1, "import ctypes\nctypes.string_at(0)")),
    Fault(
        "rank 2 over --memory-limit (OOM kill)",
        on_rank(2, "x = torch.ones(900_000_000, dtype=torch.uint8)\nimport time\ntime.sleep(60)"),
    ),
    Fault("rank 0 SIGKILL (c10d store host)", on_rank(0, "import os\nos.kill(os.getpid(), 9)")),
    Fault(
        "hang, --timeout 1 (SIGINT + cascade)",
        on_rank(3, "import time\ntime.sleep(600)"),
        timeout=1,
    ),
    Fault(
        "all blocked in recv, --timeout 1 (abort)",
        "t = torch.ones(1)\ndist.recv(t, src=(dist.get_rank() + 1) % 4)",
        timeout=1,
    ),
    Fault(
        "hang ignoring SIGINT, --timeout 1 (kill)",
        "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(600)",
        timeout=1,
    ),
]


def rank_pids() -> dict[int, int]:
    pids = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            if "jupyter_mn.rank.runtime" in " ".join(proc.cmdline()):
                pids[int(proc.environ()["RANK"])] = proc.pid
        except (psutil.Error, KeyError):
            continue
    return pids


def measure(cluster: Cluster, fault: Fault) -> tuple[float, float]:
    assert cluster.run(ALL_REDUCE).value == 4.0  # ready, and any re-forming finished
    started = time.perf_counter()
    result = cluster.run(fault.code, timeout=fault.timeout)
    failed = time.perf_counter() - started - (fault.timeout or 0)
    assert not result.ok, f"{fault.name}: the cell did not fail"
    started = time.perf_counter()
    assert cluster.run(ALL_REDUCE).value == 4.0
    return failed, time.perf_counter() - started


def agent_lost(cluster: Cluster) -> tuple[float, float]:
    """Kill node 1's dask worker while rank 3 sleeps: NodeLost, then the next cell's new gang."""
    cluster.run(ALL_REDUCE)
    worker = local_node(1)
    handle = cluster.submit(on_rank(3, "import time\ntime.sleep(600)"))
    while "time.sleep" not in str(cluster.stacks()):  # rank 3 is in its sleep
        time.sleep(0.02)
    started = time.perf_counter()
    worker.kill()
    assert not handle.cell_result(timeout=60).ok
    failed = time.perf_counter() - started
    started = time.perf_counter()
    assert cluster.run(ALL_REDUCE).value == 4.0
    return failed, time.perf_counter() - started


KERNEL = """
import os, sys
from jupyter_mn import Cluster
if __name__ == "__main__":
    cluster = Cluster(nodes=2, gpus=2)
    cluster.run("1")
    print("up", flush=True)
    sys.stdin.read()
"""


def kernel_killed() -> tuple[float, float]:
    """A Python process (standing for the kernel) with a 2×2 gang is killed with SIGKILL."""
    proc = subprocess.Popen(
        [sys.executable, "-c", KERNEL],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # its resource tracker reports the semaphores it cleans up
        text=True,
    )
    assert proc.stdout.readline().strip() == "up"
    tree = psutil.Process(proc.pid).children(recursive=True)
    started = time.perf_counter()
    proc.kill()
    proc.wait()
    psutil.wait_procs(tree, timeout=60)
    return time.perf_counter() - started, float("nan")


PEER = """
import sys, time, torch, torch.distributed as dist
from datetime import timedelta
rank, port, timeout = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4,
                        timeout=timedelta(seconds=timeout))
if rank == 3:
    print("ready", flush=True)
    time.sleep(timeout * 3)   # raised, and the notebook tool keeps its process (and group) alive
else:
    t = torch.ones(1)
    try:
        dist.all_reduce(t)
    except RuntimeError:
        pass
"""


def plain_peer(timeout: float) -> float:
    """Plain torch.distributed: how long peers of a failed rank stay blocked (its group lives)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PEER, str(r), str(port), str(timeout)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # gloo's errors and its abort at exit: expected here
            text=True,
        )
        for r in range(4)
    ]
    assert procs[3].stdout.readline().strip() == "ready"
    started = time.perf_counter()
    for proc in procs[:3]:
        proc.wait()
    waited = time.perf_counter() - started
    procs[3].send_signal(signal.SIGKILL)
    procs[3].wait()
    return waited


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="repetitions per fault (median)")
    parser.add_argument("--peer-timeout", type=float, default=10.0, help="PG timeout of the peer")
    parser.add_argument("--hosts", action="store_true", help="network faults on test hosts")
    args = parser.parse_args()
    if args.hosts:
        from bench.faults_hosts import main as on_hosts

        on_hosts(max(1, args.reps // 3), args.peer_timeout)
        return
    load = os.getloadavg()[0]
    rows: list[tuple[str, list[float], list[float]]] = []
    with Cluster(nodes=2, gpus=2, memory_limit="900MB") as cluster:
        cluster.up()
        for fault in FAULTS:
            runs = [measure(cluster, fault) for _ in range(args.reps)]
            rows.append((fault.name, [r[0] for r in runs], [r[1] for r in runs]))
            print(f"  measured: {fault.name}", file=sys.stderr)
        runs = [agent_lost(cluster) for _ in range(max(1, args.reps // 2))]
        rows.append(("node agent SIGKILL", [r[0] for r in runs], [r[1] for r in runs]))
    runs = [kernel_killed() for _ in range(max(1, args.reps // 2))]
    rows.append(("kernel SIGKILL: every process gone", [r[0] for r in runs], []))
    peer = plain_peer(args.peer_timeout)

    print(f"\nfaults on a 2×2 local gang (CPU, gloo), {args.reps} runs each, load {load:.1f}")
    head = f"{'fault':42} {'clean failure':>14} {'next cell ok':>13} {'peer waits':>11} {'×':>6}"
    print(head)
    print("-" * len(head))
    for name, failed, recovered in rows:
        fail = statistics.median(failed)
        ready = f"{statistics.median(recovered):.2f} s" if recovered else "-"
        ratio = GLOO_DEFAULT_S / fail
        print(f"{name:42} {fail:12.3f} s {ready:>13} {GLOO_DEFAULT_S:9d} s {ratio:6.0f}")
    print(
        f"\npeer, measured side by side: plain torch.distributed, rank 3 failed, its process kept "
        f"alive (as a notebook kernel does): peers blocked {peer:.2f} s with a "
        f"{args.peer_timeout:g} s PG timeout, i.e. the timeout; defaults: gloo {GLOO_DEFAULT_S} s, "
        f"NCCL {NCCL_DEFAULT_S} s."
    )


if __name__ == "__main__":
    main()
