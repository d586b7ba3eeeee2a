"""Pod status as the API reports it → what the gang does (wait, go, tear down)."""

from __future__ import annotations

import pytest

from jupyter_mn.gang.kubernetes.podstate import (
    FATAL,
    READY,
    WAITING,
    group_message,
    job_failure,
    read_pod,
    summary,
)


def pod(status: dict, index: int = 1, **meta: object) -> dict:
    annotations = {"batch.kubernetes.io/job-completion-index": str(index)}
    return {
        "metadata": {"name": f"g-{index}-abcde", "annotations": annotations, **meta},
        "status": status,
    }


def cond(kind: str, status: str, reason: str = "", message: str = "") -> dict:
    return {"type": kind, "status": status, "reason": reason, "message": message}


def waiting(reason: str, message: str = "") -> dict:
    return {"containerStatuses": [{"state": {"waiting": {"reason": reason, "message": message}}}]}


UNSCHEDULABLE = (
    "0/12 nodes are available: 4 Insufficient nvidia.com/gpu, 8 node(s) had untolerated taint."
)


@pytest.mark.parametrize(
    ("status", "state", "reason"),
    [
        ({"phase": "Running", "conditions": [cond("Ready", "True")]}, READY, "Ready"),
        ({"phase": "Running", "conditions": [cond("Ready", "False")]}, WAITING, "Starting"),
        (
            {
                "phase": "Pending",
                "conditions": [cond("PodScheduled", "False", "Unschedulable", UNSCHEDULABLE)],
            },
            WAITING,
            "Unschedulable",
        ),
        (
            {"phase": "Pending", "conditions": [cond("PodScheduled", "False", "SchedulingGated")]},
            WAITING,
            "SchedulingGated",
        ),
        ({"phase": "Pending"}, WAITING, "Pending"),
        (
            {
                "phase": "Pending",
                "conditions": [cond("PodScheduled", "True")],
                **waiting("ContainerCreating"),
            },
            WAITING,
            "ContainerCreating",
        ),
        (
            {"phase": "Pending", **waiting("ErrImagePull", "manifest unknown")},
            FATAL,
            "ErrImagePull",
        ),
        ({"phase": "Pending", **waiting("ImagePullBackOff")}, FATAL, "ImagePullBackOff"),
        (
            {"phase": "Pending", **waiting("CreateContainerConfigError", 'secret "x" not found')},
            FATAL,
            "CreateContainerConfigError",
        ),
        (
            {
                "phase": "Failed",
                "containerStatuses": [
                    {"state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}
                ],
            },
            FATAL,
            "OOMKilled",
        ),
        (
            {
                "phase": "Failed",
                "reason": "Evicted",
                "message": "The node was low on resource: memory.",
            },
            FATAL,
            "Evicted",
        ),
        ({"phase": "Failed", "reason": "DeadlineExceeded"}, FATAL, "DeadlineExceeded"),
    ],
)
def test_states(status, state, reason):
    node = read_pod(pod(status))
    assert (node.node, node.state, node.reason) == (1, state, reason)


def test_messages_are_kept_and_a_deleted_pod_is_fatal():
    node = read_pod(
        pod(
            {
                "phase": "Pending",
                "conditions": [cond("PodScheduled", "False", "Unschedulable", UNSCHEDULABLE)],
            }
        )
    )
    assert node.message == UNSCHEDULABLE and node.line.startswith(
        "node 1 (g-1-abcde): Unschedulable: 0/12"
    )
    gone = read_pod(pod({"phase": "Running"}, deletionTimestamp="2026-01-01T00:00:00Z"))
    assert gone.state == FATAL and gone.reason == "Terminating"
    assert (
        len(read_pod(pod({"phase": "Pending", **waiting("ErrImagePull", "x" * 1000)})).message)
        == 300
    )


def test_summary_names_nodes_without_pods():
    lines = summary(
        [read_pod(pod({"phase": "Running", "conditions": [cond("Ready", "True")]}, index=0))], 2
    )
    assert lines == ["node 0 (g-0-abcde): Ready", "node 1: no pod yet"]


def test_job_and_group_messages():
    failed = {
        "status": {
            "conditions": [
                cond(
                    "Failed",
                    "True",
                    "DeadlineExceeded",
                    "Job was active longer than specified deadline",
                )
            ]
        }
    }
    assert job_failure(failed) == "DeadlineExceeded: Job was active longer than specified deadline"
    assert job_failure({"status": {}}) is None
    kueue = {
        "status": {"conditions": [cond("QuotaReserved", "False", "Pending", "insufficient quota")]}
    }
    volcano = {
        "status": {
            "phase": "Pending",
            "conditions": [
                cond(
                    "Unschedulable", "True", "NotEnoughResources", "3/4 tasks in gang unschedulable"
                )
            ],
        }
    }
    native = {"status": {"conditions": [cond("PodGroupScheduled", "False", "Unschedulable", "")]}}
    assert group_message(kueue) == "Pending: insufficient quota"
    assert group_message(volcano) == "NotEnoughResources: 3/4 tasks in gang unschedulable"
    assert group_message(native) == "Unschedulable"
    assert group_message({"status": {"phase": "Inqueue"}}) == "group Inqueue"
    assert group_message({"status": {"phase": "Running"}}) is None
