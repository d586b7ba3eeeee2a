"""Contract tests: the official client against the test API server (kmock, real HTTP).

The control plane here binds pods to nodes by free GPUs and a status-only kubelet marks them
Running and Ready, so these tests cover creation, watching, pending reasons, teardown and the
admission Lease without running the pods' processes (tests/e2e/test_kubernetes.py does that).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from distributed.security import Security

from jupyter_mn.errors import SchedulingError
from jupyter_mn.gang.base import Gang
from jupyter_mn.gang.kubernetes.manifests import COMPLETION_INDEX, GANG_LABEL, NAME_KEY
from jupyter_mn.gang.kubernetes.provision import KubernetesProvisioner
from jupyter_mn.jobs.gc import collect as reap
from jupyter_mn.jobs.registry import ORPHANED, JobModel, NodeModel, Registry
from jupyter_mn.model.kubespec import KubeOptions
from jupyter_mn.model.spec import ClusterSpec
from jupyter_mn.wire.events import NodesWaiting
from tests.support.kube.cluster import NAMESPACE, FakeCluster

IMAGE = "registry.example/jupyter-mn-agent:1"


def kube_spec(nodes: int = 2, gpus: int = 2, **options: object) -> ClusterSpec:
    opts = KubeOptions(**{"image": IMAGE, **options})
    return ClusterSpec(nodes=nodes, gpus=gpus, backend="kubernetes", kubernetes=opts)


@pytest.fixture
def cluster(tmp_path, monkeypatch, request) -> Iterator[FakeCluster]:
    options = getattr(request, "param", {})
    with FakeCluster(tmp_path, **options) as fake:
        monkeypatch.setenv("KUBECONFIG", str(fake.kubeconfig))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        yield fake


class Recorder:
    """A provisioner plus the events it showed."""

    def __init__(self) -> None:
        self.events: list[NodesWaiting] = []
        self.provisioner = KubernetesProvisioner()
        self.provisioner.notify = self.events.append

    def up(self, spec: ClusterSpec, gang_id: str) -> dict[int, dict]:
        return self.provisioner.bring_up(spec, gang_id, Security.temporary())[2]

    def reasons(self, node: int | None) -> list[str]:
        """Reasons shown for ``node`` (None: the gang as a whole)."""
        return [
            e.reason for e in self.events if (node in e.nodes if node is not None else not e.nodes)
        ]


def test_create_watch_and_delete_everything(cluster):
    rec = Recorder()
    pods = rec.up(kube_spec(), "jmn-test0001")
    assert sorted(pods) == [0, 1]
    assert [p["metadata"]["annotations"][COMPLETION_INDEX] for p in pods.values()] == ["0", "1"]
    objects = {(o["kind"], o["metadata"]["name"]) for o in cluster.ours()}
    assert {
        ("Job", "jmn-test0001"),
        ("Service", "jmn-test0001"),
        ("Secret", "jmn-test0001-tls"),
    } <= objects
    assert ("NetworkPolicy", "jmn-test0001") in objects
    job = next(o for o in cluster.ours() if o["kind"] == "Job")
    assert job["spec"]["suspend"] is False  # released after its dependents existed
    for obj in cluster.ours():
        if obj["kind"] in ("Service", "Secret", "NetworkPolicy"):
            assert obj["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]

    rec.provisioner.release()
    assert cluster.ours() == []
    deletes = [r for r in cluster.requests("delete") if r.resource.plural == "jobs"]
    assert deletes[0].params["propagationPolicy"] == "Foreground"
    assert not cluster.live("leases")  # the admission Lease was given back


@pytest.mark.parametrize("cluster", [{"bad_images": ["registry.example/missing:1"]}], indirect=True)
def test_fatal_image_pull_tears_down_at_once(cluster):
    rec = Recorder()
    started = time.monotonic()
    with pytest.raises(SchedulingError, match="ErrImagePull") as info:
        rec.up(kube_spec(image="registry.example/missing:1"), "jmn-test0003")
    assert time.monotonic() - started < 10  # not the 600 s schedule timeout
    assert "every object of the gang was deleted" in str(info.value)
    assert cluster.ours() == []


def wait_for(condition, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class Notebook(threading.Thread):
    """A notebook bringing a gang up on its own thread."""

    def __init__(self, gang_id: str, spec: ClusterSpec) -> None:
        super().__init__(daemon=True)
        self.gang_id, self.spec, self.rec = gang_id, spec, Recorder()
        self.pods: dict[int, dict] = {}
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            self.pods = self.rec.up(self.spec, self.gang_id)
        except Exception as exc:
            self.error = exc


@pytest.mark.parametrize("cluster", [{"nodes": {}}], indirect=True)
def test_lease_makes_the_second_notebook_wait_and_neither_deadlocks(cluster):
    """Two gangs that each need the whole cluster: one comes up whole, the other waits its turn."""
    spec = kube_spec(schedule_timeout=60)
    first, second = Notebook("jmn-first001", spec), Notebook("jmn-second01", spec)
    first.start()
    wait_for(lambda: "Unschedulable" in first.rec.reasons(0), "the first gang to be pending")
    second.start()
    wait_for(lambda: "queued" in second.rec.reasons(None), "the second gang to queue")
    assert not [o for o in cluster.ours() if "second" in o["metadata"]["name"]]
    cluster.add_node("node-a", 2)
    cluster.add_node("node-b", 2)
    first.join(30)
    assert sorted(first.pods) == [0, 1], first.error
    wait_for(lambda: "Unschedulable" in second.rec.reasons(0), "the second gang to wait for GPUs")
    bound = [p for p in cluster.live("pods") if p["spec"].get("nodeName")]
    assert {p["metadata"]["labels"]["jupyter-mn.io/gang"] for p in bound} == {"jmn-first001"}
    first.rec.provisioner.release()  # the first notebook is done: its GPUs free up
    second.join(30)
    assert sorted(second.pods) == [0, 1], second.error
    second.rec.provisioner.release()
    assert cluster.ours() == []


def test_gc_deletes_the_gangs_of_dead_kernels_only(cluster):
    from jupyter_mn.gang.kubernetes import gc

    alive, dead = Recorder(), Recorder()
    alive.up(kube_spec(nodes=1), "jmn-alive001")
    dead.up(kube_spec(nodes=1), "jmn-dead0001")  # its kernel "dies": no release()
    found = {left.gang: left for left in gc.find()}
    assert set(found) == {"jmn-alive001", "jmn-dead0001"}
    assert ("job", "jmn-dead0001") in found["jmn-dead0001"].objects
    assert "pid" in found["jmn-dead0001"].owner
    assert [left.gang for left in gc.collect(keep={"jmn-alive001"}, dry_run=True)] == [
        "jmn-dead0001"
    ]
    only = gc.collect(only={"jmn-dead0001"}, dry_run=True)
    assert [left.gang for left in only] == ["jmn-dead0001"]
    assert {o["metadata"]["labels"]["jupyter-mn.io/gang"] for o in cluster.ours()} == {
        "jmn-alive001",
        "jmn-dead0001",
    }
    assert [left.gang for left in gc.collect(keep={"jmn-alive001"})] == ["jmn-dead0001"]
    assert {o["metadata"]["labels"]["jupyter-mn.io/gang"] for o in cluster.ours()} == {
        "jmn-alive001"
    }
    alive.provisioner.release()
    assert cluster.ours() == []


def test_an_expired_lease_of_a_dead_kernel_is_taken_over(cluster):
    from kubernetes import client, config

    from jupyter_mn.gang.kubernetes import lease

    api = config.new_client_from_config(str(cluster.kubeconfig))
    stale = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": lease.NAME},
        "spec": {
            "holderIdentity": "jmn-gone (dead kernel)",
            "leaseDurationSeconds": 30,
            "renewTime": "2026-01-01T00:00:00.000000Z",
        },
    }
    client.CoordinationV1Api(api).create_namespaced_lease(NAMESPACE, stale)
    rec = Recorder()
    started = time.monotonic()
    rec.up(kube_spec(nodes=1), "jmn-heir0001")
    assert time.monotonic() - started < 15 and "queued" not in rec.reasons(None)
    rec.provisioner.release()
    assert cluster.live("leases") == []
    api.close()


def orphaned(gang: str, name: str = "gone") -> JobModel:
    """The registry's record of a Kubernetes job whose kernel died."""
    return JobModel(
        id=gang,
        name=name,
        gang=gang,
        backend="kubernetes",
        shape="1×2",
        gpus=2,
        world_size=2,
        state=ORPHANED,
        started=0.0,
        nodes=[NodeModel(node=0)],
    )


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def registry(tmp_path) -> Iterator[Registry]:
    reg = Registry(tmp_path / "registry")
    yield reg
    reg.close()


def test_jupyter_mn_gc_deletes_an_orphaned_kubernetes_job(cluster, registry):
    """The registry's orphaned Kubernetes job is cleaned by label through `jupyter mn gc`."""
    dead = Recorder()
    dead.up(kube_spec(nodes=1), "jmn-gone0001")  # its kernel "dies": no release()
    registry.save(orphaned("jmn-gone0001"))
    dry = reap(registry, keep_s=1e9, dry_run=True)
    assert any("would delete" in line for line in dry) and cluster.ours()
    done = reap(registry, keep_s=1e9)
    assert any("deleted" in line and "jmn-gone0001" in line for line in done)
    assert cluster.ours() == []


def test_two_gangs_of_one_name_both_start_and_gc_of_one_leaves_the_other(cluster, registry):
    """Both notebooks call their gang "train"; one kernel dies and `jupyter mn gc` runs."""
    spec = kube_spec(nodes=1).replace(name="train")
    live, dead = Recorder(), Recorder()
    live_gang, dead_gang = Gang(spec, live.provisioner), Gang(spec, dead.provisioner)
    assert sorted(live.up(spec, live_gang.core.id)) == [0]
    assert sorted(dead.up(spec, dead_gang.core.id)) == [0]  # not 409: the names differ
    jobs = [o for o in cluster.ours() if o["kind"] == "Job"]
    assert [j["metadata"]["annotations"][NAME_KEY] for j in jobs] == ["train", "train"]
    registry.save(orphaned(dead_gang.core.id, name="train"))
    reap(registry, keep_s=1e9)
    left = {o["metadata"]["labels"][GANG_LABEL] for o in cluster.ours()}
    assert left == {live_gang.core.id}
    assert len([p for p in cluster.live("pods") if p["spec"].get("nodeName")]) == 1
    live.provisioner.release()
    assert cluster.ours() == []


def test_the_registry_records_the_namespace_and_gc_deletes_there(cluster, registry):
    """The kubeconfig says "notebooks"; the gang went to "research" (--namespace)."""
    from jupyter_mn import Cluster
    from jupyter_mn.gang import make_gang
    from jupyter_mn.kernel.recorder import JobRecord

    spec = kube_spec(nodes=1, namespace="research")
    gang = make_gang(spec)
    record = JobRecord(registry, Cluster(spec), gang)
    gang.core.hub.subscribe(lambda event: record.handle(event) and record.save())
    gang.core.provisioner.bring_up(
        spec, gang.core.id, Security.temporary()
    )  # its kernel then "dies"
    job = registry.job(record.model.id)
    assert job.namespace == "research"
    assert {o["metadata"]["namespace"] for o in cluster.ours()} == {"research"}
    job.state, job.pid = ORPHANED, dead_pid()
    registry.save(job)
    done = reap(registry, keep_s=1e9)
    assert any(f"{gang.core.id}: deleted" in line and "in research" in line for line in done), done
    assert cluster.ours() == []
    gang.core.provisioner.release()
