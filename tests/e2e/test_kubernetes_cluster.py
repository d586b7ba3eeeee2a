"""The Kubernetes e2e cell against a real cluster (marked ``cluster``; skipped in CI).

Run it with a kubeconfig whose namespace may create Jobs, Services, Secrets, NetworkPolicies,
Leases and pod port-forwards, and an agent image built from docs/agent.Dockerfile:

    KUBECONFIG=~/.kube/config JUPYTER_MN_K8S_IMAGE=registry.example/jupyter-mn-agent:0.1.0 \\
        .venv/bin/python -m pytest -m cluster tests/e2e/test_kubernetes_cluster.py

``JUPYTER_MN_TEST_FLAGS`` adds flags to the cell, e.g. ``--gpu-resource ''`` on a CPU-only
cluster (kind, minikube) or ``--gang kueue --queue team-a``.
"""

from __future__ import annotations

import ast
import os

import pytest

from tests.support.kernels import Kernel

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        not (os.environ.get("KUBECONFIG") and os.environ.get("JUPYTER_MN_K8S_IMAGE")),
        reason="needs a real cluster: set KUBECONFIG and JUPYTER_MN_K8S_IMAGE",
    ),
]


def test_cell_on_a_real_cluster_and_nothing_left():
    from kubernetes import client, config

    from jupyter_mn.gang.kubernetes.manifests import MANAGED_BY, MANAGER

    flags = os.environ.get("JUPYTER_MN_TEST_FLAGS", "")
    kernel = Kernel()
    try:
        reply = kernel.run(
            f"%%cluster --backend kubernetes --nodes 2 --gpus 2 {flags}\n"
            "t = torch.tensor([float(dist.get_rank())], device=cluster_info().device)\n"
            "dist.all_reduce(t)\n(t.item(), dist.get_rank(), dist.get_world_size())",
            timeout=900,
        )
        assert reply.status == "ok", reply.error_text
        assert ast.literal_eval(reply.result) == (6.0, 0, 4)
        assert kernel.run("%cluster down", timeout=300).status == "ok"
    finally:
        kernel.shutdown()
    api = config.new_client_from_config()
    namespace = config.list_kube_config_contexts()[1]["context"].get("namespace", "default")
    left = client.CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector=f"{MANAGED_BY}={MANAGER}"
    )
    assert not left.items, [p.metadata.name for p in left.items]
    jobs = client.BatchV1Api(api).list_namespaced_job(
        namespace, label_selector=f"{MANAGED_BY}={MANAGER}"
    )
    assert not jobs.items
