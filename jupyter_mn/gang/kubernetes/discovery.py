"""What the cluster offers (server version, installed gang schedulers) and the policy it implies.

``--gang auto`` picks, in order: Kueue (a queue is given, or the namespace has exactly one
LocalQueue), Volcano, scheduler-plugins coscheduling, else client-side all-or-nothing (``none``).
Native Workload/PodGroup scheduling is alpha/beta and off by default, so it is used only when
asked for (``--gang native``). An explicit policy the cluster lacks is refused before anything is
created.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field
from typing import Any

from ...errors import SchedulingError, SpecError
from ...model.gangids import gang_id as new_gang_id
from ...model.spec import ClusterSpec
from . import gangs
from .gangs import LATEST_MINOR, Target
from .manifests import build, to_yaml
from .rollout import api_errors

KUEUE_GROUP = "kueue.x-k8s.io"
GROUPS = {
    "kueue": KUEUE_GROUP,
    "volcano": gangs.VOLCANO_API.split("/")[0],
    "coscheduling": gangs.COSCHEDULING_API.split("/")[0],
    "native": "scheduling.k8s.io",
}
SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
#: (connect, read) seconds for every API call that sets none itself (watches set their own): an
#: unreachable or hung API server is an error, never a kernel or ``jupyter mn gc`` hanging.
REQUEST_TIMEOUT_S = (10.0, 30.0)


@dataclass(frozen=True)
class ServerFacts:
    """The parts of API discovery that decide how a gang is built."""

    minor: int
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)
    local_queues: tuple[str, ...] = ()
    #: why the LocalQueues could not be listed (RBAC), else ""
    queues_refused: str = ""

    def has(self, policy: str) -> bool:
        if policy == "none":
            return True
        served = self.groups.get(GROUPS[policy], ())
        if policy == "native":
            return self.minor >= gangs.NATIVE_MIN_MINOR and gangs.native_api(self.minor) in served
        return bool(served)


def choose(spec: ClusterSpec, facts: ServerFacts) -> tuple[str, str]:
    """The concrete gang policy and queue for ``spec`` on a cluster with ``facts``."""
    opts = spec.kubernetes
    if opts.gang != "auto":
        if not facts.has(opts.gang):
            raise SchedulingError(
                f"--gang {opts.gang}: this cluster does not serve {GROUPS[opts.gang]}"
                + (f" for Kubernetes 1.{facts.minor}" if opts.gang == "native" else "")
                + " (is it installed?); --gang none needs no scheduler"
            )
        if opts.gang == "kueue":
            return "kueue", opts.queue or _only_queue(facts)
        return opts.gang, opts.queue
    if facts.has("kueue") and (opts.queue or len(facts.local_queues) == 1):
        return "kueue", opts.queue or facts.local_queues[0]
    for policy in ("volcano", "coscheduling"):
        if facts.has(policy):
            return policy, opts.queue
    return "none", opts.queue


def _only_queue(facts: ServerFacts) -> str:
    if len(facts.local_queues) == 1:
        return facts.local_queues[0]
    found = facts.queues_refused or ", ".join(facts.local_queues) or "none"
    raise SpecError(f"--gang kueue needs --queue (LocalQueues in this namespace: {found})")


def parse_minor(minor: str) -> int:
    """``"37"``, ``"37+"`` (GKE, EKS) → 37."""
    match = re.match(r"\d+", minor or "")
    if not match:
        raise SchedulingError(f"cannot read the server's minor version {minor!r}")
    return int(match.group())


def discover(api: Any, namespace: str) -> ServerFacts:
    """Ask the API server (``api``: a ``kubernetes.client.ApiClient``)."""
    from kubernetes import client

    minor = parse_minor(client.VersionApi(api).get_code().minor)
    groups = {
        g.name: tuple(v.version for v in g.versions)
        for g in client.ApisApi(api).get_api_versions().groups
    }
    queues: tuple[str, ...] = ()
    refused = ""
    if KUEUE_GROUP in groups:
        version = groups[KUEUE_GROUP][0]
        try:
            listed = client.CustomObjectsApi(api).list_namespaced_custom_object(
                KUEUE_GROUP, version, namespace, "localqueues"
            )
            queues = tuple(sorted(item["metadata"]["name"] for item in listed.get("items", [])))
        except client.ApiException as exc:  # no list rights on LocalQueues: a queue must be given
            refused = f"cannot list LocalQueues: {exc.status} {exc.reason}"
    return ServerFacts(minor, groups, queues, refused)


def load_api() -> tuple[Any, str]:
    """An ``ApiClient`` from the kubeconfig (or the pod's service account) and its namespace."""
    try:
        from kubernetes import client, config
    except ImportError:
        raise SchedulingError(
            "the kubernetes backend needs the official client: pip install 'jupyter_mn[k8s]'"
        ) from None

    cfg = client.Configuration()
    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)
            with open(SA_NAMESPACE) as f:
                namespace = f.read().strip()
        else:
            # KUBECONFIG as it is now (the client reads it once, at import)
            path = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
            config.load_kube_config(path, client_configuration=cfg)
            _, active = config.list_kube_config_contexts(path)
            namespace = active.get("context", {}).get("namespace") or "default"
    except (config.ConfigException, OSError) as exc:
        raise SchedulingError(
            f"no Kubernetes cluster configured ({exc}); set KUBECONFIG or run in a pod"
        ) from None
    api = client.ApiClient(cfg)
    api.rest_client.request = functools.partial(_timed, api.rest_client.request)
    return api, namespace


def _timed(request: Any, *args: Any, _request_timeout: Any = None, **kw: Any) -> Any:
    """The REST client's ``request`` with ``REQUEST_TIMEOUT_S`` unless the call set a timeout."""
    return request(*args, _request_timeout=_request_timeout or REQUEST_TIMEOUT_S, **kw)


def plan(
    spec: ClusterSpec, gang_id: str | None = None, minor: int | None = None
) -> tuple[Target, list[dict[str, Any]]]:
    """What ``--dry-run`` prints: the objects as provisioning would apply them.

    With ``minor`` (``--k8s-version``) nothing is asked of a cluster: ``--gang auto`` then means
    ``none``. Without it the configured cluster is asked, exactly as a real run does.
    """
    gang_id = gang_id or new_gang_id(spec.name)
    opts = spec.kubernetes
    if minor is not None:
        policy = "none" if opts.gang == "auto" else opts.gang
        target = Target(minor, policy, opts.namespace or "default")
        return target, build(spec, gang_id, target)
    api, namespace = load_api()
    namespace = opts.namespace or namespace
    try:
        with api_errors("asking the API server what it offers"):
            facts = discover(api, namespace)
    finally:
        api.close()
    policy, queue = choose(spec, facts)
    spec = spec.replace(kubernetes=opts.replace(queue=queue))
    target = Target(facts.minor, policy, namespace)
    return target, build(spec, gang_id, target)


def parse_version(text: str) -> int:
    """``--k8s-version 1.33`` (or ``v1.33.2``) → 33."""
    match = re.match(r"^v?1\.(\d+)(\.\d+)?$", text.strip())
    if not match:
        raise SpecError(f"--k8s-version {text!r}: expected 1.MINOR, e.g. 1.{LATEST_MINOR}")
    return int(match.group(1))


def dry_run(spec: ClusterSpec, k8s_version: str | None = None) -> str:
    """The YAML ``--dry-run`` prints, with a header saying what it was built for."""
    target, objects = plan(spec, minor=parse_version(k8s_version) if k8s_version else None)
    header = (
        f"# jupyter_mn: {spec.nodes} node(s) x {spec.gpus} GPU(s) for Kubernetes 1.{target.minor}, "
        f"gang policy {target.policy}, namespace {target.namespace}.\n"
        "# Applied in this order: the Job is created suspended, the other objects get an\n"
        "# ownerReference to it, then the Job is released. Certificates are made per gang.\n"
    )
    return header + to_yaml(objects)
