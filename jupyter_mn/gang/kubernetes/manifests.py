"""Pure builders: a ``ClusterSpec`` becomes the Kubernetes objects of one gang (plain dicts).

One Indexed ``batch/v1`` Job (one pod per node holding all its GPUs, pod 0 also runs the dask
scheduler), a headless Service (stable DNS before readiness), a TLS Secret for the dask control
plane, a Secret holding the ``--env`` values (the pods read them through ``secretKeyRef``: whoever
may read Jobs or Pods does not see them), a NetworkPolicy that keeps the unencrypted c10d/gloo/NCCL
ports inside the gang, and the objects of the gang-scheduling policy (``gangs.py``). Nothing here
talks to a cluster, so ``jupyter mn manifests`` and ``%%cluster --dry-run`` print exactly what
provisioning applies.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import SpecError
from ...model.gangids import MAX_ID, label_value
from ...model.kubespec import KubeOptions, Volume, parse_toleration
from ...model.spec import ClusterSpec
from ...wire.tlsfiles import TLS_FILES
from . import gangs
from .gangs import Target

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "jupyter-mn"
GANG_LABEL = "jupyter-mn.io/gang"
OWNER_ANNOTATION = "jupyter-mn.io/owner"
#: The user's ``--name``: exact in this annotation, as a valid label value in this label.
NAME_KEY = "jupyter-mn.io/name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
CONTAINER = "agent"
TLS_DIR = "/etc/jupyter-mn/tls"
#: The agent's user and group: ``USER`` in docs/agent.Dockerfile; the pods' volumes are theirs.
AGENT_UID = 1000
#: Finished Jobs (and their pods) are deleted this long after they end.
TTL_AFTER_FINISHED_S = 300
_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class Names:
    """Every name one gang uses, derived from its id (DNS-1035 labels, pod names ≤ 63 chars)."""

    base: str

    @classmethod
    def of(cls, gang_id: str) -> Names:
        """``gang_id`` comes from ``gangids.gang_id``; anything else is a programming error."""
        if len(gang_id) > MAX_ID or not _NAME.match(gang_id):
            raise SpecError(
                f"gang id {gang_id!r}: not a DNS label of at most {MAX_ID} characters "
                "(make ids with jupyter_mn.model.gangids.gang_id)"
            )
        return cls(gang_id)

    @property
    def job(self) -> str:
        return self.base

    @property
    def service(self) -> str:
        return self.base

    @property
    def secret(self) -> str:
        return f"{self.base}-tls"

    @property
    def env_secret(self) -> str:
        return f"{self.base}-env"

    def host(self, node: int) -> str:
        """Pod ``node``'s DNS name inside the namespace (``<job>-<index>.<service>``)."""
        return f"{self.base}-{node}.{self.service}"


def labels(gang_id: str) -> dict[str, str]:
    return {MANAGED_BY: MANAGER, GANG_LABEL: Names.of(gang_id).base}


def selector(gang_id: str) -> str:
    """The label selector that finds every object of this gang."""
    return ",".join(f"{k}={v}" for k, v in labels(gang_id).items())


def build(
    spec: ClusterSpec,
    gang_id: str,
    target: Target,
    *,
    tls: Mapping[str, str] | None = None,
    owner: str = "",
    job_owner: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """All objects of the gang, in apply order: the (suspended) Job first, then its dependents.

    ``tls`` holds the PEM files (``ca.crt``, ``tls.crt``, ``tls.key``); without it (a dry run) the
    Secrets show placeholders: dry runs never print key material or ``--env`` values.
    ``job_owner`` is an ownerReference for the Job (the notebook's own pod, when the kernel runs
    in the same namespace).
    """
    opts = spec.kubernetes
    group = gangs.parts(spec, Names.of(gang_id).base, target, labels(gang_id))
    return [
        _job(spec, gang_id, target, group, owner, job_owner),
        _service(opts, gang_id, target),
        _secret(gang_id, target, tls),
        _network_policy(opts, gang_id, target),
        *group.objects,
        *([_env_secret(spec, gang_id, target, shown=tls is not None)] if spec.env else []),
    ]


def _meta(name: str, gang_id: str, target: Target, **extra: Any) -> dict[str, Any]:
    meta = {"name": name, "namespace": target.namespace, "labels": labels(gang_id)}
    meta.update({k: v for k, v in extra.items() if v})
    return meta


def _job(
    spec: ClusterSpec,
    gang_id: str,
    target: Target,
    group: gangs.GangParts,
    owner: str,
    job_owner: Mapping[str, Any] | None,
) -> dict[str, Any]:
    opts = spec.kubernetes
    names = Names.of(gang_id)
    named = _named(spec.name)
    meta = _meta(
        names.job,
        gang_id,
        target,
        annotations={**named["annotations"], **({OWNER_ANNOTATION: owner} if owner else {})},
        ownerReferences=[dict(job_owner)] if job_owner else None,
    )
    meta["labels"] = {**meta["labels"], **named["labels"], **group.job_labels}
    pod_labels = {**labels(gang_id), **named["labels"], **group.pod_labels}
    pod_annotations = {
        "sidecar.istio.io/inject": "false",
        **named["annotations"],
        **group.pod_annotations,
    }
    if spec.rdma and opts.networks:
        pod_annotations["k8s.v1.cni.cncf.io/networks"] = ",".join(opts.networks)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "suspend": True,  # a gate: released once the dependents exist (Kueue releases it)
            "completionMode": "Indexed",
            "parallelism": spec.nodes,
            "completions": spec.nodes,
            "backoffLimit": 0,  # one lost pod fails the whole gang
            "activeDeadlineSeconds": opts.lifetime,
            "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_S,
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                    }
                ]
            },
            "template": {
                "metadata": {"labels": pod_labels, "annotations": pod_annotations},
                "spec": _pod_spec(spec, gang_id, group),
            },
        },
    }


def _named(name: str | None) -> dict[str, dict[str, str]]:
    """The user's name on the Job and its pods (``kubectl get pods -l jupyter-mn.io/name=…``)."""
    if not name:
        return {"labels": {}, "annotations": {}}
    value = label_value(name)
    return {
        "labels": {NAME_KEY: value} if value else {},
        "annotations": {NAME_KEY: name},
    }


def _pod_spec(spec: ClusterSpec, gang_id: str, group: gangs.GangParts) -> dict[str, Any]:
    opts = spec.kubernetes
    names = Names.of(gang_id)
    pod: dict[str, Any] = {
        "subdomain": names.service,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": spec.kill_after,  # a deletion is a preemption notice
        "enableServiceLinks": False,
        "automountServiceAccountToken": bool(opts.service_account),
        "affinity": {  # one pod per machine: a "node" of the gang is a Kubernetes node
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {"matchLabels": {GANG_LABEL: names.base}},
                        "topologyKey": "kubernetes.io/hostname",
                    }
                ]
            }
        },
        "securityContext": pod_security(spec.rdma),
        "containers": [_container(spec, gang_id)],
        "volumes": _volumes(opts, names),
        **group.pod_spec,
    }
    if opts.scheduler_name:
        pod["schedulerName"] = opts.scheduler_name
    if opts.service_account:
        pod["serviceAccountName"] = opts.service_account
    if opts.priority_class:
        pod["priorityClassName"] = opts.priority_class
    if opts.node_selector:
        pod["nodeSelector"] = dict(opts.node_selector)
    if opts.tolerations:
        pod["tolerations"] = [parse_toleration(t) for t in opts.tolerations]
    return pod


def _container(spec: ClusterSpec, gang_id: str) -> dict[str, Any]:
    opts = spec.kubernetes
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": opts.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python", "-m", "jupyter_mn.node.pod"],
        "env": _env(spec, gang_id),
        "ports": [
            {"name": "dask", "containerPort": opts.dask_port, "protocol": "TCP"},
            {"name": "ready", "containerPort": opts.dask_port + 1, "protocol": "TCP"},
        ],
        # Ready = this pod's dask worker registered with the scheduler (the port opens then).
        "readinessProbe": {"tcpSocket": {"port": "ready"}, "periodSeconds": 2},
        "resources": _resources(spec),
        "securityContext": container_security(spec.rdma),
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "tls", "mountPath": TLS_DIR, "readOnly": True},
            *(
                {"name": f"volume-{i}", "mountPath": v.path, "readOnly": v.read_only}
                for i, v in enumerate(map(Volume.parse, opts.volumes))
            ),
        ],
    }
    return container


def pod_security(rdma: bool) -> dict[str, Any]:
    """Admitted where the "restricted" Pod Security Standard is enforced; with ``--rdma``,
    "baseline" plus ``IPC_LOCK``.

    Pinning memory for verbs needs ``IPC_LOCK`` beyond a small memlock limit, and Kubernetes
    grants an added capability to root only (it sets no ambient capabilities), so RDMA pods run
    as uid 0 with every other capability dropped. ``fsGroup`` makes the volumes (the TLS Secret
    included, 0440 then) readable by the agent's group.
    """
    pod: dict[str, Any] = {"fsGroup": AGENT_UID, "seccompProfile": {"type": "RuntimeDefault"}}
    if rdma:
        return {**pod, "runAsUser": 0}
    return {**pod, "runAsNonRoot": True, "runAsUser": AGENT_UID, "runAsGroup": AGENT_UID}


def container_security(rdma: bool) -> dict[str, Any]:
    capabilities: dict[str, list[str]] = {"drop": ["ALL"]}
    if rdma:
        capabilities["add"] = ["IPC_LOCK"]
    return {"allowPrivilegeEscalation": False, "capabilities": capabilities}


def _env(spec: ClusterSpec, gang_id: str) -> list[dict[str, Any]]:
    opts = spec.kubernetes
    names = Names.of(gang_id)
    index_ref = f"metadata.annotations['{COMPLETION_INDEX}']"
    env: list[dict[str, Any]] = [
        {"name": "NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": index_ref}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "NNODES", "value": str(spec.nodes)},
        {"name": "NPROC_PER_NODE", "value": str(spec.gpus)},
        {"name": "JUPYTER_MN_JOB", "value": gang_id},
        {"name": "JUPYTER_MN_SCHEDULER", "value": f"tls://{names.host(0)}:{opts.dask_port}"},
        {"name": "JUPYTER_MN_DASK_PORT", "value": str(opts.dask_port)},
        {"name": "JUPYTER_MN_TLS_DIR", "value": TLS_DIR},
        {"name": "JUPYTER_MN_ORPHAN_TIMEOUT", "value": str(opts.orphan_timeout)},
        # Before the kernel first connects, pods wait for the whole gang to be scheduled.
        {
            "name": "JUPYTER_MN_CONNECT_TIMEOUT",
            "value": str(int(opts.schedule_timeout + spec.start_timeout + opts.orphan_timeout)),
        },
    ]
    if spec.rdma:  # bootstrap on the pod network; the RDMA NICs carry the data
        env += [
            {"name": "NCCL_SOCKET_IFNAME", "value": "eth0"},
            {"name": "NCCL_IB_DISABLE", "value": "0"},
        ]
    contract = {e["name"] for e in env if not e["name"].startswith("NCCL_")}
    taken = sorted(k for k, _ in spec.env if k in contract or k.startswith("JUPYTER_MN_"))
    if taken:
        raise SpecError(
            f"--env {', '.join(taken)}: set by jupyter_mn in every pod; use another name"
        )
    env += [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": names.env_secret, "key": key}}}
        for key, _ in spec.env
    ]
    return env


def _resources(spec: ClusterSpec) -> dict[str, Any]:
    opts = spec.kubernetes
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if opts.cpu:
        requests["cpu"] = opts.cpu
    if opts.memory:
        requests["memory"] = limits["memory"] = opts.memory
    if opts.gpu_resource:
        requests[opts.gpu_resource] = limits[opts.gpu_resource] = str(spec.gpus)
    if spec.rdma:
        requests[opts.rdma_resource] = limits[opts.rdma_resource] = "1"
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


def _volumes(opts: KubeOptions, names: Names) -> list[dict[str, Any]]:
    return [
        # /dev/shm is 64 MiB in a container: NCCL and DataLoader workers need far more.
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": opts.shm_size}},
        {"name": "tls", "secret": {"secretName": names.secret, "defaultMode": 0o400}},
        *(
            {
                "name": f"volume-{i}",
                "persistentVolumeClaim": {"claimName": v.claim, "readOnly": v.read_only},
            }
            for i, v in enumerate(map(Volume.parse, opts.volumes))
        ),
    ]


def _service(opts: KubeOptions, gang_id: str, target: Target) -> dict[str, Any]:
    names = Names.of(gang_id)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(names.service, gang_id, target),
        "spec": {
            "clusterIP": "None",  # headless: one DNS record per pod
            "publishNotReadyAddresses": True,  # records exist before readiness (rendezvous)
            "selector": {GANG_LABEL: names.base},
            "ports": [{"name": "dask", "port": opts.dask_port, "protocol": "TCP"}],
        },
    }


def _secret(gang_id: str, target: Target, tls: Mapping[str, str] | None) -> dict[str, Any]:
    names = Names.of(gang_id)
    secret: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(names.secret, gang_id, target),
        "type": "kubernetes.io/tls",
    }
    if tls is None:
        secret["stringData"] = {f: "<generated per gang when applied>" for f in TLS_FILES}
    else:
        secret["data"] = {f: base64.b64encode(tls[f].encode()).decode() for f in TLS_FILES}
    return secret


def _env_secret(spec: ClusterSpec, gang_id: str, target: Target, shown: bool) -> dict[str, Any]:
    """The ``--env`` values, one key each (a variable name is a valid key)."""
    secret: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(Names.of(gang_id).env_secret, gang_id, target),
        "type": "Opaque",
    }
    if shown:
        secret["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in spec.env}
    else:
        secret["stringData"] = {k: "<the --env value, not shown>" for k, _ in spec.env}
    return secret


def _network_policy(opts: KubeOptions, gang_id: str, target: Target) -> dict[str, Any]:
    """Gang pods reach each other on any port; others only the TLS dask scheduler port."""
    names = Names.of(gang_id)
    gang = {"matchLabels": {GANG_LABEL: names.base}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(names.base, gang_id, target),
        "spec": {
            "podSelector": gang,
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": gang}]},
                {"ports": [{"protocol": "TCP", "port": opts.dask_port}]},
            ],
        },
    }


def owned_by(obj: Mapping[str, Any], owner: Mapping[str, Any]) -> dict[str, Any]:
    """``obj`` with an ownerReference to ``owner`` (deleting the owner deletes it)."""
    meta = owner["metadata"]
    ref = {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
    }
    return {**obj, "metadata": {**obj["metadata"], "ownerReferences": [ref]}}


def to_yaml(objects: list[dict[str, Any]]) -> str:
    import yaml

    return yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False)
