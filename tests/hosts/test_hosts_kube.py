"""Gangs on emulated Kubernetes pods with pod networking: each pod on a test host of its own
(``hosts.py``), with its own IP on a bridge and the pod's hostname, none of which resolves."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from kubernetes import client, config

from jupyter_mn import Cluster
from jupyter_mn.checkpoint import latest
from jupyter_mn.errors import Preempted
from jupyter_mn.gang.kubernetes.podstate import node_index
from jupyter_mn.model.kubespec import KubeOptions
from jupyter_mn.model.spec import ClusterSpec
from tests.hosts.test_hosts_dask import CHECK
from tests.hosts.test_hosts_slurm import SAVES_WHEN_PREEMPTED
from tests.support.hosts import HostNet
from tests.support.kube.cluster import FakeCluster
from tests.support.polling import wait_until

pytestmark = pytest.mark.system

#: the kubelet adds a host per pod
HOSTS = 0


@pytest.fixture(scope="module")
def pods(
    host_net: HostNet, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[FakeCluster, HostNet]]:
    with pytest.MonkeyPatch.context() as env:
        folder = tmp_path_factory.mktemp("kube-hosts")
        machines = {f"machine-{i}": 1 for i in range(3)}  # one pod per Kubernetes node
        fake = FakeCluster(folder, nodes=machines, processes=True, net=host_net)
        with fake:
            env.setenv("KUBECONFIG", str(fake.kubeconfig))
            env.delenv("KUBERNETES_SERVICE_HOST", raising=False)
            yield fake, host_net


def kube_client(fake: FakeCluster) -> client.CoreV1Api:
    return client.CoreV1Api(config.new_client_from_config(str(fake.kubeconfig)))


@pytest.mark.parametrize("nodes", [2, 3])
def test_a_gang_on_pods_reduces_on_the_pod_network(nodes, pods, no_leftovers):
    fake, net = pods
    options = KubeOptions(image="registry.example/jupyter-mn-agent:1")
    spec = ClusterSpec(nodes=nodes, gpus=1, backend="kubernetes", kubernetes=options)
    with Cluster(spec) as cluster:
        rows = [json.loads(v) for v in cluster.run(CHECK, return_all=True).unwrap()]
        pod_ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in fake.live("pods")}
        hosts = [h for h in net.hosts if h.ip in pod_ips.values()]
        assert len(hosts) == nodes
    assert all(r["sum"] == nodes * (nodes - 1) / 2 for r in rows)
    assert all((r["gloo"], r["nccl"]) == ("eth0", "=eth0") for r in rows)
    assert {r["host"] for r in rows} == {h.hostname for h in hosts}
    (master,) = {r["master"] for r in rows}
    assert master in pod_ips.values()
    assert fake.ours() == []


def test_a_deleted_pod_is_a_preemption_its_loop_saves_in(pods, tmp_path, no_leftovers):
    fake, _ = pods
    ckpt = tmp_path / "ckpt"  # the pods' hosts share this machine's filesystem
    options = KubeOptions(image="registry.example/jupyter-mn-agent:1")
    spec = ClusterSpec(nodes=2, gpus=1, backend="kubernetes", kubernetes=options, grace=20)
    with Cluster(spec) as cluster:
        cell = cluster.submit(SAVES_WHEN_PREEMPTED, namespace={"CKPT": str(ckpt)})
        wait_until(lambda: "looping" in cell.output, 180, "the loop to run")
        (pod,) = (p for p in fake.live("pods") if node_index(p) == 1)
        meta = pod["metadata"]  # kubectl delete pod: SIGTERM, SIGKILL after its grace period
        kube_client(fake).delete_namespaced_pod(meta["name"], meta["namespace"])
        with pytest.raises(Preempted) as preempted:
            cell.result(timeout=60)
        assert (preempted.value.node, preempted.value.cause) == (1, "pod"), preempted.value
        assert preempted.value.checkpoint == str(latest(ckpt)), preempted.value
    assert fake.ours() == []
