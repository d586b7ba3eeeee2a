"""The real control plane (tests/support/kube/real.py) and our kubelet against it.

These run where the binaries are built (``tests/support/kube/gobuild/build.sh``); with ``CI=true``
they build them if needed and fail, never skip, when the control plane cannot start.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from jupyter_mn.gang.kubernetes.gangs import Target
from jupyter_mn.gang.kubernetes.manifests import GANG_LABEL, MANAGED_BY, MANAGER, build
from jupyter_mn.kernel.kubespec import KubeOptions
from jupyter_mn.kernel.spec import ClusterSpec
from jupyter_mn.node.ports import is_free, listen_port
from tests.support.bigvalue import check_big_push, check_big_value
from tests.support.driverjob import driver_job
from tests.support.kube import kueue, real
from tests.support.kube.node import RDMA_RESOURCE
from tests.support.kube.rest import RestError
from tests.support.polling import wait_until

kubernetes = pytest.importorskip("kubernetes")
from kubernetes import client, config  # noqa: E402

pytestmark = pytest.mark.system

NODES = {"node-a": 2, "node-b": 2}
#: Placeholder TLS files: the Secrets' shape, as provisioning fills them.
_TLS = {name: "-----BEGIN X-----\n-----END X-----\n" for name in ("ca.crt", "tls.crt", "tls.key")}


class Plane(NamedTuple):
    control: real.ControlPlane
    api: client.ApiClient


def _binaries() -> Path:
    found = real.cached()
    if found is not None:
        return found
    if os.environ.get("CI") != "true":
        pytest.skip("no control-plane binaries: tests/support/kube/gobuild/build.sh builds them")
    return real.binaries()


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    """A control plane with Kueue when this machine can run it, and two nodes of 2 GPUs."""
    bins = _binaries()
    root = tmp_path_factory.mktemp("real")
    with_kueue = kueue.missing() is None
    with real.ControlPlane(root, nodes=NODES, with_kueue=with_kueue, bin_dir=bins) as cp:
        api = config.new_client_from_config(str(cp.kubeconfig))
        yield Plane(cp, api)
        api.close()


@pytest.fixture(autouse=True)
def no_refusals(plane: Plane) -> Iterator[None]:
    """Fail a test in which the API server refused one of our kubelet's requests, or after
    which a component or a node no longer runs; do not start one on such a plane."""
    trouble = plane.control.trouble()
    assert not trouble, "an earlier test left the control plane broken:\n" + "\n".join(trouble)
    nodes = list(plane.control.nodes.nodes.values()) if plane.control.nodes else []
    before = sum(len(n.errors) for n in nodes)
    yield
    errors = [e for n in nodes for e in n.errors]
    assert not errors[before:], "the API server refused the kubelet:\n" + "\n".join(errors)
    trouble = plane.control.trouble()
    assert not trouble, "the control plane broke:\n" + "\n".join(trouble)


def eventually(check: Callable[[], Any], timeout: float = 60.0, what: str = "") -> Any:
    """``wait_until`` with the deadline a real control plane's controllers need."""
    return wait_until(check, timeout, what)


def test_the_official_client_lists_namespaces_and_parses_the_version(plane: Plane) -> None:
    names = {n.metadata.name for n in client.CoreV1Api(plane.api).list_namespace().items}
    assert {"default", "kube-system", "kube-node-lease"} <= names
    version = client.VersionApi(plane.api).get_code()
    assert (version.git_version, version.major, version.minor) == (real.KUBERNETES, "1", "37")


def test_our_kubelet_makes_nodes_that_go_ready_untainted(plane: Plane) -> None:
    core = client.CoreV1Api(plane.api)

    def ready() -> bool:
        nodes = {n.metadata.name: n for n in core.list_node().items}
        return set(nodes) == set(NODES) and all(
            any(c.type == "Ready" and c.status == "True" for c in n.status.conditions)
            and not n.spec.taints
            for n in nodes.values()
        )

    eventually(ready, what="both nodes Ready without the not-ready taint")
    allocatable = {n.metadata.name: n.status.allocatable for n in core.list_node().items}
    assert {n: a["nvidia.com/gpu"] for n, a in allocatable.items()} == {
        name: str(count) for name, count in NODES.items()
    }
    assert all(RDMA_RESOURCE in a for a in allocatable.values())
    lease = client.CoordinationV1Api(plane.api).read_namespaced_lease("node-a", "kube-node-lease")
    assert lease.spec.holder_identity == "node-a"


def _pod(name: str, code: str, gpus: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "main",
                    "image": "python:3.11",
                    "command": ["python", "-c", code],
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
    }


def test_a_pod_bound_by_the_real_scheduler_runs_as_a_process(plane: Plane) -> None:
    core = client.CoreV1Api(plane.api)
    core.create_namespaced_pod("default", _pod("hello", "print('hello from a pod')"))
    pod = eventually(
        lambda: (
            (p := core.read_namespaced_pod("hello", "default")).status.phase == "Succeeded" and p
        ),
        what="pod hello Succeeded",
    )
    assert pod.spec.node_name in NODES
    assert pod.status.container_statuses[0].state.terminated.exit_code == 0
    node_dir = plane.control.root / "nodes" / pod.spec.node_name
    assert "hello from a pod" in (node_dir / "hello" / "container.log").read_text()
    core.delete_namespaced_pod("hello", "default")
    eventually(lambda: not _exists(core, "hello"), what="pod hello deleted")


def _exists(core: client.CoreV1Api, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, "default")
    except client.ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def test_a_deleted_pod_hears_sigterm_and_is_gone_after_the_final_delete(plane: Plane) -> None:
    core = client.CoreV1Api(plane.api)
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: (print('sigterm', flush=True), sys.exit(0)))\n"
        "print('up', flush=True)\n"
        "time.sleep(600)\n"
    )
    core.create_namespaced_pod("default", _pod("sleeper", code))
    pod = eventually(
        lambda: (
            (p := core.read_namespaced_pod("sleeper", "default")).status.phase == "Running" and p
        ),
        what="pod sleeper Running",
    )
    log = plane.control.root / "nodes" / pod.spec.node_name / "sleeper" / "container.log"
    eventually(lambda: "up" in log.read_text(), what="the process started")
    core.delete_namespaced_pod("sleeper", "default")
    eventually(lambda: not _exists(core, "sleeper"), timeout=30, what="pod sleeper gone")
    assert "sigterm" in log.read_text()


#: Collection paths of the kinds the backend creates (namespace filled in).
_PATHS = {
    "Job": "/apis/batch/v1/namespaces/{ns}/jobs",
    "Service": "/api/v1/namespaces/{ns}/services",
    "Secret": "/api/v1/namespaces/{ns}/secrets",
    "NetworkPolicy": "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
    "Pod": "/api/v1/namespaces/{ns}/pods",
    "Workload": "/apis/scheduling.k8s.io/v1beta1/namespaces/{ns}/workloads",
    "PodGroup": "/apis/scheduling.k8s.io/v1beta1/namespaces/{ns}/podgroups",
}


def _dry_run(plane: Plane, obj: dict[str, Any]) -> str | None:
    """Create ``obj`` with ``dryRun=All`` (validation and admission, webhooks included,
    nothing stored) and strict field validation (an unknown or misspelt field is an error,
    not a warning, as ``kubectl apply`` has it); the refusal's message, or None."""
    collection = _PATHS[obj["kind"]].format(ns=obj["metadata"]["namespace"])
    path = f"{collection}?dryRun=All&fieldValidation=Strict"
    try:
        plane.control.rest.create(path, obj)
    except RestError as exc:
        return str(exc)
    return None


def _as_pod(job: dict[str, Any]) -> dict[str, Any]:
    """The pod the Job controller would make of index 0 (its template, as a Pod)."""
    template = job["spec"]["template"]
    meta = {**template.get("metadata", {}), "name": job["metadata"]["name"] + "-0-x"}
    meta["namespace"] = job["metadata"]["namespace"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}


@pytest.mark.parametrize("policy", ["none", "native", "kueue"])
def test_the_backends_objects_pass_validation_and_admission(plane: Plane, policy: str) -> None:
    if policy == "kueue" and not plane.control.with_kueue:
        pytest.skip(kueue.missing() or "")
    spec = ClusterSpec(
        nodes=2,
        gpus=2,
        backend="kubernetes",
        env=(("SECRET_TOKEN", "x"),),
        kubernetes=KubeOptions(image="agent:1", queue=kueue.LOCAL_QUEUE),
    )
    objects = build(spec, "jmn-5f3a9c2e", Target(37, policy, "default"), tls=_TLS)
    job = next(o for o in objects if o["kind"] == "Job")
    refused = {o["kind"]: _dry_run(plane, o) for o in [*objects, _as_pod(job)]}
    assert {k: v for k, v in refused.items() if v} == {}


def test_the_gangs_pods_are_admitted_where_pod_security_is_restricted(plane: Plane) -> None:
    namespace = {
        "metadata": {
            "name": "restricted",
            "labels": {"pod-security.kubernetes.io/enforce": "restricted"},
        }
    }
    plane.control.rest.create("/api/v1/namespaces", namespace)
    spec = ClusterSpec(nodes=2, gpus=2, backend="kubernetes", kubernetes=KubeOptions(image="a:1"))
    job = build(spec, "jmn-5f3a9c2e", Target(37, "none", "restricted"))[0]
    assert _dry_run(plane, _as_pod(job)) is None


def test_a_detached_runs_driver_is_admitted_where_pod_security_is_restricted(
    plane: Plane, tmp_path: Path
) -> None:
    labels = {"pod-security.kubernetes.io/enforce": "restricted"}
    namespace = {"metadata": {"name": "restricted-runs", "labels": labels}}
    plane.control.rest.create("/api/v1/namespaces", namespace)
    job = driver_job(tmp_path, "restricted-runs")
    assert _dry_run(plane, job) is None
    assert _dry_run(plane, _as_pod(job)) is None


def test_kueue_admits_a_queued_job_that_then_runs_on_our_nodes(plane: Plane) -> None:
    if not plane.control.with_kueue:
        pytest.skip(kueue.missing() or "")
    pod = _pod("unused", "print('admitted')")
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "queued", "labels": {"kueue.x-k8s.io/queue-name": "user-queue"}},
        "spec": {
            "completions": 2,
            "parallelism": 2,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "template": {"spec": pod["spec"]},
        },
    }
    batch = client.BatchV1Api(plane.api)
    created = batch.create_namespaced_job("default", job)
    assert created.spec.suspend, "Kueue's webhook suspends a queued Job"
    done = eventually(
        lambda: (j := batch.read_namespaced_job("queued", "default")).status.succeeded == 2 and j,
        what="Job queued admitted and both pods Succeeded",
    )
    assert not done.spec.suspend
    workloads = client.CustomObjectsApi(plane.api).list_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta2", "default", "workloads"
    )["items"]
    assert [w["status"]["admission"]["clusterQueue"] for w in workloads] == [kueue.CLUSTER_QUEUE]
    batch.delete_namespaced_job("queued", "default", propagation_policy="Foreground")


@pytest.mark.parametrize("policy", ["none", "native", "kueue"])
def test_the_backend_brings_a_gang_up_on_the_real_control_plane(
    plane: Plane, policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Provisioning up to "every pod Ready", as a cell does it: discovery, the objects, the
    real Job controller, scheduler (and Kueue), our kubelet running the agents; then release."""
    if policy == "kueue" and not plane.control.with_kueue:
        pytest.skip(kueue.missing() or "")
    from distributed.security import Security

    from jupyter_mn.gang.kubernetes.provision import KubernetesProvisioner

    monkeypatch.setenv("KUBECONFIG", str(plane.control.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    spec = ClusterSpec(
        nodes=2,
        gpus=2,
        backend="kubernetes",
        kubernetes=KubeOptions(image="agent:1", gang=policy, schedule_timeout=90),
    )
    provisioner = KubernetesProvisioner()
    try:
        _, _, pods = provisioner.bring_up(spec, f"jmn-real{policy}", Security.temporary())
        assert sorted(pods) == [0, 1]
        assert {p["spec"]["nodeName"] for p in pods.values()} == set(NODES)
    finally:
        provisioner.release()
    core = client.CoreV1Api(plane.api)
    left = core.list_namespaced_pod(
        "default", label_selector=f"jupyter-mn.io/gang=jmn-real{policy}"
    )
    assert not left.items


@pytest.mark.parametrize("policy", ["native", "kueue"])
def test_a_gang_larger_than_the_cluster_waits_whole_with_the_schedulers_reason(
    plane: Plane, policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3 pods of 2 GPUs on 2 nodes of 2 (Kueue: 6 GPUs against a quota of 4): not one pod is
    bound while it waits, the reason is the real scheduler's (Kueue's), and the timeout
    leaves no object."""
    if policy == "kueue" and not plane.control.with_kueue:
        pytest.skip(kueue.missing() or "")
    from distributed.security import Security

    from jupyter_mn.errors import SchedulingError
    from jupyter_mn.gang.kubernetes.provision import KubernetesProvisioner

    monkeypatch.setenv("KUBECONFIG", str(plane.control.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    core = client.CoreV1Api(plane.api)
    gang = f"jmn-toobig{policy}"
    bound: set[str] = set()
    watching = threading.Event()

    def watch() -> None:
        while not watching.is_set():
            pods = core.list_namespaced_pod("default", label_selector=f"{GANG_LABEL}={gang}")
            bound.update(p.metadata.name for p in pods.items if p.spec.node_name)
            time.sleep(0.1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    provisioner = KubernetesProvisioner()
    events: list[Any] = []
    provisioner.notify = events.append
    spec = ClusterSpec(
        nodes=3,
        gpus=2,
        backend="kubernetes",
        kubernetes=KubeOptions(image="agent:1", gang=policy, schedule_timeout=8),
    )
    try:
        with pytest.raises(SchedulingError, match="not all 3 pods were ready within 8 s"):
            provisioner.bring_up(spec, gang, Security.temporary())
    finally:
        provisioner.release()
        watching.set()
        watcher.join()
    assert not bound
    reasons = " ".join(f"{e.reason} {e.message}" for e in events)
    expected = {"native": "minCount (3) cannot be satisfied", "kueue": "insufficient quota"}
    assert expected[policy] in reasons
    assert not core.list_namespaced_pod("default", label_selector=f"{GANG_LABEL}={gang}").items


def test_a_stopped_kubelet_loses_its_node_until_it_comes_back(plane: Plane) -> None:
    """The Lease is the heartbeat: a node whose kubelet stops is Ready=Unknown and tainted
    unreachable after the controller-manager's grace period; restarted, it finds its Node and
    is Ready and untainted again."""
    assert plane.control.nodes is not None
    core = client.CoreV1Api(plane.api)

    def state() -> tuple[str, set[str]]:
        node = core.read_node("node-b")
        ready = next(c.status for c in node.status.conditions if c.type == "Ready")
        return ready, {t.key for t in node.spec.taints or []}

    plane.control.nodes.stop("node-b")
    try:
        eventually(
            lambda: state() == ("Unknown", {"node.kubernetes.io/unreachable"}),
            timeout=real.NODE_GRACE_S + 30,
            what="node-b Unknown and tainted unreachable",
        )
    finally:
        plane.control.nodes.start("node-b")
    eventually(lambda: state() == ("True", set()), what="node-b Ready and untainted again")


def test_a_node_marked_unknown_while_its_kubelet_runs_is_ready_again(plane: Plane) -> None:
    """What the node lifecycle controller writes when it saw a Lease go stale (an API server
    restart longer than its grace period, on a loaded machine): Ready ``Unknown``, then the
    unreachable taint. Only the kubelet marks the node Ready again, or every later gang waits
    for a node that never comes back."""
    core = client.CoreV1Api(plane.api)
    moment = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    unknown = {
        "type": "Ready",
        "status": "Unknown",
        "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.",
        "lastHeartbeatTime": moment,
        "lastTransitionTime": moment,
    }
    core.patch_node_status("node-b", {"status": {"conditions": [unknown]}})

    def ready() -> bool:
        node = core.read_node("node-b")
        ok = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
        return ok and not node.spec.taints

    eventually(ready, what="node-b Ready and untainted again")


def test_a_node_whose_kubelet_ends_by_itself_is_named_until_it_is_back(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kubelet loop that meets an error it does not retry ends the node (its Lease goes
    stale, nothing runs there): ``trouble`` names it, which the next test would fail on at
    once rather than wait out its timeout on a cluster short of a node."""
    assert plane.control.nodes is not None

    async def broken() -> None:
        raise RuntimeError("the kubelet's loop broke")

    monkeypatch.setattr(plane.control.nodes.nodes["node-b"], "_sync", broken)
    found = eventually(plane.control.trouble, what="the ended kubelet named")
    assert found == ['node node-b: RuntimeError("the kubelet\'s loop broke")']
    monkeypatch.undo()
    plane.control.nodes.start("node-b")
    assert plane.control.trouble() == []
    core = client.CoreV1Api(plane.api)
    eventually(lambda: not core.read_node("node-b").spec.taints, what="node-b untainted again")


@pytest.mark.slow  # the API server's own restart takes ~15 s on 2 cores
def test_after_an_api_server_restart_everything_reconnects_and_a_gang_comes_up(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every client's watches break (the kubelets', the controllers', the scheduler's,
    Kueue's); the gang that follows comes up as before."""
    from distributed.security import Security

    from jupyter_mn.gang.kubernetes.provision import KubernetesProvisioner

    plane.control.restart("kube-apiserver")
    monkeypatch.setenv("KUBECONFIG", str(plane.control.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    policy = "kueue" if plane.control.with_kueue else "native"
    spec = ClusterSpec(
        nodes=2,
        gpus=2,
        backend="kubernetes",
        kubernetes=KubeOptions(image="agent:1", gang=policy, schedule_timeout=90),
    )
    provisioner = KubernetesProvisioner()
    try:
        _, _, pods = provisioner.bring_up(spec, "jmn-restarted", Security.temporary())
        assert sorted(pods) == [0, 1]
    finally:
        provisioner.release()


#: The Role docs/backends.md lists ("Permissions"), rule by rule.
DOCUMENTED_ROLE = [
    {
        "apiGroups": ["batch"],
        "resources": ["jobs"],
        "verbs": ["create", "get", "list", "patch", "delete"],
    },
    {
        "apiGroups": [""],
        "resources": ["services", "secrets"],
        "verbs": ["create", "list", "delete"],
    },
    {
        "apiGroups": ["networking.k8s.io"],
        "resources": ["networkpolicies"],
        "verbs": ["create", "list", "delete"],
    },
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods/portforward"], "verbs": ["create"]},
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["create", "get", "patch", "delete"],
    },
    {
        "apiGroups": ["scheduling.k8s.io"],
        "resources": ["podgroups", "workloads"],
        "verbs": ["create", "get", "delete"],
    },
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["localqueues", "workloads"], "verbs": ["list"]},
]


def _service_account_kubeconfig(plane: Plane, name: str, rules: list[dict[str, Any]] | str) -> Path:
    """A ServiceAccount bound in ``default`` to a Role of ``rules``, or to the ClusterRole
    ``rules`` names (``view``); a kubeconfig whose only credential is its token (as a
    notebook's pod has)."""
    rest, base = plane.control.rest, "/apis/rbac.authorization.k8s.io/v1/namespaces/default"
    rest.create("/api/v1/namespaces/default/serviceaccounts", {"metadata": {"name": name}})
    role = {"kind": "ClusterRole", "name": rules} if isinstance(rules, str) else None
    if role is None:
        rest.create(f"{base}/roles", {"metadata": {"name": name}, "rules": rules})
        role = {"kind": "Role", "name": name}
    binding = {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", **role},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "default"}],
    }
    rest.create(f"{base}/rolebindings", binding)
    token = rest.create(
        f"/api/v1/namespaces/default/serviceaccounts/{name}/token",
        {"spec": {"expirationSeconds": 3600}},
    )["status"]["token"]
    path = plane.control.root / f"{name}.kubeconfig"
    return real.kubeconfig(path, plane.control.server, plane.control.ca, token)


@pytest.mark.filterwarnings("error")  # release warns when it could not delete
def test_the_documented_role_is_enough_for_every_policy(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    from distributed.security import Security

    from jupyter_mn.gang.kubernetes.provision import KubernetesProvisioner

    config_path = _service_account_kubeconfig(plane, "notebook", DOCUMENTED_ROLE)
    monkeypatch.setenv("KUBECONFIG", str(config_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    policies = ["none", "native"] + (["kueue"] if plane.control.with_kueue else [])
    for policy in policies:
        spec = ClusterSpec(
            nodes=2,
            gpus=2,
            backend="kubernetes",
            kubernetes=KubeOptions(image="agent:1", gang=policy, schedule_timeout=60),
        )
        provisioner = KubernetesProvisioner()
        try:
            _, _, pods = provisioner.bring_up(spec, f"jmn-rbac{policy}", Security.temporary())
            assert sorted(pods) == [0, 1], policy
        finally:
            provisioner.release()
        eventually(lambda p=policy: _left(plane, f"jmn-rbac{p}") == [], what=f"{policy} gone")


@pytest.mark.parametrize(
    ("rule", "verb", "policy", "error"),
    [
        (0, "patch", "native", 'cannot patch resource "jobs"'),
        (1, "create", "native", 'cannot create resource "services"'),
        (3, "watch", "native", 'cannot watch resource "pods"'),
        (5, "create", "none", 'cannot create resource "leases"'),
        (6, "create", "native", 'cannot create resource "workloads"'),
        (7, "list", "kueue", "cannot list LocalQueues: 403"),
    ],
)
def test_a_missing_rule_is_named_and_nothing_is_left(
    plane: Plane, monkeypatch: pytest.MonkeyPatch, rule: int, verb: str, policy: str, error: str
) -> None:
    """The documented Role less one verb: the cell's error names what is missing (no wait
    for the schedule timeout), and no object of the gang remains."""
    if policy == "kueue" and not plane.control.with_kueue:
        pytest.skip(kueue.missing() or "")
    from distributed.security import Security

    from jupyter_mn.errors import JupyterMNError
    from jupyter_mn.gang.kubernetes.provision import KubernetesProvisioner

    rules = [
        {**r, "verbs": [v for v in r["verbs"] if (i, v) != (rule, verb)]}
        for i, r in enumerate(DOCUMENTED_ROLE)
    ]
    rules = [r for r in rules if r["verbs"]]  # a rule left with no verb is invalid
    name = f"less-{rule}-{verb}"
    monkeypatch.setenv("KUBECONFIG", str(_service_account_kubeconfig(plane, name, rules)))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    spec = ClusterSpec(
        nodes=2,
        gpus=2,
        backend="kubernetes",
        kubernetes=KubeOptions(image="agent:1", gang=policy, schedule_timeout=60),
    )
    provisioner = KubernetesProvisioner()
    start = time.monotonic()
    try:
        with pytest.raises(JupyterMNError, match=re.escape(error)):
            provisioner.bring_up(spec, f"jmn-{name}", Security.temporary())
    finally:
        provisioner.release()
    assert time.monotonic() - start < 30
    eventually(lambda: _left(plane, f"jmn-{name}") == [], what="the gang's objects gone")


#: Where the objects of a gang can be (every kind the backend creates).
_LEFT = [
    "/apis/batch/v1/namespaces/default/jobs",
    "/api/v1/namespaces/default/pods",
    "/api/v1/namespaces/default/services",
    "/api/v1/namespaces/default/secrets",
    "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies",
    "/apis/coordination.k8s.io/v1/namespaces/default/leases",
    "/apis/scheduling.k8s.io/v1beta1/namespaces/default/workloads",
    "/apis/scheduling.k8s.io/v1beta1/namespaces/default/podgroups",
]


def _left(plane: Plane, gang: str = "") -> list[str]:
    """The objects of ``gang`` (default: of any gang) that still exist, as the admin sees them."""
    selector = f"{GANG_LABEL}%3D{gang}" if gang else f"{MANAGED_BY}%3D{MANAGER}"
    found = []
    for path in _LEFT:
        items = plane.control.rest.get(f"{path}?labelSelector={selector}")["items"]
        found += [f"{path.rsplit('/', 1)[1]}/{i['metadata']['name']}" for i in items]
    return found


def test_env_values_reach_the_agents_from_the_secret_that_the_garbage_collector_removes(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--env`` values travel in a Secret (the node reads it with its own credentials, as the
    Node authorizer allows for its pods); deleting the Job alone lets the real garbage collector
    remove its dependents: pods, Service, Secrets, NetworkPolicy."""
    from distributed.security import Security

    from jupyter_mn.gang.kubernetes.provision import KubernetesProvisioner

    monkeypatch.setenv("KUBECONFIG", str(plane.control.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    spec = ClusterSpec(
        nodes=2,
        gpus=2,
        backend="kubernetes",
        env=(("JMN_TEST_VALUE", "from-the-secret"),),
        kubernetes=KubeOptions(image="agent:1", gang="native", schedule_timeout=60),
    )
    gang = "jmn-envgc"
    provisioner = KubernetesProvisioner()
    try:
        _, _, pods = provisioner.bring_up(spec, gang, Security.temporary())
        assert plane.control.nodes is not None
        for pod in pods.values():
            kubelet = plane.control.nodes.nodes[pod["spec"]["nodeName"]].kubelet
            pid = kubelet.procs[pod["metadata"]["name"]].pid
            assert b"JMN_TEST_VALUE=from-the-secret" in Path(f"/proc/{pid}/environ").read_bytes()
        client.BatchV1Api(plane.api).delete_namespaced_job(
            gang, "default", propagation_policy="Background"
        )
        eventually(lambda: _left(plane, gang) == [], what="the Job's dependents collected")
    finally:
        provisioner.release()


def test_port_forward_goes_through_the_api_server_to_our_kubelet_and_the_pod(
    plane: Plane,
) -> None:
    """The client's port-forward (WebSocket to the API server, which proxies it to the pod's
    node with its kubelet-client certificate) reaches a server in the pod."""
    from kubernetes.stream import portforward

    core = client.CoreV1Api(plane.api)
    code = (
        "import socketserver\n"
        "class Echo(socketserver.BaseRequestHandler):\n"
        "    def handle(self):\n"
        "        self.request.sendall(b'echo:' + self.request.recv(100))\n"
        "socketserver.TCPServer(('0.0.0.0', 18765), Echo).serve_forever()\n"
    )
    core.create_namespaced_pod("default", _pod("echo", code))
    try:
        eventually(
            lambda: core.read_namespaced_pod("echo", "default").status.phase == "Running",
            what="pod echo Running",
        )

        def answer() -> bytes:
            forward = portforward(
                core.connect_get_namespaced_pod_portforward, "echo", "default", ports="18765"
            )
            sock = forward.socket(18765)
            try:
                sock.sendall(b"ping")
                return sock.recv(100)
            except OSError:
                return b""
            finally:
                sock.close()

        assert eventually(answer, what="an answer through the forward") == b"echo:ping"
    finally:
        core.delete_namespaced_pod("echo", "default")


def _dask_port() -> int:
    """A free port whose successor is free too (pod 0's readiness port): the pods' processes
    share this machine's ports."""
    while True:
        port = listen_port("127.0.0.1")
        if is_free("127.0.0.1", port + 1):
            return port


CELL = """
import os
t = torch.tensor([float(dist.get_rank())])
dist.all_reduce(t)
(t.item(), dist.get_rank(), dist.get_world_size(), os.environ["JUPYTER_MN_BACKEND"])
"""


@pytest.mark.slow  # 12-17 s each on 2 cores: four ranks start torch
@pytest.mark.parametrize("policy", ["none", "native", "kueue"])
def test_a_cell_on_two_nodes_of_two_ranks_returns_rank_0s_value(
    plane: Plane, policy: str, monkeypatch: pytest.MonkeyPatch, no_leftovers: float
) -> None:
    """The whole path: the gang comes up, the kernel reaches pod 0's scheduler through a
    port-forward (API server → our kubelet → pod), the four ranks all-reduce, and closing the
    cluster leaves no object."""
    if policy == "kueue" and not plane.control.with_kueue:
        pytest.skip(kueue.missing() or "")
    from jupyter_mn import Cluster

    monkeypatch.setenv("KUBECONFIG", str(plane.control.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    options = KubeOptions(image="agent:1", gang=policy, dask_port=_dask_port())
    spec = ClusterSpec(nodes=2, gpus=2, backend="kubernetes", kubernetes=options)
    with Cluster(spec) as cluster:
        value = cluster.run(CELL).unwrap()
        check_big_value(cluster, mib=16)
        check_big_push(cluster, mib=16)
    assert value == (6.0, 0, 4, "kubernetes")
    eventually(lambda: _left(plane) == [], what="the gang's objects gone")
