"""How each gang-scheduling policy joins the Job's pods into one all-or-nothing group.

Every policy uses the same Indexed Job; they differ in a queue label (Kueue), a PodGroup plus an
annotation or label and a ``schedulerName`` (Volcano, scheduler-plugins coscheduling), or the
native ``scheduling.k8s.io`` Workload/PodGroup, whose field names changed in every release from
1.35 to 1.37 (so they are built from the server's minor version). ``none`` adds nothing: the
provisioner does all-or-nothing itself (see ``provision.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...errors import SpecError
from ...model.spec import ClusterSpec

POLICIES = ("kueue", "volcano", "coscheduling", "native", "none")
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_API = "scheduling.volcano.sh/v1beta1"
COSCHEDULING_API = "scheduling.x-k8s.io/v1alpha1"
#: Native gang scheduling (KEP-4671): the scheduling.k8s.io version each minor serves.
NATIVE_API = {35: "v1alpha1", 36: "v1alpha2", 37: "v1beta1"}
NATIVE_MIN_MINOR = min(NATIVE_API)
DEFAULT_SCHEDULER = {"volcano": "volcano", "coscheduling": "scheduler-plugins-scheduler"}
#: policy → (PodGroup API, where the pod template names its group, under which key)
_POD_GROUPS = {
    "volcano": (VOLCANO_API, "pod_annotations", VOLCANO_GROUP_ANNOTATION),
    "coscheduling": (COSCHEDULING_API, "pod_labels", COSCHEDULING_LABEL),
}
_TEMPLATE = "ranks"


@dataclass(frozen=True)
class GangParts:
    """What a policy adds: its own objects (owned by the Job) and marks on the Job and pods."""

    objects: list[dict[str, Any]] = field(default_factory=list)
    job_labels: dict[str, str] = field(default_factory=dict)
    pod_labels: dict[str, str] = field(default_factory=dict)
    pod_annotations: dict[str, str] = field(default_factory=dict)
    pod_spec: dict[str, Any] = field(default_factory=dict)


#: Oldest and newest Kubernetes minor versions the builders are validated against.
MIN_MINOR, LATEST_MINOR = 28, 37


@dataclass(frozen=True)
class Target:
    """What the objects are built for: the server's minor version and a concrete gang policy."""

    minor: int = LATEST_MINOR
    policy: str = "none"
    namespace: str = "default"

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise SpecError(f"gang policy {self.policy!r} is not one of {', '.join(POLICIES)}")
        if self.minor < MIN_MINOR:
            raise SpecError(
                f"Kubernetes 1.{self.minor} is too old: jupyter_mn needs 1.{MIN_MINOR} or newer"
            )


def native_api(minor: int) -> str:
    if minor < NATIVE_MIN_MINOR:
        raise SpecError(
            f"--gang native needs Kubernetes 1.{NATIVE_MIN_MINOR} or newer (got 1.{minor})"
        )
    return NATIVE_API.get(minor, NATIVE_API[max(NATIVE_API)])


def parts(spec: ClusterSpec, name: str, target: Target, labels: dict[str, str]) -> GangParts:
    """The policy's contribution for a gang whose objects are all called ``name``."""
    opts = spec.kubernetes
    meta = {"name": name, "namespace": target.namespace, "labels": labels}
    if target.policy == "kueue":
        if not opts.queue:
            raise SpecError("--gang kueue needs --queue LOCALQUEUE")
        return GangParts(job_labels={KUEUE_QUEUE_LABEL: opts.queue})
    if target.policy == "volcano":
        body: dict[str, Any] = {"minMember": spec.nodes}
        if opts.gpu_resource:
            body["minResources"] = {opts.gpu_resource: str(spec.nodes * spec.gpus)}
        if opts.queue:
            body["queue"] = opts.queue
        return _pod_group("volcano", meta, body)
    if target.policy == "coscheduling":
        body = {"minMember": spec.nodes, "scheduleTimeoutSeconds": int(opts.schedule_timeout)}
        return _pod_group("coscheduling", meta, body)
    if target.policy == "native":
        return _native(spec.nodes, meta, native_api(target.minor))
    return GangParts()


def _pod_group(policy: str, meta: dict[str, Any], body: dict[str, Any]) -> GangParts:
    """A scheduler's PodGroup, the pods marked as its members and handed to that scheduler."""
    api, where, key = _POD_GROUPS[policy]
    return GangParts(
        objects=[{"apiVersion": api, "kind": "PodGroup", "metadata": meta, "spec": body}],
        pod_spec={"schedulerName": DEFAULT_SCHEDULER[policy]},
        **{where: {key: meta["name"]}},
    )


def _native(nodes: int, meta: dict[str, Any], version: str) -> GangParts:
    api = f"scheduling.k8s.io/{version}"
    gang = {"gang": {"minCount": nodes}}
    name = meta["name"]
    if version == "v1alpha1":  # 1.35: pods point at the Workload's pod group directly
        workload = {"podGroups": [{"name": _TEMPLATE, "policy": gang}]}
        return GangParts(
            objects=[{"apiVersion": api, "kind": "Workload", "metadata": meta, "spec": workload}],
            pod_spec={"workloadRef": {"name": name, "podGroup": _TEMPLATE}},
        )
    template = {"name": _TEMPLATE, "schedulingPolicy": gang}
    if version == "v1alpha2":  # 1.36
        ref = {
            "podGroupTemplateRef": {
                "workload": {"workloadName": name, "podGroupTemplateName": _TEMPLATE}
            }
        }
    else:  # 1.37+
        ref = {"workloadRef": {"workloadName": name, "templateName": _TEMPLATE}}
    return GangParts(
        objects=[
            {
                "apiVersion": api,
                "kind": "Workload",
                "metadata": meta,
                "spec": {"podGroupTemplates": [template]},
            },
            {
                "apiVersion": api,
                "kind": "PodGroup",
                "metadata": meta,
                "spec": {**ref, "schedulingPolicy": gang},
            },
        ],
        pod_spec={"schedulingGroup": {"podGroupName": name}},
    )
