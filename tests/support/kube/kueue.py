"""Kueue v0.17 out of cluster: its CRDs, its webhooks on loopback, and one queue to submit to.

What a cluster's install does with cert-manager or Kueue's internal certificates and a Service
in front of the webhook server, done as kwok and envtest do it (kueue#12008 for the order):
the webhook server's certificate comes from the test CA, the webhook configurations
(``config/components/webhook/manifests.yaml`` with the kustomize name prefix and namespace
selectors of Kueue's own install) point at ``https://127.0.0.1:<port><path>`` with that CA, and
Kueue's readiness (which waits for its webhook server) is awaited before anything is created.

Kueue reads its metrics certificate from a fixed path, /etc/kueue/metrics/certs; it runs in a
mount namespace of its own with an overlay on /etc whose upper layer is in DIR, so the files
are there for it and nowhere else (two control planes do not share them; root is needed).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from pathlib import Path
from typing import Any

import yaml

from tests.support.kube.pki import Authority
from tests.support.kube.rest import Rest

MODULE = "sigs.k8s.io/kueue@{version}"
API = "/apis/kueue.x-k8s.io/v1beta2"
#: The queue Kueue's examples name; the backend's default.
LOCAL_QUEUE = "user-queue"
CLUSTER_QUEUE = "cluster-queue"
FLAVOR = "default-flavor"
#: PriorityClasses a test's workloads name (``--priority-class``); Kueue takes a Workload's
#: priority from its pods' class, and preempts within the ClusterQueue by it.
PRIORITIES = {"low": 100, "high": 1000}
#: Kueue's install keeps its pod, deployment and statefulset webhooks off its own namespaces.
_SYSTEM_NAMESPACES = {
    "matchExpressions": [
        {
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": ["kube-system", "kueue-system"],
        }
    ]
}
_SELECTED = {
    f"{kind}{what}.kb.io" for kind in "mv" for what in ("pod", "deployment", "statefulset")
}


def missing() -> str | None:
    """Why Kueue cannot run here (None: it can)."""
    if os.geteuid() != 0:
        return "Kueue's fixed metrics-certificate path needs a mount namespace (root)"
    if shutil.which("unshare") is None:
        return "Kueue needs unshare (util-linux) for its mount namespace"
    return None


def source(version: str) -> Path:
    """Kueue's module in the Go module cache (the build downloaded it): CRDs and webhooks."""
    gomodcache = os.environ.get("GOMODCACHE") or os.path.expanduser("~/go/pkg/mod")
    return Path(gomodcache) / MODULE.format(version=version)


def webhooks(src: Path, port: int, ca: Path) -> list[dict[str, Any]]:
    """Kueue's two webhook configurations, pointed at its server on loopback."""
    bundle = base64.b64encode(ca.read_bytes()).decode()
    configs = list(
        yaml.safe_load_all((src / "config/components/webhook/manifests.yaml").read_text())
    )
    for config in configs:
        config["metadata"]["name"] = "kueue-" + config["metadata"]["name"]
        for hook in config["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}
            if hook["name"] in _SELECTED:
                hook["namespaceSelector"] = _SYSTEM_NAMESPACES
    return configs


def configuration(root: Path, webhook: int, health: int) -> dict[str, Any]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": "kueue-system",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        "metrics": {"bindAddress": "0"},  # off; its certificate is still read at start
        "webhook": {"host": "127.0.0.1", "port": webhook, "certDir": str(root / "webhook")},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "integrations": {"frameworks": ["batch/job", "pod"]},
    }


def queues(gpus: int) -> list[tuple[str, dict[str, Any]]]:
    """One ResourceFlavor, one ClusterQueue for every namespace with ``gpus`` GPUs of quota (a
    workload of higher priority preempts a lower one in it), and the LocalQueue ``user-queue``
    in ``default``: (collection path, object)."""
    quota = {"cpu": "1000", "memory": "4Ti", "nvidia.com/gpu": str(gpus)}
    cluster_queue = {
        "namespaceSelector": {},
        "preemption": {"withinClusterQueue": "LowerPriority"},
        "resourceGroups": [
            {
                "coveredResources": list(quota),
                "flavors": [
                    {
                        "name": FLAVOR,
                        "resources": [{"name": k, "nominalQuota": v} for k, v in quota.items()],
                    }
                ],
            }
        ],
    }
    return [
        (f"{API}/resourceflavors", {"kind": "ResourceFlavor", "metadata": {"name": FLAVOR}}),
        (
            f"{API}/clusterqueues",
            {"kind": "ClusterQueue", "metadata": {"name": CLUSTER_QUEUE}, "spec": cluster_queue},
        ),
        (
            f"{API}/namespaces/default/localqueues",
            {
                "kind": "LocalQueue",
                "metadata": {"name": LOCAL_QUEUE, "namespace": "default"},
                "spec": {"clusterQueue": CLUSTER_QUEUE},
            },
        ),
    ]


class Kueue:
    """Installs and starts Kueue against a running API server (``rest`` is the admin)."""

    def __init__(self, root: Path, version: str, rest: Rest, pki: Authority) -> None:
        self.root, self.rest, self.pki = root, rest, pki
        self.src = source(version)

    def install(self, webhook_port: int) -> None:
        """CRDs (awaited until Established) and the webhook configurations."""
        names = []
        for crd in sorted((self.src / "config/components/crd/bases").glob("*.yaml")):
            obj = yaml.safe_load(crd.read_text())
            self.rest.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", obj)
            names.append(obj["metadata"]["name"])
        for name in names:
            self.rest.wait(
                f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}",
                _established,
                60,
                f"CRD {name} Established",
            )
        self.rest.create("/api/v1/namespaces", {"metadata": {"name": "kueue-system"}})
        for config in webhooks(self.src, webhook_port, self.pki.cert):
            plural = config["kind"].lower() + "s"
            self.rest.create(f"/apis/admissionregistration.k8s.io/v1/{plural}", config)

    def argv(self, binary: Path, kubeconfig: Path, webhook: int, health: int) -> list[str]:
        """The command: Kueue in a mount namespace with its metrics certificate under /etc."""
        serving = self.pki.serving("kueue-webhook", ["127.0.0.1", "localhost"])
        certs = self.root / "etc-upper" / "kueue" / "metrics" / "certs"
        for folder in (certs, self.root / "webhook", self.root / "etc-work"):
            folder.mkdir(parents=True, exist_ok=True)
        for where in (certs, self.root / "webhook"):
            shutil.copy(serving.cert, where / "tls.crt")
            shutil.copy(serving.key, where / "tls.key")
        config = self.root / "config.yaml"
        config.write_text(json.dumps(configuration(self.root, webhook, health)))
        overlay = (
            f"lowerdir=/etc,upperdir={self.root / 'etc-upper'},workdir={self.root / 'etc-work'}"
        )
        return [
            "unshare",
            "--mount",
            "--propagation=private",
            "sh",
            "-c",
            f'mount -t overlay overlay -o "{overlay}" /etc && exec "$0" "$@"',
            str(binary),
            f"--config={config}",
            f"--kubeconfig={kubeconfig}",
            "--feature-gates=VisibilityOnDemand=false",  # an aggregated API: no Service here
        ]

    def create_queues(self, gpus: int) -> None:
        """The PriorityClasses, and the queue objects through Kueue's webhooks (which proves
        they answer)."""
        for name, value in PRIORITIES.items():
            self.rest.create(
                "/apis/scheduling.k8s.io/v1/priorityclasses",
                {"apiVersion": "scheduling.k8s.io/v1", "metadata": {"name": name}, "value": value},
            )
        for path, obj in queues(gpus):
            self.rest.create(path, {"apiVersion": "kueue.x-k8s.io/v1beta2", **obj})
        self.rest.wait(
            f"{API}/clusterqueues/{CLUSTER_QUEUE}",
            lambda cq: _condition(cq, "Active"),
            60,
            "ClusterQueue Active",
        )


def _condition(obj: dict[str, Any], kind: str) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c["type"] == kind and c["status"] == "True" for c in conditions)


def _established(crd: dict[str, Any]) -> bool:
    return _condition(crd, "Established")
