"""Which gang policy a cluster implies, and the dry run that shows it."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
import yaml

from jupyter_mn.errors import SchedulingError, SpecError
from jupyter_mn.gang.kubernetes.discovery import (
    ServerFacts,
    choose,
    parse_minor,
    parse_version,
    plan,
)
from jupyter_mn.model.kubespec import KubeOptions
from jupyter_mn.model.spec import ClusterSpec
from tests.support.kube.cluster import FakeCluster

VOLCANO = {"scheduling.volcano.sh/v1beta1/podgroups": "PodGroup"}
SCHEDULING = {"scheduling.k8s.io": ("v1", "v1beta1")}


def spec(**options: object) -> ClusterSpec:
    opts = KubeOptions(**{"image": "agent:1", **options})
    return ClusterSpec(nodes=2, gpus=4, backend="kubernetes", kubernetes=opts)


@pytest.mark.parametrize(
    ("facts", "options", "expected"),
    [
        (ServerFacts(37, SCHEDULING), {}, ("none", "")),
        (ServerFacts(37, {"scheduling.volcano.sh": ("v1beta1",)}), {}, ("volcano", "")),
        (ServerFacts(37, {"scheduling.x-k8s.io": ("v1alpha1",)}), {}, ("coscheduling", "")),
        (ServerFacts(37, {"kueue.x-k8s.io": ("v1beta1",)}, ("team-a",)), {}, ("kueue", "team-a")),
        (ServerFacts(37, {"kueue.x-k8s.io": ("v1beta1",)}, ("a", "b")), {}, ("none", "")),
        (ServerFacts(37, {"kueue.x-k8s.io": ("v1beta1",)}), {"queue": "q"}, ("kueue", "q")),
        (ServerFacts(37, SCHEDULING), {"gang": "native"}, ("native", "")),
        (
            ServerFacts(36, {"scheduling.k8s.io": ("v1", "v1alpha2")}),
            {"gang": "native"},
            ("native", ""),
        ),
        (
            ServerFacts(
                37, {"kueue.x-k8s.io": ("v1beta1",), "scheduling.volcano.sh": ("v1beta1",)}
            ),
            {"gang": "volcano"},
            ("volcano", ""),
        ),
    ],
)
def test_policy_follows_what_the_cluster_serves(facts, options, expected):
    assert choose(spec(**options), facts) == expected


@pytest.mark.parametrize(
    ("facts", "options", "error", "message"),
    [
        (
            ServerFacts(37, SCHEDULING),
            {"gang": "volcano"},
            SchedulingError,
            "does not serve scheduling.volcano.sh",
        ),
        (
            ServerFacts(34, {"scheduling.k8s.io": ("v1",)}),
            {"gang": "native"},
            SchedulingError,
            "for Kubernetes 1.34",
        ),
        (
            ServerFacts(37, {"scheduling.k8s.io": ("v1",)}),
            {"gang": "native"},
            SchedulingError,
            "is it installed",
        ),
        (
            ServerFacts(37, {"kueue.x-k8s.io": ("v1beta1",)}, ("a", "b")),
            {"gang": "kueue"},
            SpecError,
            "LocalQueues in this namespace: a, b",
        ),
    ],
)
def test_a_policy_the_cluster_lacks_is_refused(facts, options, error, message):
    with pytest.raises(error, match=message.replace(".", r"\.")):
        choose(spec(**options), facts)


def test_version_strings():
    assert (
        parse_minor("37+") == 37 and parse_version("v1.33.2") == 33 and parse_version("1.28") == 28
    )
    with pytest.raises(SpecError, match=r"expected 1\.MINOR"):
        parse_version("2.1")


@pytest.fixture
def cluster(tmp_path, monkeypatch) -> Iterator[FakeCluster]:
    with FakeCluster(tmp_path, minor=36, crds=VOLCANO) as fake:
        monkeypatch.setenv("KUBECONFIG", str(fake.kubeconfig))
        yield fake


def test_plan_asks_the_cluster_like_a_real_run(cluster):
    target, objects = plan(spec(queue="gpu"), "jmn-plan0001")
    assert (target.minor, target.policy, target.namespace) == (36, "volcano", "notebooks")
    assert [o["kind"] for o in objects] == ["Job", "Service", "Secret", "NetworkPolicy", "PodGroup"]
    assert objects[-1]["spec"]["queue"] == "gpu"
    assert cluster.ours() == []  # a dry run creates nothing


def test_cli_manifests_prints_validated_yaml_without_a_cluster(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "jupyter_mn.cli",
        "manifests",
        "--nodes",
        "4",
        "--gpus",
        "8",
        "--rdma",
        "--gang",
        "coscheduling",
        "--k8s-version",
        "1.30",
        "--image",
        "reg/agent:2",
        "--name",
        "train-1",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env={"PATH": ""}).stdout
    assert out.startswith(
        "# jupyter_mn: 4 node(s) x 8 GPU(s) for Kubernetes 1.30, gang policy coscheduling"
    )
    docs = list(yaml.safe_load_all(out))
    assert [d["kind"] for d in docs] == ["Job", "Service", "Secret", "NetworkPolicy", "PodGroup"]
    assert docs[0]["metadata"]["name"].startswith("train-1-")  # unique per gang
    assert docs[0]["metadata"]["annotations"]["jupyter-mn.io/name"] == "train-1"


def test_cli_manifests_refuses_bad_input_with_a_short_error():
    cmd = [
        sys.executable,
        "-m",
        "jupyter_mn.cli",
        "manifests",
        "--image",
        "a",
        "--toleration",
        "x:Sometimes",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={"PATH": ""})
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "jupyter mn manifests: --toleration 'x:Sometimes': effect must be one of "
        "NoSchedule, PreferNoSchedule, NoExecute"
    )


def kubeconfig(path, port: int) -> str:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "x", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "x", "user": "u"}}],
        "current-context": "c",
    }
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_an_unreachable_cluster_is_a_short_error(tmp_path):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "jupyter_mn.cli", "manifests", "--image", "a:1"]
    env = {"PATH": "", "KUBECONFIG": kubeconfig(tmp_path / "config", port)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "jupyter mn manifests: asking the API server what it offers: "
        "cannot reach the API server ([Errno 111] Connection refused)"
    )


def test_a_hung_api_server_is_an_error_after_the_request_timeout(tmp_path, monkeypatch):
    """A server that accepts connections and never answers: every call has a timeout."""
    from jupyter_mn.gang.kubernetes import discovery, gc

    monkeypatch.setattr(discovery, "REQUEST_TIMEOUT_S", (1.0, 1.0))
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)  # the kernel completes the handshakes; nothing ever reads or answers
        monkeypatch.setenv("KUBECONFIG", kubeconfig(tmp_path / "config", hung.getsockname()[1]))
        outcome: list[BaseException] = []

        def find() -> None:
            try:
                gc.find()
            except SchedulingError as exc:
                outcome.append(exc)

        worker = threading.Thread(target=find, daemon=True)
        worker.start()
        worker.join(120)  # 4 tries of 1 s each, on a loaded machine
    assert not worker.is_alive(), "gc.find hung on an API server that never answers"
    assert "cannot reach the API server" in str(outcome[0]) and "timed out" in str(outcome[0])
