"""The network faults of ``bench/faults.py --hosts``, on test hosts (``tests/support/hosts.py``:
network namespaces with their own addresses on a bridge; needs root).

Per fault: the time from the fault to the cell's error, and to the next cell's value (a fresh
gang, on a spare host); next to it, two plain torch.distributed processes on two hosts looping on
``all_reduce`` with the same fault: the survivor waits for its process-group timeout. Then
``%cluster bench`` on three hosts whose links ``tc tbf`` shapes to a line rate, then one of them
to a tenth of it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from jupyter_mn import Cluster
from jupyter_mn.kernel.bandwidth import bench
from tests.support.daskcli import DaskCLI
from tests.support.hosts import Host, HostNet
from tests.support.looping import LOOP, KernelCut, frozen, link_down, when_looping

#: Short, so the kernel-cut row does not wait 15 s; the liveness window stays 10 s.
HEARTBEAT_TIMEOUT = 5.0
LINE, LINE_GBS = "200mbit", 0.025
SLOW = "20mbit"
SIZE = 4 << 20

Row = tuple[str, float, float, str]  # fault, to the error, to the next value, what it said


def _host_of(net: HostNet, ip: str) -> Host:
    return next(h for h in net.hosts if h.ip == ip)


def gang_fault(cluster: Cluster, net: HostNet, cli: DaskCLI, fault: str) -> Row:
    """Break node 1 while both ranks loop; time to the cell's error and to the next value."""
    cluster.run("1")  # a gang is up: node 1's host is known
    far = _host_of(net, cluster.up().hosts[1])
    kernel_cut: KernelCut | None = None
    if fault == "partition (link down)":
        action, restore = link_down(far)
    elif fault == "frozen node (agent SIGSTOP)":
        action, restore = frozen(cli.worker_pids()[far.hostname])
    else:  # the kernel (and scheduler) lose the node; its peers still reach it
        action = kernel_cut = KernelCut(far, net.gateway)
        restore = far.heal
    listener = when_looping(action)
    try:
        result = cluster.run(LOOP.format(seconds=120), on_event=listener)
        failed = time.monotonic()
    finally:
        restore()
    cause = result.root_cause
    said = f"{cause.error.ename}: {cause.error.evalue.splitlines()[0]}" if cause else "no error"
    if kernel_cut is not None and kernel_cut.gone:
        stopped = max(kernel_cut.gone) - listener.done[0]
        said = f"its ranks stopped {stopped:.1f} s after the cut; {said}"
    assert cluster.run("dist.get_world_size()").unwrap() == 2
    return fault, failed - listener.done[0], time.monotonic() - failed, said


PEER = """
import sys, time, torch, torch.distributed as dist
from datetime import timedelta
rank, master, timeout = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
dist.init_process_group("gloo", init_method=f"tcp://{master}:29411", rank=rank, world_size=2,
                        timeout=timedelta(seconds=timeout))
print("looping", flush=True)
t = torch.ones(1)
try:
    while True:
        dist.all_reduce(t)
except RuntimeError as exc:
    print("failed:", str(exc).splitlines()[0].split("] ")[-1][:100], flush=True)
"""


def plain_peer(net: HostNet, fault: str, timeout: float) -> Row:
    """Plain torch.distributed, one rank on each of two hosts: the survivor's wait."""
    near, far = net.hosts[:2]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0"}  # the hostnames resolve to nothing
    procs = [
        subprocess.Popen(
            host.command([sys.executable, "-c", PEER, str(r), near.ip, str(timeout)]),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # gloo's own complaints
            text=True,
            env=env,
        )
        for r, host in enumerate((near, far))
    ]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "looping"
        # `ip netns exec`, unshare and sh exec into python: the pid is the rank's
        fail, _ = link_down(far) if fault.startswith("partition") else frozen(procs[1].pid)
        fail()
        started = time.monotonic()
        said = procs[0].stdout.readline().strip()
        waited = time.monotonic() - started
    finally:
        link_down(far)[1]()
        for proc in procs:
            proc.kill()
            proc.wait()
    return f"{fault}, plain torch.distributed", waited, float("nan"), said


def bandwidth(net: HostNet, cli: DaskCLI) -> list[str]:
    lines = []
    with Cluster(nodes=3, gpus=1, backend="dask", scheduler=cli.address) as cluster:
        cluster.up()
        try:
            for host in net.hosts[:3]:
                host.shape(LINE)
            even = bench(cluster, SIZE, iters=5, warmup=1)
            far = _host_of(net, cluster.up().hosts[2])
            far.heal()
            far.shape(SLOW)
            uneven = bench(cluster, SIZE, iters=5, warmup=1)
        finally:
            for host in net.hosts:
                host.heal()
    for title, report in ((f"every link {LINE}", even), (f"node 2's link {SLOW}", uneven)):
        busbw = report.rows[0].busbw
        lines += [
            f"\n{title}: busbw {busbw:.4f} GB/s = {busbw / LINE_GBS:.2f} × the line rate "
            f"({LINE_GBS} GB/s)",
            str(report),
        ]
    return lines


def main(reps: int, peer_timeout: float) -> None:
    faults = ["partition (link down)", "frozen node (agent SIGSTOP)", "kernel ↔ node cut"]
    rows: list[Row] = []
    with (
        HostNet.create(3) as net,
        DaskCLI.on_hosts(Path(tempfile.mkdtemp(prefix="jmn-bench-")), net) as cli,
    ):
        # first, while every worker is there (a cut longer than ~30 s makes dask drop one)
        print("\n".join(bandwidth(net, cli)), flush=True)
        spec = {"heartbeat_timeout": HEARTBEAT_TIMEOUT}
        with Cluster(nodes=2, gpus=1, backend="dask", scheduler=cli.address, **spec) as cluster:
            for fault in faults:
                for _ in range(reps):
                    rows.append(gang_fault(cluster, net, cli, fault))
                    print(f"  measured: {fault}", file=sys.stderr)
        for fault in faults[:2]:
            rows.append(plain_peer(net, fault, peer_timeout))
    print(
        f"\nnetwork faults on test hosts (dask backend, 2 nodes × 1 CPU rank, gloo), load "
        f"{os.getloadavg()[0]:.1f}; liveness_timeout 10 s, heartbeat_timeout "
        f"{HEARTBEAT_TIMEOUT:g} s, the plain peer's PG timeout {peer_timeout:g} s"
    )
    print(f"{'fault':48} {'to the error':>12} {'next value':>11}  what the cell said")
    for fault, failed, after, said in rows:
        print(f"{fault:48} {failed:10.1f} s {after:9.1f} s  {said[:150]}")
