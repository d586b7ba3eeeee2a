"""``jupyter mn submit --backend kubernetes``: the run's kernel in a driver pod (a Job).

The driver runs ``podrunner.py`` in the cell's image with the ServiceAccount ``--service-account``
names (its only credential: the Role docs/backends.md lists); its cells make their gangs from
inside the cluster. The notebook and the run's row travel in a Secret owned by the Job, so the
garbage collector removes it with the Job. Everything the submitter learns afterwards comes from
the API server: the Job's status and the driver's log (``podlog.py``), read by ``refresh``
(``jupyter mn list``), ``fetch``, ``follow`` (``logs -f``); ``cancel`` deletes the Job in the
foreground: the pod hears SIGTERM and releases its gangs, which it also owns (ownerReference).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from typing import Any

from ..errors import SpecError
from ..gang.kubernetes.discovery import load_api
from ..gang.kubernetes.manifests import container_security, pod_security
from ..gang.kubernetes.rollout import api_errors
from .podlog import PodLog
from .podrunner import NOTEBOOK, RUN, RUN_DIR
from .registry import JobModel, Registry, RegistryError
from .runstate import RUN_ENDED, RunState
from .submit import Prepared

#: Every object of a run carries it, valued with the run's id.
RUN_LABEL = "jupyter-mn.io/run"
MOUNT = "/etc/jupyter-mn/run"
#: Seconds the driver has, once its Job is deleted, to stop its cell and release its gangs.
GRACE_S = 60
#: (connect, read) seconds of ``logs -f``: a cell may print nothing for hours; like ``kubectl
#: logs -f`` it waits for the next line (the client refuses an unbounded read).
FOLLOW_TIMEOUT_S = (10.0, 24 * 3600.0)
#: An ended driver's Job (and so its log, which ``fetch`` reads) is kept this long: as long as
#: ``jupyter mn gc`` keeps the run's row by default.
KEEP_S = 7 * 24 * 3600


def name_of(job_id: str) -> str:
    return f"jmn-run-{job_id}"


def manifests(prepared: Prepared, namespace: str, image: str, account: str) -> list[dict[str, Any]]:
    """The driver's Job and its Secret (whose ownerReference ``submit`` adds)."""
    model, submission = prepared.model, prepared.submission
    name, labels = name_of(model.id), {RUN_LABEL: model.id}
    meta = {"name": name, "namespace": namespace, "labels": labels}
    env = {
        **prepared.environ,
        RUN_DIR: MOUNT,
        "JUPYTER_MN_JOB": model.id,
        "JPY_SESSION_NAME": model.notebook or "",
        "PYTHONUNBUFFERED": "1",
    }
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": GRACE_S,
        "containers": [
            {
                "name": "driver",
                "image": image,
                "command": ["python", "-m", "jupyter_mn.jobs.podrunner"],
                "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
                "volumeMounts": [{"name": "run", "mountPath": MOUNT, "readOnly": True}],
                "securityContext": container_security(rdma=False),
            }
        ],
        "volumes": [{"name": "run", "secret": {"secretName": name}}],
        "securityContext": pod_security(rdma=False),  # as the agents': "restricted"
    }
    if account:
        pod["serviceAccountName"] = account
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "backoffLimit": 0,
            "ttlSecondsAfterFinished": KEEP_S,
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }
    with open(submission.notebook) as f:
        notebook = f.read()
    run = {"model": model.to_json(), "parameters": submission.parameters}
    data = {NOTEBOOK: notebook, RUN: json.dumps(run)}
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": dict(meta),
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }
    return [job, secret]


def submit(prepared: Prepared, registry: Registry) -> JobModel:
    """Create the driver's Job, then its Secret owned by it; record the run. A refused
    Secret deletes the Job: nothing is left."""
    from kubernetes import client

    opts = prepared.spec.kubernetes
    namespace, image, account = opts.namespace, opts.image, opts.service_account
    if not image:
        raise SpecError("--backend kubernetes: submit needs --image (the driver runs in it)")
    api, default = load_api()
    namespace = namespace or default
    model = prepared.model
    model.backend, model.namespace, model.pid = "kubernetes", namespace, 0
    model.output = ""  # in the driver's log: ``notebook`` reads it from there
    job, secret = manifests(prepared, namespace, image, account)
    batch = client.BatchV1Api(api)
    try:
        with api_errors(f"creating the driver Job {job['metadata']['name']}"):
            created = batch.create_namespaced_job(namespace, job)
        owner = {"apiVersion": "batch/v1", "kind": "Job"}
        owner |= {"name": created.metadata.name, "uid": created.metadata.uid}
        secret["metadata"]["ownerReferences"] = [owner]
        try:
            with api_errors("creating the run's Secret"):
                client.CoreV1Api(api).create_namespaced_secret(namespace, secret)
        except BaseException:
            batch.delete_namespaced_job(
                created.metadata.name, namespace, propagation_policy="Foreground"
            )
            raise
        model.started = model.heartbeat = time.time()
        registry.save(model)
    finally:
        api.close()
    return model


def _with_api(what: str, act: Callable[[Any, Any], Any]) -> Any:
    from kubernetes import client

    api, _ = load_api()
    try:
        with api_errors(what):
            return act(client, api)
    finally:
        api.close()


def _driver_pod(client: Any, api: Any, job: JobModel) -> Any | None:
    pods = client.CoreV1Api(api).list_namespaced_pod(
        job.namespace, label_selector=f"{RUN_LABEL}={job.id}"
    )
    return pods.items[0] if pods.items else None


def read_log(job: JobModel) -> PodLog | None:
    """The driver's log as it is now (None: no driver pod, or it has not started)."""

    def read(client: Any, api: Any) -> PodLog | None:
        pod = _driver_pod(client, api, job)
        if pod is None or pod.status.phase == "Pending":
            return None
        text = client.CoreV1Api(api).read_namespaced_pod_log(pod.metadata.name, job.namespace)
        return PodLog.parse(text)

    return _with_api(f"reading run {job.id}'s driver log", read)


def refresh(registry: Registry, job: JobModel) -> JobModel:
    """The run's row brought up to what its driver says; saved. An ended run's stays."""
    if RunState(job.state) in RUN_ENDED:
        return job

    def status(client: Any, api: Any) -> Any | None:
        found = client.BatchV1Api(api).list_namespaced_job(
            job.namespace, label_selector=f"{RUN_LABEL}={job.id}"
        )
        return found.items[0].status if found.items else None

    driver = _with_api(f"reading run {job.id}'s driver Job", status)
    log = read_log(job) if driver is not None else None
    if log is not None and log.progress is not None:
        p = log.progress
        job.state, job.cells, job.detail, job.error = p.state, p.cells, p.detail, p.error
    if driver is None:
        job.state, job.detail = RunState.FAILED.value, "its driver Job is gone"
    elif driver.failed and RunState(job.state) not in RUN_ENDED:
        job.state, job.detail = RunState.FAILED.value, "its driver pod failed"
    if RunState(job.state) in RUN_ENDED:
        job.ended = job.ended or time.time()
    job.heartbeat = time.time()
    registry.save(job)
    return job


def notebook(job: JobModel) -> str:
    """The executed notebook as far as the run has saved it."""
    log = read_log(job)
    if log is None or log.notebook is None:
        raise RegistryError(f"job {job.id} ({job.state}) has not saved its notebook yet")
    return log.notebook


def follow(job: JobModel, tail: int, write: Callable[[str], None]) -> None:
    """Write the driver's output lines (the last ``tail``, then new ones) until it ends."""
    from kubernetes import client, watch

    api, _ = load_api()
    try:
        with api_errors(f"following run {job.id}'s driver log"):
            pod = _driver_pod(client, api, job)
            while pod is not None and pod.status.phase == "Pending":
                time.sleep(0.5)  # its log exists once the pod runs
                pod = _driver_pod(client, api, job)
            if pod is None:
                raise RegistryError(f"job {job.id} has no driver pod")
            lines = watch.Watch().stream(
                client.CoreV1Api(api).read_namespaced_pod_log,
                pod.metadata.name,
                job.namespace,
                follow=True,
                tail_lines=tail or None,
                _request_timeout=FOLLOW_TIMEOUT_S,
            )
            for line in lines:
                for text in PodLog.parse(line).lines:
                    write(text)
    finally:
        api.close()


def cancel(registry: Registry, job: JobModel, wait: float) -> JobModel:
    """Delete the driver's Job in the foreground and wait until it is gone (its pod, Secret
    and, through the pod, its gangs go first); a run still going is then CANCELLED."""

    def delete(client: Any, api: Any) -> None:
        batch = client.BatchV1Api(api)
        try:
            batch.delete_namespaced_job(
                name_of(job.id), job.namespace, propagation_policy="Foreground"
            )
        except client.ApiException as exc:
            if exc.status != 404:
                raise
        deadline = time.monotonic() + wait
        while batch.list_namespaced_job(
            job.namespace, label_selector=f"{RUN_LABEL}={job.id}"
        ).items:
            if time.monotonic() > deadline:
                raise RegistryError(f"{job.id}: its driver Job is still there after {wait:g} s")
            time.sleep(0.2)  # the garbage collector deletes its pod, then the Job

    job = refresh(registry, job)
    _with_api(f"deleting run {job.id}'s driver Job", delete)
    if RunState(job.state) not in RUN_ENDED:  # an ended run keeps its state; its log is gone
        job.state, job.ended = RunState.CANCELLED.value, time.time()
        job.detail = f"cancelled at cell {job.cells} of {job.cells_total}"
        registry.save(job)
    return job
