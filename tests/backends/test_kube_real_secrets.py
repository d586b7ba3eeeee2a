"""A detached run's secrets on the real control plane, read as a user with the namespace's
``view`` role (Kubernetes' default: Jobs, pods and pod logs, not Secrets) would: a secret
parameter and a secret ``--env`` value are in no Job, pod or pod log, not even base64-decoded,
while the submitter's ``list``, ``logs`` and ``fetch`` work; a record the notebook prints is
no record; a pod labelled as the driver is not the driver; the run's Secret is made before its
Job and then is the Job's."""

from __future__ import annotations

import base64
import binascii
import contextlib
import gzip
import hashlib
import json
import re
import uuid
from pathlib import Path
from typing import Any

import nbformat
import pytest
from kubernetes import client, config, watch

from jupyter_mn.gang.kubernetes.manifests import container_security, pod_security
from jupyter_mn.jobs.kuberun import RUN_LABEL, name_of
from tests.backends import test_kube_real as base
from tests.backends import test_kube_real_submit as submitted
from tests.backends.test_kube_real import Plane, _dask_port, gone
from tests.backends.test_kube_real_submit import RUN_S, driver_account, ended, job, mn
from tests.support.kube import sandbox
from tests.support.kube.accounts import DOCUMENTED_ROLE, service_account_kubeconfig
from tests.support.kube.rest import RestError
from tests.support.polling import wait_until

#: the same fixtures: one control plane for this module's tests, refusals failing a test
plane, no_refusals, cli_env = base.plane, base.no_refusals, submitted.cli_env

pytestmark = [
    pytest.mark.system,
    pytest.mark.skipif(
        not sandbox.usable(), reason="the test kubelet mounts a pod's service account as root only"
    ),
]

#: What a notebook prints that looks like the driver log's records (``podlog.py``), after its
#: cell's start has been published (a record printed before it would be overwritten anyway).
FORGED = (
    "import json, time\n"
    "for i in range(100_000):\n"
    "    print('waiting', i, flush=True)\n"
    "    if i == 4:\n"
    "        print('\\x1ejupyter-mn progress ' + json.dumps("
    "{'state': 'SUCCEEDED', 'cells': 9, 'cells_total': 9}), flush=True)\n"
    "        print('\\x1ejupyter-mn progress {', flush=True)\n"
    "    time.sleep(0.5)"
)
#: A base64 run long enough to hide a secret (a token's shape, the gzip of a notebook).
_BASE64 = re.compile(r"[A-Za-z0-9+/_-]{16,}={0,2}")


def _decoded(text: str) -> str:
    """Every base64 run of ``text`` decoded (and gunzipped where it is gzip), as text."""
    found = []
    for run in _BASE64.findall(text):
        for decode in (base64.b64decode, base64.urlsafe_b64decode):
            try:
                data = decode(run + "=" * (-len(run) % 4))
            except (binascii.Error, ValueError):
                continue
            with contextlib.suppress(OSError, EOFError):
                data = gzip.decompress(data)
            found.append(data.decode("latin-1"))
    return "\n".join(found)


def what_a_viewer_reads(plane: Plane) -> str:
    """Every Job, pod and pod log of ``default`` as a ServiceAccount bound to ``view`` reads
    them, and every base64 run in them decoded."""
    path = service_account_kubeconfig(plane.control, f"viewer-{uuid.uuid4().hex[:6]}", "view")
    api = config.new_client_from_config(str(path))
    try:
        core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
        with pytest.raises(client.ApiException) as denied:
            core.list_namespaced_secret("default")
        assert denied.value.status == 403  # the role is what it says
        pods = core.list_namespaced_pod("default")
        texts = [
            json.dumps(api.sanitize_for_serialization(batch.list_namespaced_job("default"))),
            json.dumps(api.sanitize_for_serialization(pods)),
        ]
        texts += [
            core.read_namespaced_pod_log(pod.metadata.name, "default")
            for pod in pods.items
            if pod.status.phase != "Pending"
        ]
    finally:
        api.close()
    text = "\n".join(texts)
    return text + "\n" + _decoded(text)


def admin_log(plane: Plane, pod: str) -> str:
    """A pod's log as the cluster admin reads it ("" while it has none)."""
    try:
        return client.CoreV1Api(plane.api).read_namespaced_pod_log(pod, "default")
    except client.ApiException:
        return ""


def decoy(plane: Plane, job_id: str) -> dict:
    """A pod anyone who may create pods can make, labelled as the run's driver. (Not with the
    Job's ``controller-uid`` label: the Job controller would adopt it, as its own, and delete
    one of its two pods.)"""
    labels = {RUN_LABEL: job_id}
    container = {
        "name": "decoy",
        "image": "agent:1",
        "command": [
            "python",
            "-c",
            "import time; print('decoy line', flush=True); time.sleep(600)",
        ],
        "securityContext": container_security(rdma=False),
    }
    pod = {
        "metadata": {"name": "aaa-decoy", "labels": labels},
        "spec": {"containers": [container], "securityContext": pod_security(rdma=False)},
    }
    return plane.control.rest.create("/api/v1/namespaces/default/pods", pod)


@pytest.mark.slow
@pytest.mark.timeout(3 * RUN_S)
def test_a_viewer_reads_no_secret_of_a_run_its_submitter_reads_it_all(
    plane: Plane, cli_env: dict[str, str], tmp_path: Path
) -> None:
    token, value = "hf_" + uuid.uuid4().hex, "wandb-" + uuid.uuid4().hex
    flags = driver_account(plane, "driver-secrets", DOCUMENTED_ROLE)
    parameters = nbformat.v4.new_code_cell("token = ''", metadata={"tags": ["parameters"]})
    ranks = (
        f"%%cluster --nodes 1 --gpus 1 --gang none --dask-port {_dask_port()}\n"
        "import hashlib, os\n"
        "print('ranks see', hashlib.sha256(os.environ['WANDB_API_KEY'].encode()).hexdigest())"
    )
    cells = [parameters, *map(nbformat.v4.new_code_cell, [ranks, FORGED])]
    nbformat.write(nbformat.v4.new_notebook(cells=cells), tmp_path / "secret.ipynb")
    job_id = mn(
        "submit",
        str(tmp_path / "secret.ipynb"),
        *flags,
        "-p",
        "token",
        token,
        "--env",
        f"WANDB_API_KEY={value}",
    ).stdout.strip()
    rest = plane.control.rest
    try:
        wait_until(lambda: "waiting 6" in mn("logs", job_id).stdout, RUN_S, "the forged records")
        printed = mn("logs", job_id).stdout  # control characters escaped: \x1e
        assert "\\x1ejupyter-mn progress {" in printed  # the lines reached the log
        assert job(job_id).state == "RUNNING"  # not the SUCCEEDED the notebook printed
        seen = hashlib.sha256(value.encode()).hexdigest()
        assert f"[node 0 rank 0] ranks see {seen}" in mn("logs", job_id).stdout
        # the run's Secret belongs to its Job (by UID), made by the submitter
        driver = rest.get(f"/apis/batch/v1/namespaces/default/jobs/{name_of(job_id)}")
        secret = rest.get(f"/api/v1/namespaces/default/secrets/{name_of(job_id)}")
        (owner,) = secret["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"]) == ("Job", driver["metadata"]["uid"])
        # a pod labelled as the driver is not the driver
        decoy(plane, job_id)
        wait_until(lambda: "decoy line" in admin_log(plane, "aaa-decoy"), RUN_S, "the decoy's line")
        logs = mn("logs", job_id).stdout
        assert "waiting" in logs and "decoy line" not in logs
        # the submitter's fetch: the notebook with its parameter
        mn("fetch", job_id, str(tmp_path / "mid.ipynb"))
        injected = nbformat.read(tmp_path / "mid.ipynb", 4).cells[1]
        assert "injected-parameters" in injected.metadata.tags
        assert token in injected.source
        # a viewer: neither secret, anywhere, even decoded
        read = what_a_viewer_reads(plane)
        assert "waiting 2" in read  # the driver's log was read
        assert token not in read and value not in read
        # the driver gone, the decoy is the only pod so labelled: still not the driver
        assert mn("cancel", job_id, "--wait", "90").stdout == f"{job_id}: CANCELLED\n"
        assert mn("logs", job_id).stdout == ""
        refused = mn("fetch", job_id, str(tmp_path / "late.ipynb"), ok=False)
        assert refused.returncode != 0 and not (tmp_path / "late.ipynb").exists()
    finally:
        mn("cancel", job_id, "--wait", "90", ok=False)  # a test that failed before
        with contextlib.suppress(RestError):  # made, or not if the test failed before
            rest.request("DELETE", "/api/v1/namespaces/default/pods/aaa-decoy")
        gone(plane)


def created_at(list_in: Any, since: str, name: str) -> int:
    """The resource version (etcd's revision) at which ``name`` was created: its ADDED event,
    replayed by a watch from ``since``."""
    events = watch.Watch().stream(list_in, "default", resource_version=since, timeout_seconds=10)
    for event in events:
        if event["type"] == "ADDED" and event["object"].metadata.name == name:
            return int(event["object"].metadata.resource_version)
    raise AssertionError(f"{name} was not created")


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_S)
def test_the_runs_secret_is_made_before_the_job_that_names_it(
    plane: Plane, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """Made after, a user who may create Secrets could make one of that name first, for the
    driver's ServiceAccount to run their notebook."""
    core, batch = client.CoreV1Api(plane.api), client.BatchV1Api(plane.api)
    since = core.list_namespaced_secret("default").metadata.resource_version
    flags = driver_account(plane, "driver-order", DOCUMENTED_ROLE)
    nb = tmp_path / "quick.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")]), nb)
    job_id = mn("submit", str(nb), *flags).stdout.strip()
    try:
        secret = created_at(core.list_namespaced_secret, since, name_of(job_id))
        assert secret < created_at(batch.list_namespaced_job, since, name_of(job_id))
        assert ended(job_id).state == "SUCCEEDED"
    finally:
        mn("cancel", job_id, "--wait", "90", ok=False)
