"""Warm-cell latency and cold start, jupyter_mn side by side with its peers in one run.

Measured through real kernels (execute request → idle reply, what a notebook user waits for):

* warm trivial cell (``x = 1``) and warm all-reduce cell at 4 ranks: ``%%cluster --nodes 2
  --gpus 2`` vs ipyparallel ``%%px`` on 4 engines, with a plain ipykernel cell as the floor;
* cold start of a 2×2 gang (first cell, ranks up with the process group formed) vs
  ``torchrun --nnodes 1 --nproc-per-node 4`` of a script that initializes gloo and runs a barrier.

Rounds interleave the tools (A, B, C, A, B, C, …) so load changes hit all of them alike.
* where a cold 2×2 start goes (``--phases N``): nodes, rank start-up, the first cell and a rank's
  restart (SIGKILL → the next cell's value), with the nodes' rank templates and without
  (``JUPYTER_MN_RANK_TEMPLATE=0``), next to torchrun and to what one rank's imports cost alone.

Run: ``.venv/bin/python -m bench.cells [--warm N] [--cold N] [--phases N]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from jupyter_client.manager import KernelManager

TRIVIAL = "x = 1"
PLAIN = "plain ipykernel, x = 1"
MN_TRIVIAL, IPP_TRIVIAL = "jupyter_mn %%cluster 2×2, x = 1", "ipyparallel %%px 4 engines, x = 1"
MN_REDUCE, IPP_REDUCE = "jupyter_mn %%cluster 2×2, all_reduce", "ipyparallel %%px 4, all_reduce"
MN_COLD, TORCHRUN = "jupyter_mn 2×2 gang up + first cell", "torchrun 4 procs, init + barrier"
ALL_REDUCE = "t = torch.ones(1)\ndist.all_reduce(t)"
TEMPLATE, NO_TEMPLATE = "template", "no template"
TEMPLATE_VAR = "JUPYTER_MN_RANK_TEMPLATE"
COLD_ROWS = {how: f"total: up + first cell ({how})" for how in (TEMPLATE, NO_TEMPLATE)}
RESTART_ROWS = {how: f"rank 3 SIGKILL → next value ({how})" for how in (TEMPLATE, NO_TEMPLATE)}
KILL_RANK_3 = (
    "import os, signal\nif dist.get_rank() == 3:\n    os.kill(os.getpid(), signal.SIGKILL)"
)
TORCHRUN_SCRIPT = """
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
"""


class Kernel:
    def __init__(self, name: str) -> None:
        self.km = KernelManager(kernel_name=name)
        self.km.start_kernel()
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def run(self, code: str, timeout: float = 300) -> float:
        """Seconds from sending ``code`` to the kernel's reply; raises if the cell failed."""
        started = time.perf_counter()
        reply = self.kc.execute_interactive(code, timeout=timeout, output_hook=lambda m: None)
        elapsed = time.perf_counter() - started
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"{code!r} failed: {reply['content'].get('evalue')}")
        return elapsed

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ipyparallel_kernel() -> Kernel:
    kernel = Kernel("python3")
    kernel.run(
        "import ipyparallel as ipp\n"
        "ipp_cluster = ipp.Cluster(n=4, log_level=40)\n"
        "rc = ipp_cluster.start_and_connect_sync()\n"
        # block: %%px waits for the engines' replies, as %%cluster does (without it a %%px cell
        # returns at once with a pending AsyncResult)
        "dv = rc[:]\ndv.block = True\ndv.activate()\n"
        "dv.scatter('rank', list(range(4)), flatten=True, block=True)\n"
        "dv.execute('import torch, torch.distributed as dist\\n"
        f'dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{_free_port()}",'
        " rank=rank, world_size=4)', block=True)\n",
        timeout=600,
    )
    return kernel


def summarize(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return statistics.median(ordered), p95


def interleave(tools: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {name: [] for name in tools}
    for _ in range(rounds):
        for name, measure in tools.items():
            samples[name].append(measure())
    return samples


def warm(rounds: int) -> dict[str, list[float]]:
    plain, mn, ipp = Kernel("python3"), Kernel("jupyter_mn"), ipyparallel_kernel()
    try:
        mn.run(f"%%cluster --nodes 2 --gpus 2\n{TRIVIAL}", timeout=600)  # bring the gang up
        tools = {
            PLAIN: lambda: plain.run(TRIVIAL),
            MN_TRIVIAL: lambda: mn.run(f"%%cluster\n{TRIVIAL}"),
            IPP_TRIVIAL: lambda: ipp.run(f"%%px\n{TRIVIAL}"),
            MN_REDUCE: lambda: mn.run(f"%%cluster\n{ALL_REDUCE}"),
            IPP_REDUCE: lambda: ipp.run(f"%%px\n{ALL_REDUCE}"),
        }
        for measure in tools.values():  # warm-up, not recorded
            for _ in range(5):
                measure()
        return interleave(tools, rounds)
    finally:
        ipp.run("ipp_cluster.stop_cluster_sync()")
        for kernel in (plain, mn, ipp):
            kernel.close()


def torchrun_once() -> float:
    """``torchrun`` of 4 processes that initialize gloo and pass a barrier, start to end."""
    script = Path(tempfile.mkdtemp()) / "init.py"
    script.write_text(TORCHRUN_SCRIPT)
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1"]
    command += ["--nproc-per-node", "4", "--master-port", str(_free_port()), str(script)]
    started = time.perf_counter()
    subprocess.run(
        command, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    return time.perf_counter() - started


def cold(rounds: int) -> dict[str, list[float]]:
    from jupyter_mn import Cluster

    def jupyter_mn() -> float:
        started = time.perf_counter()
        with Cluster(nodes=2, gpus=2) as cluster:
            cluster.run("dist.barrier()").unwrap()
            elapsed = time.perf_counter() - started
        return elapsed

    return interleave({MN_COLD: jupyter_mn, TORCHRUN: torchrun_once}, rounds)


@contextlib.contextmanager
def rank_template(on: bool) -> Iterator[None]:
    """Local nodes start their ranks from a template or not (they inherit this environment)."""
    before = os.environ.get(TEMPLATE_VAR)
    os.environ[TEMPLATE_VAR] = "1" if on else "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ[TEMPLATE_VAR]
        else:
            os.environ[TEMPLATE_VAR] = before


def phases(rounds: int) -> dict[str, list[float]]:
    """Where a cold 2×2 gang's time goes, with its nodes' rank templates and without
    (``JUPYTER_MN_RANK_TEMPLATE=0``: every rank imports torch itself), next to torchrun: its
    nodes alone (scheduler, workers, agents: a gang brought up without ranks), the whole gang up,
    its first cell, a rank's restart (SIGKILL → the next cell's value); and what one rank's
    imports cost alone (``python -c "import torch, jupyter_mn.rank.runtime"``)."""
    from jupyter_mn import Cluster

    steps: dict[str, list[float]] = {}

    def timed(name: str, started: float) -> float:
        now = time.perf_counter()
        steps.setdefault(name, []).append(now - started)
        return now

    def gang(how: str) -> None:
        started = time.perf_counter()
        with Cluster(nodes=2, gpus=2) as cluster:
            cluster.up()
            up = timed(f"gang up: nodes + 4 ranks in their group ({how})", started)
            cluster.run("dist.barrier()").unwrap()
            timed(f"first cell (barrier) once up ({how})", up)
            timed(COLD_ROWS[how], started)
            killed = time.perf_counter()
            assert not cluster.run(KILL_RANK_3).ok
            cluster.run("dist.barrier()").unwrap()
            timed(RESTART_ROWS[how], killed)

    for _ in range(rounds):
        started = time.perf_counter()
        with Cluster(nodes=2, gpus=2).nodes():
            timed("nodes alone: scheduler + 2 workers + agents", started)
        for how, on in ((TEMPLATE, True), (NO_TEMPLATE, False)):
            with rank_template(on):
                gang(how)
        steps.setdefault(TORCHRUN, []).append(torchrun_once())
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch, jupyter_mn.rank.runtime"], check=True)
        timed("one python -c 'import torch, …rank.runtime'", started)
    return steps


def table(
    title: str,
    samples: dict[str, list[float]],
    unit: float,
    unit_name: str,
    baselines: dict[str, str],
    floor: str | None = None,
) -> str:
    """One row per tool: p50, p95, samples, the p50 above ``floor``'s (``+ms over plain``)
    and the ratio of p50s to the tool's baseline."""
    over = f"+{unit_name.strip()} over plain" if floor else ""
    width = max(46, *(len(name) for name in samples))
    rows = [
        f"\n{title}",
        f"{'':{width}} {'p50':>9} {'p95':>9}  {'n':>4}  {over:>16}  ratio (p50)",
        "-" * (width + 60),
    ]
    medians = {name: summarize(v)[0] for name, v in samples.items()}
    for name, values in samples.items():
        p50, p95 = summarize(values)
        base = baselines.get(name)
        ratio = f"{p50 / medians[base]:.2f}× {base.split(',')[0]}" if base else ""
        above = f"{(p50 - medians[floor]) * unit:+.1f}" if floor and name != floor else ""
        rows.append(
            f"{name:{width}} {p50 * unit:8.1f}{unit_name} {p95 * unit:8.1f}{unit_name}"
            f"  {len(values):4}  {above:>16}  {ratio}"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm", type=int, default=100, help="warm rounds per tool")
    parser.add_argument("--cold", type=int, default=5, help="cold-start rounds per tool")
    parser.add_argument("--phases", type=int, default=0, help="rounds of the cold-start breakdown")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    if args.warm:
        w = warm(args.warm)
        print(
            table(
                "Warm cell through a real kernel (execute → reply)",
                w,
                1000,
                "ms",
                {
                    MN_TRIVIAL: IPP_TRIVIAL,
                    MN_REDUCE: IPP_REDUCE,
                },
                floor=PLAIN,
            ),
            flush=True,
        )
    if args.cold:
        c = cold(args.cold)
        print(
            table(
                "Cold start, 4 ranks",
                c,
                1,
                "s ",
                {
                    MN_COLD: TORCHRUN,
                },
            ),
            flush=True,
        )
    if args.phases:
        baselines = {
            COLD_ROWS[TEMPLATE]: TORCHRUN,
            COLD_ROWS[NO_TEMPLATE]: TORCHRUN,
            RESTART_ROWS[TEMPLATE]: RESTART_ROWS[NO_TEMPLATE],
        }
        p = phases(args.phases)
        print(table("Where a cold 2×2 start goes", p, 1, "s ", baselines), flush=True)
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
