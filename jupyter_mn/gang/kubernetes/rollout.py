"""A gang's objects on the API server: create gated, watch until every pod is up, delete all.

The Job is created suspended, its dependents (Service, Secret, NetworkPolicy, PodGroup…) get an
ownerReference to it, then the gate opens (Kueue opens it itself on admission). Pods are watched;
each node's pending reason is shown as it changes. The gang is up when every pod is Running and
Ready; a fatal reason (image pull, config error, eviction, exit) or the schedule deadline deletes
everything at once (foreground) and the error names each node's reason.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

from ...errors import SchedulingError
from ...wire.events import NodesWaiting, OnEvent
from . import podstate
from .manifests import Names, owned_by, selector

_TICK_S = 0.25
_POLL_S = 2.0
_SHOW_S = 1.0
_WATCH_READ_S = 10.0
_DELETE_WAIT_S = 90.0
#: The built-in kinds of a gang, Job first: (API class, the name in its method names).
BUILTIN_KINDS = {
    "Job": ("BatchV1Api", "job"),
    "Service": ("CoreV1Api", "service"),
    "Secret": ("CoreV1Api", "secret"),
    "NetworkPolicy": ("NetworkingV1Api", "network_policy"),
}


def api_errors(what: str) -> contextlib.AbstractContextManager[None]:
    """Turn client exceptions into one short ``SchedulingError`` naming what was being done."""

    @contextlib.contextmanager
    def convert() -> Iterator[None]:
        from kubernetes.client import ApiException
        from urllib3.exceptions import HTTPError

        try:
            yield
        except ApiException as exc:
            raise SchedulingError(f"{what}: {_api_message(exc)}") from None
        except HTTPError as exc:
            why = str(getattr(exc, "reason", None) or exc).rsplit(": ", 1)[-1]
            raise SchedulingError(f"{what}: cannot reach the API server ({why})") from None

    return convert()


def _api_message(exc: Any) -> str:
    try:
        return json.loads(exc.body)["message"]
    except (TypeError, ValueError, KeyError):
        return f"{exc.status} {exc.reason}"


class Rollout:
    """Create, watch and delete one gang's objects. ``api``: a ``kubernetes.client.ApiClient``."""

    def __init__(
        self,
        api: Any,
        gang_id: str,
        objects: list[dict[str, Any]],
        nodes: int,
        policy: str,
        notify: OnEvent,
        kueue_version: str = "v1beta1",
    ) -> None:
        from kubernetes import client

        self.api, self.objects, self.nodes, self.policy = api, objects, nodes, policy
        self.names = Names.of(gang_id)
        self.namespace = objects[0]["metadata"]["namespace"]
        self.selector = selector(gang_id)
        self.notify = notify
        self.kueue_version = kueue_version
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.created: list[dict[str, Any]] = []
        self.pods: dict[int, dict[str, Any]] = {}

    # ---- create
    def create(self) -> None:
        """The Job (suspended), its dependents owned by it, then release the gate."""
        job, *dependents = self.objects
        with api_errors(f"creating Job {self.names.job}"):
            created_job = self._call("create", job)
        self.created.append(job)
        for obj in dependents:
            with api_errors(f"creating {obj['kind']} {obj['metadata']['name']}"):
                self._call("create", owned_by(obj, created_job))
            self.created.append(obj)
        if self.policy != "kueue":  # Kueue unsuspends the Job when it admits the workload
            with api_errors("starting the Job"):
                self.batch.patch_namespaced_job(
                    self.names.job,
                    self.namespace,
                    {"spec": {"suspend": False}},
                    _preload_content=False,
                )

    def _call(self, verb: str, obj: dict[str, Any], **kw: Any) -> dict[str, Any]:
        from kubernetes import client

        kind, meta = obj["kind"], obj["metadata"]
        if kind in BUILTIN_KINDS:
            cls, plural = BUILTIN_KINDS[kind]
            method = getattr(getattr(client, cls)(self.api), f"{verb}_namespaced_{plural}")
            args = (self.namespace, obj) if verb == "create" else (meta["name"], self.namespace)
            result = method(*args, _preload_content=False, **kw)
        else:
            group, version = obj["apiVersion"].split("/")
            plural = kind.lower() + "s"
            if verb == "create":
                result = self.custom.create_namespaced_custom_object(
                    group, version, self.namespace, plural, obj, _preload_content=False
                )
            else:  # the client names a custom object's read "get"
                custom_verb = "get" if verb == "read" else verb
                result = getattr(self.custom, f"{custom_verb}_namespaced_custom_object")(
                    group,
                    version,
                    self.namespace,
                    plural,
                    meta["name"],
                    _preload_content=False,
                    **kw,
                )
        return json.loads(result.data)

    # ---- wait
    def wait_ready(self, deadline: float, timeout: float) -> dict[int, dict[str, Any]]:
        """Return node → pod once all pods are Running and Ready; else tear down and raise."""
        shown: dict[tuple[str, str], tuple[int, ...]] = {}
        watcher = _PodWatch(self.core, self.namespace, self.selector)
        next_poll = next_show = 0.0
        try:
            while True:
                self._drain(watcher.events)
                statuses = {n: podstate.read_pod(p) for n, p in self.pods.items()}
                if watcher.refused:  # no event will ever come: say which right is missing
                    self.fail(f"watching the gang's pods: {watcher.refused}", statuses.values())
                fatal = [s for s in statuses.values() if s.state == podstate.FATAL]
                if fatal:
                    self.fail(f"node {fatal[0].node} cannot start", statuses.values())
                if sum(s.state == podstate.READY for s in statuses.values()) == self.nodes:
                    return dict(self.pods)
                now = time.monotonic()
                if now >= next_show:  # at most once a second: a 64-node gang stays readable
                    next_show = now + _SHOW_S
                    self._show(statuses, shown)
                if now >= next_poll:
                    next_poll = now + _POLL_S
                    self._check_job_and_group(statuses, shown)
                if now >= deadline:
                    self.fail(
                        f"not all {self.nodes} pods were ready within {timeout:g} s "
                        "(--schedule-timeout)",
                        statuses.values(),
                    )
        finally:
            watcher.stop()

    def _show(
        self,
        statuses: dict[int, podstate.NodeStatus],
        shown: dict[tuple[str, str], tuple[int, ...]],
    ) -> None:
        """One event per distinct reason (Ready too), naming its nodes, when that set changes."""
        groups: dict[tuple[str, str], list[int]] = {}
        for node, st in sorted(statuses.items()):
            groups.setdefault((st.reason, st.message), []).append(node)
        for key, nodes in groups.items():
            if shown.get(key) != tuple(nodes):
                shown[key] = tuple(nodes)
                self.notify(NodesWaiting(tuple(nodes), *key))

    def _drain(self, events: queue.Queue[tuple[str, dict[str, Any]]]) -> None:
        """Apply every queued pod event (waiting a tick for the first)."""
        try:
            kind, pod = events.get(timeout=_TICK_S)
        except queue.Empty:
            return
        while True:
            node = podstate.node_index(pod)
            current = self.pods.get(node)
            if kind != "DELETED":
                self.pods[node] = pod
            elif current is not None and current["metadata"]["name"] == pod["metadata"]["name"]:
                gone = {**pod["metadata"], "deletionTimestamp": "deleted"}
                self.pods[node] = {**pod, "metadata": gone}  # a lost pod is fatal here
            try:
                kind, pod = events.get_nowait()
            except queue.Empty:
                return

    def _check_job_and_group(
        self,
        statuses: dict[int, podstate.NodeStatus],
        shown: dict[tuple[str, str], tuple[int, ...]],
    ) -> None:
        with api_errors("reading the Job"):
            job = self._call("read", self.objects[0])
        failure = podstate.job_failure(job)
        if failure:
            self.fail(f"the Job failed ({failure})", statuses.values())
        message = self._group_message()
        if message and (message, "") not in shown:
            shown[(message, "")] = ()
            self.notify(NodesWaiting((), message))

    def _group_message(self) -> str | None:
        from kubernetes.client import ApiException

        try:
            if self.policy == "kueue":
                found = self.custom.list_namespaced_custom_object(
                    "kueue.x-k8s.io",
                    self.kueue_version,
                    self.namespace,
                    "workloads",
                    _preload_content=False,
                )
                for item in json.loads(found.data).get("items", []):
                    owners = item["metadata"].get("ownerReferences") or []
                    if any(o.get("name") == self.names.job for o in owners):
                        return podstate.group_message(item)
                return None
            groups = [o for o in self.objects if o["kind"] == "PodGroup"]
            return podstate.group_message(self._call("read", groups[0])) if groups else None
        except ApiException:  # no read rights on the group object: pod reasons still show
            return None

    # ---- delete
    def fail(self, why: str, statuses: Any) -> None:
        lines = podstate.summary(statuses, self.nodes)
        self.delete()
        raise SchedulingError(
            f"{why}; every object of the gang was deleted.\n  " + "\n  ".join(lines)
        )

    def delete(self, wait: float = _DELETE_WAIT_S) -> None:
        """Delete what was created (the Job in the foreground), then wait until no pod is left."""
        from kubernetes.client import ApiException

        for obj in reversed(self.created):
            kw = {"propagation_policy": "Foreground"} if obj["kind"] == "Job" else {}
            with contextlib.suppress(ApiException):  # 404: already gone (owner deleted it)
                self._call("delete", obj, **kw)
        self.created.clear()
        deadline = time.monotonic() + wait
        with api_errors("waiting for the gang's pods to go away"):
            while self._pods_left():
                if time.monotonic() >= deadline:
                    raise SchedulingError(
                        f"pods of {self.names.job} were still terminating after {wait:g} s"
                    )
                time.sleep(_TICK_S)

    def _pods_left(self) -> list[dict[str, Any]]:
        listed = self.core.list_namespaced_pod(
            self.namespace, label_selector=self.selector, _preload_content=False
        )
        return json.loads(listed.data)["items"]


class _PodWatch:
    """Pod events of one gang on a queue, from a watch that re-opens until stopped."""

    def __init__(self, core: Any, namespace: str, label_selector: str) -> None:
        self.events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self._stopped = threading.Event()
        self._args = (core, namespace, label_selector)
        self._watch: Any = None
        #: why the API server refused the watch (401/403: no retry helps), else ""
        self.refused = ""
        threading.Thread(target=self._run, daemon=True, name="jupyter-mn-pod-watch").start()

    def _run(self) -> None:
        from kubernetes import watch
        from kubernetes.client import ApiException

        core, namespace, label_selector = self._args
        while not self._stopped.is_set():
            self._watch = watch.Watch()
            try:
                for event in self._watch.stream(
                    core.list_namespaced_pod,
                    namespace,
                    label_selector=label_selector,
                    _request_timeout=(5, _WATCH_READ_S),
                    deserialize=False,  # plain dicts: what podstate reads
                ):
                    self.events.put((event["type"], event["object"]))
            except ApiException as exc:
                if exc.status in (401, 403):
                    self.refused = _api_message(exc)
                    return
            except Exception:  # read timeout, 410 Gone, dropped connection: open a new watch
                pass
            self._stopped.wait(_TICK_S)

    def stop(self) -> None:
        self._stopped.set()
        if self._watch is not None:
            self._watch.stop()
