"""``jupyter mn submit --backend kubernetes`` against the real control plane: the notebook's
kernel runs in a driver pod whose only credential is its ServiceAccount (the token, ``ca.crt``
and namespace our kubelet projects at the fixed path, in the pod's own mount namespace), and
its ``%%cluster`` cells make their gangs from inside the cluster (in-cluster config).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import nbformat
import pytest

from jupyter_mn.jobs.kuberun import GRACE_S, RUN_LABEL
from jupyter_mn.jobs.registry import JobModel
from tests.backends import test_kube_real as base
from tests.backends.test_kube_real import CELL, Plane, _dask_port, gone
from tests.support.kube import sandbox
from tests.support.kube.accounts import DOCUMENTED_ROLE, service_account_kubeconfig
from tests.support.polling import wait_until
from tests.support.runs import JUPYTER_MN, mn, submit_in_a_shell

#: the same fixtures: one control plane for this module's tests, refusals failing a test
plane, no_refusals = base.plane, base.no_refusals

pytestmark = [
    pytest.mark.system,
    pytest.mark.skipif(
        not sandbox.usable(), reason="the test kubelet mounts a pod's service account as root only"
    ),
]

#: A run starts a kernel in its pod, then a gang of four ranks that import torch.
RUN_S = 300
LOOP = "import time\nfor i in range(10_000):\n    print('step', i, flush=True)\n    time.sleep(0.2)"
TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


@pytest.fixture
def cli_env(plane: Plane, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The submitter's environment: the cluster admin's kubeconfig, from outside the cluster."""
    monkeypatch.setenv("KUBECONFIG", str(plane.control.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return dict(os.environ)


def job(job_id: str) -> JobModel:
    (found,) = [
        j
        for j in map(JobModel.from_json, json.loads(mn("list", "--json").stdout))
        if j.id == job_id
    ]
    return found


def ended(job_id: str) -> JobModel:
    return wait_until(lambda: (j := job(job_id)).finished and j, RUN_S, f"{job_id} to end")


def notebook(path: Path, *cells: str) -> Path:
    nbformat.write(
        nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]), path
    )
    return path


def outputs(cell: Any) -> str:
    return "".join(
        o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in cell.get("outputs", [])
    )


def driver_account(plane: Plane, name: str, rules: list[dict[str, Any]]) -> list[str]:
    """A ServiceAccount bound to a Role of ``rules``; the submit flags that make it the driver's."""
    service_account_kubeconfig(plane.control, name, rules)
    return ["--backend", "kubernetes", "--image", "agent:1", "--service-account", name]


def run_objects(plane: Plane, job_id: str) -> list[str]:
    """The run's Job, pod and Secret that still exist, as the admin sees them."""
    selector = f"{RUN_LABEL}%3D{job_id}"
    found = []
    for path in (
        "/apis/batch/v1/namespaces/default/jobs",
        "/api/v1/namespaces/default/pods",
        "/api/v1/namespaces/default/secrets",
    ):
        items = plane.control.rest.get(f"{path}?labelSelector={selector}")["items"]
        found += [f"{path.rsplit('/', 1)[1]}/{i['metadata']['name']}" for i in items]
    return found


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_S)
def test_a_submitted_notebook_runs_its_2x2_cell_in_cluster_after_its_shell_is_killed(
    plane: Plane, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """Three cells; the middle one a 2×2 gang made by the kernel in the driver pod with the
    pod's ServiceAccount (the documented Role), returning rank 0's value; the submitting shell
    is killed at once; the run finishes and ``fetch`` gives every cell's outputs."""
    flags = driver_account(plane, "driver", DOCUMENTED_ROLE)
    nb = notebook(
        tmp_path / "three.ipynb",
        f"import os\nprint('first', os.path.exists({TOKEN!r}))",
        f"%%cluster --nodes 2 --gpus 2 --gang none --dask-port {_dask_port()}\n{CELL}",
        "print('third')",
    )
    job_id, _ = submit_in_a_shell(str(nb), *flags)
    follow = subprocess.run(
        [*JUPYTER_MN, "logs", job_id, "-f"], capture_output=True, text=True, timeout=RUN_S
    )  # returns once the driver has ended
    run = ended(job_id)
    assert (run.state, run.cells, run.cells_total, run.error) == ("SUCCEEDED", 3, 3, None), run
    assert "──── SUCCEEDED" in follow.stdout, follow.stdout + follow.stderr
    mn("fetch", job_id, cwd=tmp_path)
    cells = nbformat.read(tmp_path / f"{job_id}.ipynb", 4).cells
    assert [c["metadata"]["papermill"]["status"] for c in cells] == ["completed"] * 3
    assert outputs(cells[0]) == "first True\n"
    assert "(6.0, 0, 4, 'kubernetes')" in outputs(cells[1])
    assert outputs(cells[2]) == "third\n"
    gone(plane)
    wait = str(GRACE_S)  # its Job and log deleted, and nothing of the run left
    assert mn("cancel", job_id, "--wait", wait).stdout == f"{job_id}: SUCCEEDED\n"
    assert run_objects(plane, job_id) == []


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_S)
def test_cancel_mid_cell_leaves_no_job_pod_or_secret(
    plane: Plane, cli_env: dict[str, str], tmp_path: Path
) -> None:
    flags = driver_account(plane, "canceller", DOCUMENTED_ROLE)
    nb = notebook(
        tmp_path / "long.ipynb",
        "print('first cell done')",
        f"%%cluster --nodes 2 --gpus 1 --gang none --dask-port {_dask_port()}\n{LOOP}",
        "print('never')",
    )
    job_id = mn("submit", str(nb), *flags).stdout.strip()
    wait_until(lambda: "step 2" in mn("logs", job_id).stdout, RUN_S, "the cell's steps in the log")
    mn("fetch", job_id, str(tmp_path / "mid.ipynb"))
    cells = nbformat.read(tmp_path / "mid.ipynb", 4).cells
    assert [c["metadata"]["papermill"]["status"] for c in cells] == [
        "completed",
        "running",
        "pending",
    ]
    assert outputs(cells[0]) == "first cell done\n"
    cancel = mn("cancel", job_id)  # answers once the driver is told; the cluster does the rest
    assert cancel.stdout == f"{job_id}: CANCELLED\n"
    assert "its driver pod is stopping" in cancel.stderr, cancel.stderr
    assert job(job_id).state == "CANCELLED"
    # nothing of the run left within the driver pod's grace period (and the gangs' own)
    assert mn("cancel", job_id, "--wait", str(2 * GRACE_S)).stdout == f"{job_id}: CANCELLED\n"
    assert run_objects(plane, job_id) == []
    gone(plane)


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_S)
def test_a_rule_missing_from_the_drivers_role_fails_the_run_naming_it(
    plane: Plane, cli_env: dict[str, str], tmp_path: Path
) -> None:
    less = [dict(rule) for rule in DOCUMENTED_ROLE]
    less[1] = {**less[1], "verbs": ["list", "delete"]}  # no create on services and secrets
    flags = driver_account(plane, "driver-less", less)
    nb = notebook(
        tmp_path / "denied.ipynb", f"%%cluster --nodes 2 --gang none --dask-port {_dask_port()}\n1"
    )
    job_id = mn("submit", str(nb), *flags).stdout.strip()
    run = ended(job_id)
    assert run.state == "FAILED"
    assert 'cannot create resource "services"' in (run.error or ""), run
    assert "system:serviceaccount:default:driver-less" in (run.error or ""), run
    gone(plane, what="nothing of the gang left")
    assert mn("cancel", job_id, "--wait", str(GRACE_S)).stdout == f"{job_id}: FAILED\n"
    assert run_objects(plane, job_id) == []
