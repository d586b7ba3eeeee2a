"""A gang's life against the real control plane (tests/support/kube/real.py): Kueue's own
preemption, a killed kernel's gang, an interrupted wait and ``%cluster down``.

Each runs a whole cell (a real kernel where the kernel's death or interrupt is the point), and
ends with no object of any gang left.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from jupyter_mn.gang.kubernetes.manifests import GANG_LABEL, MANAGED_BY, MANAGER
from jupyter_mn.model.kubespec import KubeOptions
from jupyter_mn.model.spec import ClusterSpec
from jupyter_mn.wire.events import PreemptCause
from tests.backends import test_kube_real as base
from tests.backends.test_kube_real import Plane, _dask_port, _left, eventually, gone
from tests.support.kube import kueue
from tests.support.preempting import PreemptAt

pytestmark = pytest.mark.system

#: the same fixtures: one control plane for this module's tests, refusals failing a test
plane, no_refusals = base.plane, base.no_refusals

MANAGED = f"{MANAGED_BY}%3D{MANAGER}"

#: Saves and stops once the gang agrees it is preempted; every rank says at which step it
#: heard, and a resumed run says where it started.
TRAIN = """
import time
from jupyter_mn import checkpoint, cluster_info
model = torch.nn.Linear(2, 1)
start = 0
last = checkpoint.latest(CKPT)
if last is not None:
    start = checkpoint.load(last, {"model": model})["step"]
    print(f"resumed from step {start}", flush=True)
for step in range(start, STEPS):
    t = torch.ones(1)
    dist.all_reduce(t)
    if dist.get_rank() == 0 and step % 10 == 0:
        print(f"step {step}", flush=True)
    if checkpoint.preempted():
        checkpoint.save({"model": model}, CKPT, step + 1)
        print(f"rank {dist.get_rank()} heard the notice at step {step}", flush=True)
        break
    time.sleep(0.05)
step
"""


def _urgent_job(name: str, gpus: int) -> dict[str, Any]:
    """A Job in the gang's queue, of a higher priority, that holds ``gpus`` GPUs a few seconds."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": kueue.LOCAL_QUEUE}},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "priorityClassName": "high",
                    "containers": [
                        {
                            "name": "main",
                            "image": "python:3.11",
                            "command": ["python", "-c", "import time; time.sleep(3)"],
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                }
            },
        },
    }


class Watch(PreemptAt):
    """Submits the urgent Job once rank 0 printed ``line``; at the first notice, notes why Kueue
    evicted each Workload and each terminating pod's grace."""

    def __init__(self, line: str, plane: Plane) -> None:
        super().__init__(line)
        self.plane = plane
        self.evicted: list[str] = []
        self.graces: set[int] = set()

    def first_notice(self) -> None:
        rest = self.plane.control.rest
        for workload in rest.get(f"{kueue.API}/namespaces/default/workloads")["items"]:
            for cond in workload.get("status", {}).get("conditions", []):
                if cond["type"] == "Evicted" and cond["status"] == "True":
                    self.evicted.append(cond["reason"])
        for pod in rest.get(f"/api/v1/namespaces/default/pods?labelSelector={MANAGED}")["items"]:
            self.graces.add(pod["metadata"].get("deletionGracePeriodSeconds", -1))

    def preempt(self) -> None:
        self.plane.control.rest.create(
            "/apis/batch/v1/namespaces/default/jobs", _urgent_job("urgent", 2)
        )


@pytest.mark.slow  # two gangs of four ranks, one preempted: ~60 s on 2 cores
def test_kueue_preempts_the_gang_for_a_higher_priority_job_and_retries_resume_it(
    plane: Plane, monkeypatch: pytest.MonkeyPatch, tmp_path, no_leftovers: float
) -> None:
    """The ClusterQueue's quota is the gang's 4 GPUs; a Job of priority ``high`` in the same
    queue makes Kueue evict the gang's Workload (its Job suspended, its pods deleted): every
    rank hears the notice within the grace period and saves, the run ends ``Preempted``, and
    ``--retries 1`` runs it again from the checkpoint once the urgent Job has finished."""
    if not plane.control.with_kueue:
        pytest.skip(kueue.missing() or "")
    from jupyter_mn import Cluster

    monkeypatch.setenv("KUBECONFIG", str(plane.control.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    grace = 30.0
    options = KubeOptions(
        image="agent:1",
        gang="kueue",
        priority_class="low",
        dask_port=_dask_port(),
        schedule_timeout=120,
    )
    spec = ClusterSpec(nodes=2, gpus=2, backend="kubernetes", kubernetes=options, grace=grace)
    watch = Watch("step 20", plane)
    with Cluster(spec) as cluster:
        result = cluster.run(
            TRAIN,
            namespace={"CKPT": str(tmp_path / "ckpt"), "STEPS": 400},
            retries=1,
            on_event=watch,
        )
        assert result.ok, result.unwrap()
    assert watch.sent_at, watch.lines
    assert watch.notices and {n.cause for n in watch.notices} == {PreemptCause.POD}
    assert watch.evicted == ["Preempted"], watch.evicted  # Kueue's own preemption
    assert watch.graces == {spec.kill_after}  # the pods' terminationGracePeriodSeconds
    assert grace - 10 < watch.left[0] <= grace  # the grace period, barely begun
    heard = [line for line in watch.lines if "heard the notice" in line]
    assert sorted(line.split()[1] for line in heard) == ["0", "1", "2", "3"], watch.lines
    assert len({line.split()[-1] for line in heard}) == 1  # every rank at the same step
    retried = [n for n in watch.notes if n.startswith("retry")]
    assert len(retried) == 1 and "was preempted" in retried[0], watch.notes
    resumed = {line for line in watch.lines if line.startswith("resumed from step")}
    assert len(resumed) == 1 and int(resumed.pop().split()[-1]) > 20, watch.lines
    assert result.value == 399
    gone(plane, what="the gangs' objects gone")
    plane.control.rest.request(
        "DELETE", "/apis/batch/v1/namespaces/default/jobs/urgent?propagationPolicy=Background"
    )


def _cell(flags: str, code: str = "1 + 1") -> str:
    head = f"%%cluster --backend kubernetes --image agent:1 --dask-port {_dask_port()}"
    return f"{head} {flags}\n{code}"


def _phases(plane: Plane) -> set[str]:
    pods = plane.control.rest.get(f"/api/v1/namespaces/default/pods?labelSelector={MANAGED}")
    return {p["status"].get("phase", "") for p in pods["items"]}


@pytest.mark.slow  # two gangs through a real kernel: ~60 s on 2 cores
def test_down_deletes_the_gang_and_a_killed_kernels_gang_ends_by_itself_and_gc_removes_it(
    plane: Plane, monkeypatch: pytest.MonkeyPatch, registry, no_leftovers: float
) -> None:
    """``%cluster down`` leaves no object; a SIGKILLed kernel's pods exit after
    ``--orphan-timeout`` (nobody deletes them), and ``jupyter mn gc`` removes the rest."""
    from jupyter_mn.jobs.gc import collect
    from tests.support.kernels import Kernel

    monkeypatch.setenv("KUBECONFIG", str(plane.control.kubeconfig))  # the kernel inherits it
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    flags = "--nodes 2 --gpus 2 --gang native --orphan-timeout 5 --no-preflight"
    kernel = Kernel()
    try:
        reply = kernel.run(_cell(flags), timeout=180)
        assert reply.result == "2", reply.error_text
        down = kernel.run("%cluster down", timeout=120)
        assert down.status == "ok", down.error_text
        assert _left(plane) == []
        reply = kernel.run(_cell(flags), timeout=180)
        assert reply.result == "2", reply.error_text
        assert _phases(plane) == {"Running"}
        os.kill(kernel.pid, signal.SIGKILL)  # nobody deletes anything now
        killed = time.monotonic()
        eventually(lambda: _phases(plane) <= {"Succeeded", "Failed"}, 90, "the pods to exit")
        assert time.monotonic() - killed > 5  # by themselves, after the orphan timeout
    finally:
        kernel.shutdown()
    jobs = plane.control.rest.get(f"/apis/batch/v1/namespaces/default/jobs?labelSelector={MANAGED}")
    (gang,) = {job["metadata"]["labels"][GANG_LABEL] for job in jobs["items"]}
    report = collect(registry, keep_s=1e9)
    assert any(f"{gang}: deleted" in line for line in report), report
    gone(plane, what="the dead kernel's gang gone")


@pytest.mark.slow  # a real kernel waiting on Kueue: ~20 s on 2 cores
def test_ctrl_c_while_the_gang_waits_for_quota_leaves_no_object(
    plane: Plane, monkeypatch: pytest.MonkeyPatch, no_leftovers: float
) -> None:
    """3 pods of 2 GPUs against a quota of 4: Kueue keeps the Workload pending; the stop
    button ends the cell at once and deletes everything the gang had created."""
    if not plane.control.with_kueue:
        pytest.skip(kueue.missing() or "")
    from tests.support.kernels import Kernel

    monkeypatch.setenv("KUBECONFIG", str(plane.control.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    kernel = Kernel()
    interrupted: list[float] = []

    def stop_when_waiting(stdout: str) -> None:
        if "insufficient quota" in stdout and not interrupted:
            assert _left(plane), "the gang's objects exist while it waits"
            interrupted.append(time.monotonic())
            kernel.km.interrupt_kernel()

    try:
        flags = "--nodes 3 --gpus 2 --gang kueue --schedule-timeout 120"
        reply = kernel.run(_cell(flags), timeout=180, on_stream=stop_when_waiting)
        assert interrupted, reply.stdout
        assert reply.ename == "KeyboardInterrupt" or "nterrupt" in reply.ename, reply.error_text
        assert time.monotonic() - interrupted[0] < 30
        gone(plane, what="the waiting gang's objects gone")
    finally:
        kernel.shutdown()
