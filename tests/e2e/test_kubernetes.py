"""``%%cluster --backend kubernetes`` in a real kernel, against the test API server.

The test kubelet runs each pod's container command (``python -m jupyter_mn.node.pod``) as a
local process with the pod's environment (downward API resolved), so this checks the container
command, the env contract, the TLS Secret, readiness, cluster DNS between pods and the
port-forward back to the kernel, without a real cluster. ``%cluster down`` must delete every
object and stop every process.
"""

from __future__ import annotations

import ast
import contextlib
import json
from collections.abc import Iterator

import nbformat
import papermill
import psutil
import pytest

from jupyter_mn.node.ports import is_free, listen_port
from tests.e2e.test_papermill import ROOT, _texts
from tests.support.kernels import Kernel
from tests.support.kube.cluster import FakeCluster

CELL = """%%cluster --backend kubernetes --nodes 2 --gpus 2 --image registry.example/agent:1 {extra}
import os
t = torch.tensor([float(dist.get_rank())])
dist.all_reduce(t)
print("host", os.environ["HOSTNAME"], "node", os.environ["NODE_RANK"], "sum", t.item())
(t.item(), dist.get_rank(), dist.get_world_size(), os.environ["JUPYTER_MN_BACKEND"])
"""


def free_port() -> int:
    """A free port whose successor is free too (the pod's readiness port), both below the
    ephemeral range, where no outgoing connection takes them before the pod listens."""
    while True:
        port = listen_port("127.0.0.1")
        if is_free("127.0.0.1", port + 1):
            return port


def _listening() -> list:
    """The listening sockets of the pods' processes (their own, not the ranks')."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.cmdline()[1:3] == ["-m", "jupyter_mn.node.pod"]:
                found += [c for c in proc.net_connections("inet") if c.status == psutil.CONN_LISTEN]
    return found


@pytest.fixture
def cluster(tmp_path, monkeypatch) -> Iterator[FakeCluster]:
    with FakeCluster(tmp_path, processes=True) as fake:
        monkeypatch.setenv("KUBECONFIG", str(fake.kubeconfig))  # the kernel inherits it
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        yield fake


@pytest.mark.slow
def test_cell_runs_on_pods_and_down_deletes_everything(cluster, no_leftovers):
    """An --env value reaches the ranks through the gang's Secret, never the Job or its pods."""
    token = "hf_" + "Kq8" * 12
    kernel = Kernel()
    try:
        dask_port = free_port()
        extra = f"--dask-port {dask_port} --env HF_TOKEN={token}"
        reply = kernel.run(CELL.format(extra=extra), timeout=300)
        assert reply.status == "ok", reply.error_text
        seen = kernel.run("%%cluster\nos.environ['HF_TOKEN'][-4:], len(os.environ['HF_TOKEN'])")
        assert seen.result == repr((token[-4:], len(token))), seen.error_text
        ours = cluster.ours()
        secrets = sorted(o["metadata"]["name"] for o in ours if o["kind"] == "Secret")
        assert [name.rsplit("-", 1)[1] for name in secrets] == ["env", "tls"]
        assert token not in json.dumps([o for o in ours if o["kind"] != "Secret"])
        wide = [(c.laddr.ip, c.laddr.port) for c in _listening() if c.laddr.ip in ("0.0.0.0", "::")]
        assert [port for _, port in wide] == [dask_port]  # pod 0's scheduler, for a port-forward
        assert ast.literal_eval(reply.result) == (6.0, 0, 4, "kubernetes")
        job = next(o for o in cluster.ours() if o["kind"] == "Job")
        for rank in range(4):
            node = rank // 2
            line = f"[node {node} rank {rank}] host {job['metadata']['name']}-{node} node {node}"
            assert f"{line} sum 6.0" in reply.stdout, reply.stdout
        assert "jupyter_mn: gang: creating 2 pod(s) in namespace notebooks" in reply.stdout
        pods = [o for o in cluster.ours() if o["kind"] == "Pod"]
        assert len(pods) == 2 and all(p["status"]["phase"] == "Running" for p in pods)

        again = kernel.run("%%cluster\ndist.get_rank() + 10", timeout=60)  # the warm gang
        assert again.result == "10", again.error_text
        shell = kernel.run("%cluster exec --all-nodes -- echo on $JUPYTER_MN_JOB", timeout=60)
        assert f"[node 1] on {job['metadata']['name']}\n" in shell.stdout, shell.error_text

        down = kernel.run("%cluster down", timeout=120)
        assert down.status == "ok", down.error_text
        assert cluster.ours() == []
    finally:
        kernel.shutdown()


@pytest.mark.slow
def test_the_kubernetes_notebook_runs_against_the_emulated_cluster(cluster, tmp_path, no_leftovers):
    out = tmp_path / "04-out.ipynb"
    papermill.execute_notebook(
        str(ROOT / "notebooks" / "04-kubernetes.ipynb"),
        str(out),
        kernel_name="jupyter_mn",
        parameters={"gpus": 2, "flags": f"--rdma --dask-port {free_port()}"},
        progress_bar=False,
    )
    text = _texts(nbformat.read(out, as_version=4))
    assert "kind: NetworkPolicy" in text and "rdma/rdma_shared_device_a" in text  # the dry run
    assert "gang: creating 2 pod(s) in namespace notebooks" in text
    assert "[node 1 rank 3]" in text and "rank 3 sum 6.0" in text
    assert "(4, 2, 'kubernetes', 'cpu')" in text
    assert cluster.ours() == []
