"""One ``coordination.k8s.io`` Lease per namespace serializes client-side gangs while they come up.

Without a gang scheduler, two notebooks asking for 4 of 4 free nodes at once can each get 2 and
wait for each other until both time out (the deadlock gang schedulers exist to prevent). Holding
this Lease from "create the Job" to "all pods ready" means one gang comes up at a time; the other
waits, showing who it waits for. Creation is atomic (409 when held), a holder renews it, and an
expired Lease (its kernel died) is taken over, guarded by a uid precondition.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from typing import Any

from ...errors import SchedulingError

NAME = "jupyter-mn-admission"
DURATION_S = 30
_POLL_S = 1.0


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _micro(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def expired(lease: dict[str, Any], now: dt.datetime) -> bool:
    spec = lease.get("spec") or {}
    renewed = spec.get("renewTime") or spec.get("acquireTime")
    if not renewed:
        return True
    when = dt.datetime.fromisoformat(renewed.replace("Z", "+00:00"))
    return when + dt.timedelta(seconds=spec.get("leaseDurationSeconds") or DURATION_S) < now


class AdmissionLease:
    """Acquire, renew in the background, release. ``api``: ``CoordinationV1Api``."""

    def __init__(self, api: Any, namespace: str, holder: str, labels: dict[str, str]) -> None:
        self.api, self.namespace, self.holder, self.labels = api, namespace, holder, labels
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def acquire(self, deadline: float, waiting: Callable[[str], None]) -> None:
        """Block until held (``waiting(holder)`` while another gang holds it); raise at deadline."""
        from kubernetes.client import ApiException

        seen = None
        while True:
            try:
                self.api.create_namespaced_lease(self.namespace, self._body())
                break
            except ApiException as exc:
                if exc.status != 409:
                    raise
            current = self._read()
            if current is None:
                continue
            holder = (current.get("spec") or {}).get("holderIdentity", "")
            if holder == self.holder:
                break
            if expired(current, _now()):
                self._delete(current["metadata"].get("uid"))
                continue
            if holder != seen:
                seen = holder
                waiting(holder)
            if time.monotonic() >= deadline:
                raise SchedulingError(
                    f"another gang ({holder}) was still coming up in namespace "
                    f"{self.namespace}; gave up waiting for the admission Lease"
                )
            time.sleep(_POLL_S)
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew, daemon=True, name="jupyter-mn-lease")
        self._renewer.start()

    def release(self) -> None:
        """Give the Lease back (only if still ours). Safe to call twice."""
        if self._renewer is None:
            return
        self._stop.set()
        self._renewer.join()
        self._renewer = None
        current = self._read()
        if current is not None and (current.get("spec") or {}).get("holderIdentity") == self.holder:
            self._delete(current["metadata"].get("uid"))

    def _body(self) -> dict[str, Any]:
        now = _micro(_now())
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": NAME, "namespace": self.namespace, "labels": self.labels},
            "spec": {
                "holderIdentity": self.holder,
                "leaseDurationSeconds": DURATION_S,
                "acquireTime": now,
                "renewTime": now,
            },
        }

    def _read(self) -> dict[str, Any] | None:
        from kubernetes.client import ApiException

        try:
            return self.api.api_client.sanitize_for_serialization(
                self.api.read_namespaced_lease(NAME, self.namespace)
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _delete(self, uid: str | None) -> None:
        from kubernetes.client import ApiException

        body = {"preconditions": {"uid": uid}} if uid else None
        try:
            self.api.delete_namespaced_lease(NAME, self.namespace, body=body)
        except ApiException as exc:
            if exc.status not in (404, 409):  # gone, or someone else took it over
                raise

    def _renew(self) -> None:
        from kubernetes.client import ApiException

        while not self._stop.wait(DURATION_S / 3):
            try:
                self.api.patch_namespaced_lease(
                    NAME, self.namespace, {"spec": {"renewTime": _micro(_now())}}
                )
            except ApiException:  # lost it; the gang coming up no longer needs it to finish
                return
