"""Issue 33's cases on a GPU machine, timed, with what the user reads (``bench/gpu_check.sh``).

Local nodes beyond the visible GPUs, a node with fewer GPUs than ranks, a one-node CUDA gang's
transport (its NCCL lines are saved to OUT_DIR/one_rank_real.log, a fixture's source), ``%cluster
bench`` and the doctor on it, and a rank's restart after SIGKILL. The kernel never touches CUDA:
GPUs are counted through NVML, as jupyter_mn does.

Run: ``python -m bench.gpu_cases OUT_DIR``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from jupyter_mn import Cluster
from jupyter_mn.doctor import doctor
from jupyter_mn.kernel.bandwidth import bench
from jupyter_mn.node.visible import gpu_uuids
from jupyter_mn.wire.events import GangState, Note, TransportReport

ALL_REDUCE = "t = torch.ones(1, device='cuda')\ndist.all_reduce(t)\nt.item()"
NCCL_LINES = (
    "import os\npath = os.environ['NCCL_DEBUG_FILE']\n"
    "open(path).read() if os.path.exists(path) else ''"
)


def refused(title: str, cluster: Cluster) -> None:
    """Run a cell on ``cluster``, which must fail: the error, and how long after the nodes came
    up (RENDEZVOUS) and after the call it came."""
    marks: dict[str, float] = {}

    def seen(event: object) -> None:
        if isinstance(event, GangState):
            marks.setdefault(event.state, time.perf_counter())

    started = time.perf_counter()
    try:
        with cluster:
            cluster.run("1", on_event=seen)
        print(f"{title}: NOT refused")
    except Exception as exc:
        now = time.perf_counter()
        up = marks.get("RENDEZVOUS")
        after_nodes = f", {now - up:.2f} s after the nodes were up" if up else ", no node started"
        print(f"{title}: {type(exc).__name__} after {now - started:.2f} s{after_nodes}: {exc}")


def one_node(out: Path) -> None:
    seen: list = []
    with Cluster(nodes=1, gpus=1, require_rdma=True) as cluster:
        started = time.perf_counter()
        value = cluster.run(ALL_REDUCE, on_event=seen.append).value
        print(f"1×1 CUDA gang, all_reduce: {value}", end=" ")
        print(f"({time.perf_counter() - started:.2f} s cold, up + first cell)")
        (out / "one_rank_real.log").write_text(cluster.run(NCCL_LINES).unwrap())
        report = [e for e in seen if isinstance(e, TransportReport)][-1]
        print(f"transport: {report.summary!r}, one_node={report.one_node}, fallback=", end="")
        print(report.fallback)
        print("  evidence:", *report.evidence[:6], sep="\n    ")
        print("notes:", [e.text for e in seen if isinstance(e, Note)])
        print("%cluster bench:", bench(cluster, 256 << 20))
        print(doctor(cluster))
        killed = time.perf_counter()
        result = cluster.run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
        value = cluster.run("torch.ones(1, device='cuda').item()").value
        cause = result.root_cause
        print(
            f"rank SIGKILL → next cell's value {value}: {time.perf_counter() - killed:.2f} s "
            f"(the killed cell: {cause.status if cause else 'ok'})"
        )


def main() -> None:
    out = Path(sys.argv[1])
    count = len(gpu_uuids())
    print(f"NVML: {count} GPU(s)")
    refused(f"local {count + 1}×1 on {count} GPU(s)", Cluster(nodes=count + 1, gpus=1))
    refused(
        "1×2 with CUDA_VISIBLE_DEVICES=0 (the agent counts)",
        Cluster(nodes=1, gpus=2, env={"CUDA_VISIBLE_DEVICES": "0"}),
    )
    one_node(out)


if __name__ == "__main__":
    main()
