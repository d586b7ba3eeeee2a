"""Simulated nodes (tests/support/kube/simnodes.py) on the real control plane: what
``bench/k8s_gang.py`` scales to 256 nodes, proven on two.

The real scheduler binds the backend's gang to nodes that run nothing; they report the pods
Running and Ready, renew their Leases, and give deleted pods their final delete, so the
backend's bring-up and release work as on process nodes; the API server's audit log names the
requests of one user, which is how the bench counts the backend's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_mn.model.kubespec import KubeOptions
from jupyter_mn.model.spec import ClusterSpec
from tests.backends.test_kube_real import _binaries, eventually
from tests.support.kube import real

pytestmark = pytest.mark.system

pytest.importorskip("kubernetes")

USER = "jupyter-mn-simtest"
SIMULATED = {"sim-0": 8, "sim-1": 8}


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[real.ControlPlane]:
    root = tmp_path_factory.mktemp("sim")
    with real.ControlPlane(
        root,
        nodes={},
        simulated=SIMULATED,
        with_kueue=False,
        audit_users=(USER,),
        bin_dir=_binaries(),
    ) as cp:
        yield cp


def test_the_backends_gang_comes_up_on_simulated_nodes_and_goes(
    plane: real.ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    from distributed.security import Security

    from jupyter_mn.gang.kubernetes.provision import KubernetesProvisioner

    pair = plane.pki.client("simtest", USER, "system:masters")
    config = real.kubeconfig(plane.root / "simtest.kubeconfig", plane.server, plane.ca, pair)
    monkeypatch.setenv("KUBECONFIG", str(config))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    spec = ClusterSpec(
        nodes=2,
        gpus=8,
        backend="kubernetes",
        kubernetes=KubeOptions(image="agent:1", gang="native", schedule_timeout=90),
    )
    provisioner = KubernetesProvisioner()
    try:
        _, _, pods = provisioner.bring_up(spec, "jmn-simnodes", Security.temporary())
        assert {p["spec"]["nodeName"] for p in pods.values()} == set(SIMULATED)
        assert {p["status"]["phase"] for p in pods.values()} == {"Running"}
    finally:
        provisioner.release()  # waits until the simulated nodes gave the pods their final delete
    assert not plane.rest.get("/api/v1/namespaces/default/pods")["items"]
    audit = _audit(plane.root)
    assert {e["user"]["username"] for e in audit} == {USER}  # no one else's requests
    assert "watch" in {e["verb"] for e in audit} and "create" in {e["verb"] for e in audit}


def test_simulated_nodes_renew_their_leases_and_stay_ready(plane: real.ControlPlane) -> None:
    def renewals() -> dict[str, str]:
        leases = plane.rest.get("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases")
        return {i["metadata"]["name"]: i["spec"]["renewTime"] for i in leases["items"]}

    first = renewals()
    assert set(first) == set(SIMULATED)
    eventually(lambda: all(renewals()[n] != first[n] for n in SIMULATED), 60, "every Lease renewed")
    nodes = plane.rest.get("/api/v1/nodes")["items"]
    assert all(not n["spec"].get("taints") for n in nodes)
    assert [n["status"]["allocatable"]["nvidia.com/gpu"] for n in nodes] == ["8", "8"]
    assert plane.trouble() == []
    assert all(not n.errors for n in plane.nodes.nodes.values())


def _audit(root: Path) -> list[dict]:
    path = root / "logs" / "audit.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
