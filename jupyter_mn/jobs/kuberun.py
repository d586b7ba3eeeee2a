"""``jupyter mn submit --backend kubernetes``: the run's kernel in a driver pod (a Job).

The driver runs ``podrunner.py`` in the cell's image with the ServiceAccount ``--service-account``
names (its only credential: the Role docs/backends.md lists); its cells make their gangs from
inside the cluster. What the run is given travels in its Secret, never in the Job's or the pod's
spec: the notebook and its parameters, the ``--env`` values (the pod's ``JUPYTER_MN_ENV`` is a
``secretKeyRef``) and the key that seals the driver log's records (``podlog.py``). The Secret is
created first, so the Job it is named in can only ever mount this one (no one can slip in a
Secret of that name between the two), then handed to the Job (an ownerReference): the garbage
collector removes it with the Job. The submitter keeps the key and the Job's UID in its private
registry (``driverref.py``); everything it learns afterwards comes from the API server, from
that Job (by name and UID) and its pod (owned by that UID, not found by a label anyone who may
create pods can set): the Job's status and the driver's log, read by ``refresh`` (``jupyter mn
list``), ``fetch``, ``follow`` (``logs -f``); ``cancel`` deletes the Job in the foreground and
answers once the driver is told: the cluster removes the rest (the pod hears SIGTERM and releases
its gangs, which it also owns by ownerReference).
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
from .driverref import DriverRef
from .podlog import PodLog, new_key
from .podrunner import KEY, NOTEBOOK, RUN, RUN_DIR
from .registry import JobModel, Registry, RegistryError
from .runstate import RUN_ENDED, RunState
from .submit import Prepared

#: Every object of a run carries it, valued with the run's id (for people: the code finds its
#: objects by name and UID).
RUN_LABEL = "jupyter-mn.io/run"
#: The label the Job controller gives a Job's pods: its UID.
CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
MOUNT = "/etc/jupyter-mn/run"
#: Seconds the driver has, once its Job is deleted, to stop its cell and release its gangs.
GRACE_S = 60
#: Seconds ``cancel`` waits at most for the driver to be told (its pod terminating).
TOLD_S = 10.0
#: (connect, read) seconds of ``logs -f``: a cell may print nothing for hours; like ``kubectl
#: logs -f`` it waits for the next line (the client refuses an unbounded read).
FOLLOW_TIMEOUT_S = (10.0, 24 * 3600.0)
#: An ended driver's Job (and so its log, which ``fetch`` reads) is kept this long: as long as
#: ``jupyter mn gc`` keeps the run's row by default.
KEEP_S = 7 * 24 * 3600


def name_of(job_id: str) -> str:
    return f"jmn-run-{job_id}"


def manifests(
    prepared: Prepared, namespace: str, image: str, account: str, key: str
) -> list[dict[str, Any]]:
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
    from_secret = [
        {"name": var, "valueFrom": {"secretKeyRef": {"name": name, "key": var}}}
        for var in sorted(submission.secrets)
    ]
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": GRACE_S,
        "containers": [
            {
                "name": "driver",
                "image": image,
                "command": ["python", "-m", "jupyter_mn.jobs.podrunner"],
                "env": [{"name": k, "value": v} for k, v in sorted(env.items())] + from_secret,
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
    data = {NOTEBOOK: notebook, RUN: json.dumps(run), KEY: key, **submission.secrets}
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": dict(meta),
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }
    return [job, secret]


def submit(prepared: Prepared, registry: Registry) -> JobModel:
    """Create the run's Secret, then the driver's Job, then hand the Secret to the Job; record
    the run and what only its submitter knows of it (``driverref.py``). A step refused deletes
    what the steps before made: nothing is left."""
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
    key = new_key()
    job, secret = manifests(prepared, namespace, image, account, key)
    name = job["metadata"]["name"]
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    created = None
    try:
        with api_errors("creating the run's Secret"):
            core.create_namespaced_secret(namespace, secret)  # 409 if one is there already
        try:
            with api_errors(f"creating the driver Job {name}"):
                created = batch.create_namespaced_job(namespace, job)
            owner = {"apiVersion": "batch/v1", "kind": "Job", "name": name}
            owner |= {"uid": created.metadata.uid, "controller": True}
            with api_errors("handing the run's Secret to its Job"):
                core.patch_namespaced_secret(
                    name, namespace, {"metadata": {"ownerReferences": [owner]}}
                )
        except BaseException:
            if created is not None:  # not another's Job of that name
                _delete(client, batch.delete_namespaced_job, name, namespace)
            _delete(client, core.delete_namespaced_secret, name, namespace)
            raise
        DriverRef(key, created.metadata.uid).save(registry.log_dir(model.id))
        model.started = model.heartbeat = time.time()
        registry.save(model)
    finally:
        api.close()
    return model


def _delete(client: Any, delete: Callable[..., Any], name: str, namespace: str) -> None:
    """Delete what a submit that did not finish made (gone already: nothing to do)."""
    try:
        delete(name, namespace, propagation_policy="Foreground")
    except client.ApiException as exc:
        if exc.status != 404:
            raise


def _with_api(what: str, act: Callable[[Any, Any], Any]) -> Any:
    from kubernetes import client

    api, _ = load_api()
    try:
        with api_errors(what):
            return act(client, api)
    finally:
        api.close()


def _driver_job(client: Any, api: Any, job: JobModel, uid: str) -> Any | None:
    """The run's Job, if the one the submitter made is still there."""
    try:
        found = client.BatchV1Api(api).read_namespaced_job(name_of(job.id), job.namespace)
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return found if found.metadata.uid == uid else None


def _controlled(client: Any, api: Any, namespace: str, uid: str) -> list[Any]:
    """The pods the Job of ``uid`` controls (the label only narrows the list)."""
    pods = client.CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector=f"{CONTROLLER_UID}={uid}"
    )
    return [
        pod
        for pod in pods.items
        if any(ref.uid == uid and ref.controller for ref in pod.metadata.owner_references or ())
    ]


def _driver_pod(client: Any, api: Any, job: JobModel, uid: str) -> Any | None:
    """The pod the run's Job made: the oldest it controls."""
    pods = _controlled(client, api, job.namespace, uid)
    return min(pods, key=lambda pod: pod.metadata.creation_timestamp, default=None)


def _ref(registry: Registry, job: JobModel) -> DriverRef:
    return DriverRef.load(registry.log_dir(job.id), job.id)


def read_log(registry: Registry, job: JobModel) -> PodLog | None:
    """The driver's log as it is now (None: no driver pod, or it has not started)."""
    ref = _ref(registry, job)

    def read(client: Any, api: Any) -> PodLog | None:
        pod = _driver_pod(client, api, job, ref.job_uid)
        if pod is None or pod.status.phase == "Pending":
            return None
        text = client.CoreV1Api(api).read_namespaced_pod_log(pod.metadata.name, job.namespace)
        return PodLog.parse(text, ref.key)

    return _with_api(f"reading run {job.id}'s driver log", read)


def refresh(registry: Registry, job: JobModel) -> JobModel:
    """The run's row brought up to what its driver says; saved. An ended run's stays."""
    if RunState(job.state) in RUN_ENDED:
        return job

    uid = _ref(registry, job).job_uid

    def status(client: Any, api: Any) -> Any | None:
        found = _driver_job(client, api, job, uid)
        return found.status if found is not None else None

    driver = _with_api(f"reading run {job.id}'s driver Job", status)
    log = read_log(registry, job) if driver is not None else None
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


def notebook(registry: Registry, job: JobModel) -> str:
    """The executed notebook as far as the run has saved it."""
    log = read_log(registry, job)
    if log is None or log.notebook is None:
        raise RegistryError(f"job {job.id} ({job.state}) has not saved its notebook yet")
    return log.notebook


def follow(registry: Registry, job: JobModel, tail: int, write: Callable[[str], None]) -> None:
    """Write the driver's output lines (the last ``tail``, then new ones) until it ends."""
    from kubernetes import client, watch

    ref = _ref(registry, job)
    api, _ = load_api()
    try:
        with api_errors(f"following run {job.id}'s driver log"):
            pod = _driver_pod(client, api, job, ref.job_uid)
            while pod is not None and pod.status.phase == "Pending":
                time.sleep(0.5)  # its log exists once the pod runs
                pod = _driver_pod(client, api, job, ref.job_uid)
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
                for text in PodLog.parse(line, ref.key).lines:
                    write(text)
    finally:
        api.close()


def cancel(registry: Registry, job: JobModel, wait: float | None) -> JobModel:
    """Delete the driver's Job in the foreground (only the one the submitter made: a UID
    precondition) and let the cluster remove the rest: the garbage collector deletes the driver
    pod (SIGTERM: it interrupts its cell and shuts its kernel down, which releases its gangs,
    within ``GRACE_S``), the gangs' Jobs it owns and the run's Secret, all at once. Returns once
    the driver has been told (its pod terminating or gone, at most ``TOLD_S``), or with ``wait``
    once nothing of the run is left (``RegistryError`` naming what is, after ``wait`` seconds).
    A run still going is then CANCELLED."""
    uid = _ref(registry, job).job_uid

    def stop(client: Any, api: Any) -> list[str]:
        objects = RunObjects(client, api, job, uid)
        objects.read()  # the driver pods' uids, before the Job that owns them is gone
        only_it = client.V1Preconditions(uid=uid)  # not a Job made since under its name
        try:
            client.BatchV1Api(api).delete_namespaced_job(
                name_of(job.id),
                job.namespace,
                body=client.V1DeleteOptions(propagation_policy="Foreground", preconditions=only_it),
            )
        except client.ApiException as exc:
            if exc.status not in (404, 409):  # 409: the precondition, another Job
                raise
        deadline = time.monotonic() + (TOLD_S if wait is None else wait)
        while not (objects.told() if wait is None else not objects.read()):
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        return [] if wait is None else objects.read()

    job = refresh(registry, job)
    left = _with_api(f"deleting run {job.id}'s driver Job", stop)
    if RunState(job.state) not in RUN_ENDED:  # an ended run keeps its state; its log is gone
        job.state, job.ended = RunState.CANCELLED.value, time.time()
        job.detail = f"cancelled at cell {job.cells} of {job.cells_total}"
        registry.save(job)
    if left:
        raise RegistryError(f"{job.id}: after {wait:g} s, still there: {', '.join(left)}")
    return job


class RunObjects:
    """What of a run exists, found by UID rather than by a label anyone may set: its Job (by
    name and UID), the driver pods that Job controls, its Secret, and the gangs' Jobs those pods
    own with their pods. UIDs seen once are kept, so a gang is found after its driver is gone."""

    def __init__(self, client: Any, api: Any, job: JobModel, uid: str) -> None:
        self.client, self.api, self.job, self.uid = client, api, job, uid
        self.core = client.CoreV1Api(api)
        self.owners = {uid}  # the run Job's UID, and its driver pods'
        self.name = name_of(job.id)

    def read(self) -> list[str]:
        """Every object of the run that still exists, as ``kind/name``."""
        run = _driver_job(self.client, self.api, self.job, self.uid)
        drivers = self._pods_of(self.uid)
        self.owners |= {p.metadata.uid for p in drivers}
        jobs = self.client.BatchV1Api(self.api).list_namespaced_job(self.job.namespace).items
        gangs = [
            j for j in jobs if any(o.uid in self.owners for o in j.metadata.owner_references or [])
        ]
        pods = drivers + [p for g in gangs for p in self._pods_of(g.metadata.uid)]
        found = [f"jobs/{j.metadata.name}" for j in ([run] if run else []) + gangs]
        found += [f"pods/{p.metadata.name}" for p in pods]
        try:
            self.core.read_namespaced_secret(self.name, self.job.namespace)
            found.append(f"secrets/{self.name}")
        except self.client.ApiException as exc:
            if exc.status != 404:
                raise
        return found

    def told(self) -> bool:
        """Whether every driver pod is terminating (its SIGTERM sent) or gone."""
        return all(p.metadata.deletion_timestamp for p in self._pods_of(self.uid))

    def _pods_of(self, uid: str) -> list[Any]:
        return _controlled(self.client, self.api, self.job.namespace, uid)
