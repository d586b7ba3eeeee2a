"""Read a pod's status (a plain dict, as the API returns it) as one gang node's state.

The states the provisioner acts on: ``ready`` (Running and Ready: the node's dask worker has
registered), ``waiting`` (queued, unschedulable, pulling, starting: keep waiting until the
deadline, show why), ``fatal`` (it will never come up: tear the whole gang down at once).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .manifests import COMPLETION_INDEX

READY, WAITING, FATAL = "ready", "waiting", "fatal"
#: Container waiting reasons that never resolve by themselves.
FATAL_WAITING = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "CrashLoopBackOff",
    }
)
_MESSAGE_CHARS = 300


@dataclass(frozen=True)
class NodeStatus:
    """One pod of the gang: its node index, what it is doing and the cluster's own words."""

    node: int
    pod: str
    state: str
    reason: str
    message: str = ""

    @property
    def line(self) -> str:
        text = f"node {self.node} ({self.pod}): {self.reason}"
        return f"{text}: {self.message}" if self.message else text


def node_index(pod: Mapping[str, Any]) -> int:
    meta = pod.get("metadata") or {}
    raw = (meta.get("annotations") or {}).get(COMPLETION_INDEX)
    raw = raw if raw is not None else (meta.get("labels") or {}).get(COMPLETION_INDEX, "-1")
    return int(raw)


def read_pod(pod: Mapping[str, Any]) -> NodeStatus:
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    node, name = node_index(pod), meta.get("name", "?")

    def make(state: str, reason: str, message: str = "") -> NodeStatus:
        return NodeStatus(node, name, state, reason, _short(message))

    phase = status.get("phase") or "Pending"
    if meta.get("deletionTimestamp"):
        return make(FATAL, "Terminating", "the pod is being deleted")
    if status.get("reason") == "Evicted":
        return make(FATAL, "Evicted", status.get("message", ""))
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        waiting, done = state.get("waiting"), state.get("terminated")
        if waiting and waiting.get("reason") in FATAL_WAITING:
            return make(FATAL, waiting["reason"], waiting.get("message", ""))
        if done:
            why = done.get("reason") or "Exited"
            return make(FATAL, why, f"exit code {done.get('exitCode')}; {done.get('message', '')}")
    if phase in ("Failed", "Succeeded"):
        return make(FATAL, status.get("reason") or phase, status.get("message", ""))
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    scheduled = conditions.get("PodScheduled")
    if scheduled and scheduled.get("status") == "False":
        return make(WAITING, scheduled.get("reason") or "Pending", scheduled.get("message", ""))
    if phase == "Running":
        if (conditions.get("Ready") or {}).get("status") == "True":
            return make(READY, "Ready")
        return make(WAITING, "Starting", "the node agent has not registered yet")
    if scheduled is None:
        return make(WAITING, "Pending", "not scheduled yet")
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting:
            return make(WAITING, waiting.get("reason") or "Waiting", waiting.get("message", ""))
    return make(WAITING, "ContainerCreating")


def job_failure(job: Mapping[str, Any]) -> str | None:
    """The Job's failure reason and message, once it has failed (deadline, pod failure policy)."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Failed" and cond.get("status") == "True":
            return f"{cond.get('reason', 'Failed')}: {cond.get('message', '')}".rstrip(": ")
    return None


def group_message(obj: Mapping[str, Any]) -> str | None:
    """Why a gang scheduler's group object (PodGroup, Kueue Workload) is still waiting."""
    conditions = (obj.get("status") or {}).get("conditions") or []
    for cond in conditions:
        kind, status = cond.get("type"), cond.get("status")
        if (kind == "QuotaReserved" and status == "False") or (
            kind in ("Unschedulable", "PodGroupScheduled", "PodGroupInitiallyScheduled")
            and status == ("True" if kind == "Unschedulable" else "False")
        ):
            return _short(f"{cond.get('reason', kind)}: {cond.get('message', '')}".rstrip(": "))
    phase = (obj.get("status") or {}).get("phase")
    return f"group {phase}" if phase in ("Pending", "Inqueue", "Unknown") else None


def summary(nodes: Iterable[NodeStatus], expected: int) -> list[str]:
    """One line per node, including nodes with no pod yet (never created)."""
    by_node = {n.node: n for n in nodes}
    return [by_node[i].line if i in by_node else f"node {i}: no pod yet" for i in range(expected)]


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MESSAGE_CHARS else text[: _MESSAGE_CHARS - 1] + "…"
