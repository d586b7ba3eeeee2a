"""``--backend dask`` from real kernels: the core notebooks on a CLI-started TLS cluster, workers
started from the notebook itself surviving Jupyter's interrupt, and a killed kernel's ranks."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import dask
import papermill
import psutil
import pytest
from distributed import Client, Security

from tests.e2e.test_papermill import CONTRACT, _notebook, _texts, run_quickstart
from tests.support.daskcli import BIN, DaskCLI, make_certs, tls_config, tls_env
from tests.support.kernels import Kernel
from tests.support.procs import ours, rank_processes, started_now, wait_gone


@pytest.fixture
def dask_env(dask_cli, monkeypatch) -> str:
    """Kernels started now use the dask backend on the shared cluster (env → ClusterSpec)."""
    for key, value in tls_env(dask_cli.certs).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("JUPYTER_MN_BACKEND", "dask")
    monkeypatch.setenv("JUPYTER_MN_SCHEDULER", dask_cli.address)
    return dask_cli.address


@pytest.mark.slow
def test_core_notebooks_run_on_the_dask_backend_2x2(no_leftovers, dask_env, dask_cli, tmp_path):
    pids = dask_cli.worker_pids()
    contract = papermill.execute_notebook(
        str(_notebook(CONTRACT, tmp_path / "contract.ipynb")),
        str(tmp_path / "contract-out.ipynb"),
        kernel_name="jupyter_mn",
        parameters={"nodes": 2, "gpus": 2},
        progress_bar=False,
    )
    text = _texts(contract)
    assert "'contract ok'" in text and "preflight: " in text
    for rank in range(4):
        assert f"[node {rank // 2} rank {rank}] hello from {rank}" in text
    run_quickstart(tmp_path / "quickstart-out.ipynb")
    assert dask_cli.worker_pids() == pids  # the user's workers were used, never restarted


def _wait_workers(address: str, certs: dict, count: int, timeout: float = 60) -> None:
    with (
        dask.config.set(tls_config(certs)),
        Client(address, security=Security(), set_as_default=False) as client,
    ):
        client.wait_for_workers(count, timeout=timeout)


def _stream_until(kernel: Kernel, text: str, timeout: float = 60) -> None:
    """Read IOPub until a stream message contains ``text`` (the cell is then running)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = kernel.kc.get_iopub_msg(timeout=deadline - time.monotonic())
        if msg["msg_type"] == "stream" and text in msg["content"]["text"]:
            return
    raise AssertionError(f"no {text!r} from the kernel")


def test_workers_started_from_the_notebook_survive_interrupts_and_a_dead_kernel_leaves_no_ranks(
    tmp_path, monkeypatch
):
    since = started_now()
    cli = DaskCLI(tmp_path, make_certs(tmp_path / "certs"))
    workers: list[psutil.Process] = []
    kernel = None
    try:
        address = cli.start_scheduler()
        for key, value in tls_env(cli.certs).items():
            monkeypatch.setenv(key, value)
        kernel = Kernel()
        tls = ["--tls-ca-file", cli.certs["ca"], "--tls-cert", cli.certs["cert"]]
        tls += ["--tls-key", cli.certs["key"]]
        started = kernel.run(  # `dask worker` in the kernel's process group, as `!cmd &` would
            "import subprocess\nprocs = [subprocess.Popen(["
            f"{str(BIN / 'dask')!r}, 'worker', {address!r}, '--name', f'nb{{i}}', "
            "'--host', f'127.0.0.{i + 1}', '--nthreads', '1', '--memory-limit', '0', "
            f"'--dashboard-address', f'127.0.0.{{i + 1}}:0', *{tls!r}], "
            "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(2)]\n"
            "[p.pid for p in procs]"
        )
        workers = [psutil.Process(int(p)) for p in started.result.strip("[]").split(",")]
        assert {os.getpgid(p.pid) for p in workers} == {os.getpgid(kernel.pid)}
        _wait_workers(address, cli.certs, 2)
        up = kernel.run(f"%%cluster --backend dask --scheduler {address} --nodes 2 --gpus 1\n1")
        assert up.result == "1", up.error_text
        assert "share this kernel's process group: they now ignore SIGINT" in up.stdout
        kernel.kc.execute("%%cluster\nimport time\nprint('sleeping', flush=True)\ntime.sleep(60)")
        _stream_until(kernel, "sleeping")
        kernel.km.interrupt_kernel()  # SIGINT to the kernel's whole process group
        reply = kernel.kc.get_shell_msg(timeout=60)["content"]
        assert reply["status"] == "error" and reply["ename"] == "CellInterrupted"
        assert all(p.is_running() for w in workers for p in [w, *w.children()])
        assert kernel.run("%%cluster\n40 + 2").result == "42"  # same gang, same workers
        ranks = rank_processes([c for w in workers for c in w.children(recursive=True)])
        assert len(ranks) == 2
        os.kill(kernel.pid, signal.SIGKILL)
        assert not wait_gone(ranks, timeout=30), "a dead kernel's ranks kept running"
        assert all(w.is_running() for w in workers)  # the workers stay, free for others
    finally:
        for w in workers:
            with contextlib.suppress(psutil.NoSuchProcess):
                for p in [*w.children(recursive=True), w]:
                    p.kill()
        if kernel is not None:
            with contextlib.suppress(Exception):
                kernel.shutdown()
        cli.stop()
    assert not wait_gone(ours(since)), "processes of this test survived it"
