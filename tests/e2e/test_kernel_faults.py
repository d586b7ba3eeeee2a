"""Faults seen from a real kernel: the stop button during a blocked all_reduce, a kernel killed
with ``kill -9``, and a kernel that stops answering (the heartbeat's dead-man switch)."""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime
from pathlib import Path

import nbformat
import psutil
import pytest
from nbclient import NotebookClient

from jupyter_mn.node.kernelbeat import BUSY_TIMEOUTS, KERNEL_HEARTBEAT_S
from tests.support.kernels import Kernel
from tests.support.procs import ours, running, wait_gone

SHM = Path("/dev/shm")
#: what the issue allows for each (the heartbeat test shortens the agents' patience)
INTERRUPT_S, ORPHAN_S = 5.0, 30.0
#: The agents' patience in the heartbeat test (a silent kernel that still runs counts as busy
#: for ``BUSY_TIMEOUTS`` of them: 30 s).
HEARTBEAT_TIMEOUT = 3


def _timing(cell: nbformat.NotebookNode) -> float:
    """Seconds between the kernel starting a cell and its reply (nbclient records both)."""
    start, end = (
        datetime.fromisoformat(cell.metadata["execution"][key].replace("Z", "+00:00"))
        for key in ("iopub.execute_input", "shell.execute_reply")
    )
    return (end - start).total_seconds()


def test_interrupting_a_blocked_all_reduce_keeps_the_kernel(tmp_path, no_leftovers):
    cells = [
        "%%cluster --nodes 2 --gpus 2\nkeep = dist.get_rank()",
        "%%cluster\nimport time\nt = torch.ones(1)\nif dist.get_rank() == 3:\n"
        "    time.sleep(600)\ndist.all_reduce(t)",  # ranks 0-2 block in all_reduce
        "%%cluster --all\nt = torch.ones(1)\ndist.all_reduce(t)\n(t.item(), keep)",
        "%cluster down",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    blocked_timeout = 3
    client = NotebookClient(
        nb,
        kernel_name="jupyter_mn",
        timeout=180,
        timeout_func=lambda cell: blocked_timeout if "time.sleep(600)" in cell.source else 180,
        interrupt_on_timeout=True,
        allow_errors=True,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()
    blocked, after = nb.cells[1], nb.cells[2]
    error = next(o for o in blocked.outputs if o.output_type == "error")
    assert error.ename == "CellInterrupted"
    assert error.evalue.startswith(
        "interrupted by the user: rank 3 (node 1) never entered all_reduce #"
    )
    stacks = "".join(o.get("text", "") for o in blocked.outputs if o.output_type == "stream")
    assert "[node 1 rank 3] running" in stacks and "time.sleep(600)" in stacks
    assert "dist.all_reduce(t)" in stacks  # where ranks 0-2 waited, in the cell's line numbers
    assert _timing(blocked) < blocked_timeout + INTERRUPT_S
    assert after.outputs[-1].data["text/plain"] == "[(4.0, 0), (4.0, 1), (4.0, 2), (4.0, 3)]"


def _shared_memory(procs: list[psutil.Process]) -> set[str]:
    """Files under /dev/shm these processes map or hold open (segments, named semaphores).

    Other programs on the machine create and remove their own there meanwhile, so the test
    follows ours rather than comparing directory listings."""
    found = set()
    for proc in procs:
        try:
            found |= {m.path for m in proc.memory_maps() if m.path.startswith(str(SHM))}
            found |= {f.path for f in proc.open_files() if f.path.startswith(str(SHM))}
        except psutil.Error:
            continue
    return found


def _listening(procs: list[psutil.Process]) -> set[int]:
    ports = set()
    for proc in procs:
        try:
            ports |= {c.laddr.port for c in proc.net_connections("tcp") if c.status == "LISTEN"}
        except psutil.Error:
            continue
    return ports


def _cmdline(pid: int | None) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline()) if pid else "?"
    except psutil.Error:
        return "?"


SHARED_MEMORY = (
    "%%cluster --nodes 2 --gpus 2\nfrom multiprocessing import shared_memory\n"
    "segment = shared_memory.SharedMemory(create=True, size=1 << 20)\nsegment.name"
)


def test_kernel_killed_leaves_no_process_port_or_shared_memory(no_leftovers):
    kernel = Kernel()
    try:
        reply = kernel.run(SHARED_MEMORY)
        assert reply.status == "ok", reply.error_text
        segment = reply.result.strip("'")
        assert (SHM / segment).exists()
        tree = [psutil.Process(kernel.pid), *kernel.descendants()]
        ports = _listening(tree)
        assert len(ports) >= 3  # the scheduler, the workers, rank 0's c10d store, gloo
        shared = _shared_memory(tree)
        assert str(SHM / segment) in shared
        os.kill(kernel.pid, signal.SIGKILL)
        killed = time.monotonic()
        assert not wait_gone(tree, timeout=ORPHAN_S)
        assert time.monotonic() - killed < ORPHAN_S
    finally:
        kernel.kc.stop_channels()
        kernel.km.cleanup_resources()
    left = [
        (c.laddr.port, c.pid, _cmdline(c.pid))
        for c in psutil.net_connections("tcp")
        if c.status == "LISTEN" and c.laddr.port in ports
    ]
    assert not left, "ports the gang listened on are still listening (port, pid, command)"
    assert not [path for path in shared if Path(path).exists()], "shared memory left behind"


def test_silent_kernel_is_abandoned_by_its_agents(monkeypatch, no_leftovers):
    """SIGSTOP keeps the kernel alive but silent, so dask notices nothing (its client stays
    connected to the scheduler): only the heartbeat can tell the agents to free the node, and
    the scheduler closes when its last worker has gone. The agents share the kernel's host, so
    they see its process stopped, not busy: one heartbeat timeout, not ``BUSY_TIMEOUTS``."""
    monkeypatch.setenv("JUPYTER_MN_HEARTBEAT_TIMEOUT", str(HEARTBEAT_TIMEOUT))
    kernel = Kernel()
    try:
        assert kernel.run("%%cluster --nodes 2 --gpus 1\n1").result == "1"
        tree = [p for p in ours(no_leftovers) if p.pid != kernel.pid]  # scheduler, workers, ranks
        assert len(tree) >= 4
        os.kill(kernel.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        while running(tree) and time.monotonic() - stopped < ORPHAN_S:
            time.sleep(0.1)  # polling the process table, with a deadline
        gone_after, left = time.monotonic() - stopped, running(tree)
    finally:
        os.kill(kernel.pid, signal.SIGKILL)
        kernel.kc.stop_channels()
        kernel.km.cleanup_resources()
    assert not left, left
    # the last beat came up to KERNEL_HEARTBEAT_S before the stop
    assert HEARTBEAT_TIMEOUT - KERNEL_HEARTBEAT_S <= gone_after < ORPHAN_S
    assert gone_after < BUSY_TIMEOUTS * HEARTBEAT_TIMEOUT


@pytest.mark.slow
def test_a_preempted_cell_resumes_on_a_new_gang_with_retries(tmp_path, no_leftovers):
    """SIGTERM to node 1's process mid-training, through a real kernel: the text view counts
    the grace period down, every rank saves at one step, and ``--retries 1`` resumes there."""
    from tests.gang.test_preemption import TRAIN, worker_of

    kernel = Kernel()
    sent: list[int] = []

    def preempt_at_step_30(stdout: str) -> None:
        if not sent and "] step 30\n" in stdout:
            sent.append(worker_of(2, kernel.descendants()).pid)  # rank 2 lives on node 1
            os.kill(sent[0], signal.SIGTERM)

    try:
        kernel.run(f"CKPT, STEPS = {str(tmp_path / 'ckpt')!r}, 120")
        reply = kernel.run(
            "%%cluster --nodes 2 --gpus 2 --retries 1\n" + TRAIN,
            timeout=600,
            on_stream=preempt_at_step_30,
        )
    finally:
        kernel.shutdown()
    assert sent and reply.status == "ok", reply.error_text
    assert "jupyter_mn: PREEMPTING node 1 (" in reply.stderr
    assert "retry 1/1: node 1 was preempted; running the cell again" in reply.stdout
    resumed = [line for line in reply.stdout.splitlines() if "resumed from step" in line]
    assert len(resumed) == 4 and 30 < int(resumed[0].split()[-1]) < 120, resumed  # every rank
