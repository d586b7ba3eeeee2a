"""A test-only kubelet: runs each bound pod's container command as a local process.

What a node would provide, emulated on one machine: every pod gets its own IP, on the loopback
network (127.x.y.z, all routed locally) or, given test hosts (``hosts.py``), as pod networking
gives it: a network namespace of its own with an address on a bridge and the pod's hostname; its
environment as written in the manifest with the
downward API and ``secretKeyRef`` resolved (``status.podIP``, ``metadata.annotations['…']``, a
Secret's key), its Secret volumes
as files in a per-pod directory (environment values that name a mount path are pointed at that
directory), projected volumes (the ServiceAccount's token, ``ca.crt`` and ``namespace``, given
a ``project`` source) bind-mounted at their mount path in a mount namespace of the pod's own
(``sandbox.py``), cluster DNS for ``<hostname>.<subdomain>`` names (a
hosts table the pod processes read through ``dns/sitecustomize.py``), the readiness probe
(TCP), and the pod lifecycle: Running → Ready → Succeeded/Failed with the exit code; a deleted
pod's process is stopped with SIGTERM, then SIGKILL after its ``terminationGracePeriodSeconds``;
the pod's environment has the API service's variables, as a kubelet sets them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from tests.support.hosts import Host, HostNet
from tests.support.kube import sandbox
from tests.support.kube.control import Api, condition, container_status, now

DNS_DIR = Path(__file__).with_name("dns")
_FIELD = re.compile(r"^metadata\.(annotations|labels)\['(?P<key>[^']+)'\]$")


#: Reads a Secret: (namespace, name) → the object.
SecretSource = Callable[[str, str], Awaitable[dict[str, Any]]]
#: A projected volume's files for a pod: (pod, the volume's ``projected``) → file name → bytes.
ProjectSource = Callable[[dict[str, Any], dict[str, Any]], Awaitable[dict[str, bytes]]]


def _secret_names(pod: dict[str, Any]) -> set[str]:
    """The Secrets a pod's volumes and environment name (read before it starts, as a kubelet
    does: a missing one keeps the pod from starting)."""
    spec = pod["spec"]
    names = {v["secret"]["secretName"] for v in spec.get("volumes") or [] if "secret" in v}
    for item in spec["containers"][0].get("env") or []:
        ref = (item.get("valueFrom") or {}).get("secretKeyRef")
        if ref:
            names.add(ref["name"])
    return names


def _value_from(
    pod: dict[str, Any], source: dict[str, Any], secrets: dict[str, dict[str, Any]]
) -> str:
    if "secretKeyRef" in source:
        ref = source["secretKeyRef"]
        return base64.b64decode(secrets[ref["name"]]["data"][ref["key"]]).decode()
    path = source["fieldRef"]["fieldPath"]
    found = _FIELD.match(path)
    if found:
        return pod["metadata"][found.group(1)][found["key"]]
    if path == "status.podIP":
        return pod["status"]["podIP"]
    section, _, key = path.partition(".")
    return pod[section][key]


class ClusterDns:
    """Cluster DNS for pods: ``<hostname>.<subdomain>[.<ns>.svc[.cluster.local]]`` → pod IP,
    in one file that every pod process reads (``dns/sitecustomize.py``). One per cluster: the
    kubelets of all its nodes write it, so a pod finds pods on other nodes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.names: dict[str, str] = {}
        self.write()

    def write(self) -> None:
        self.path.write_text(json.dumps(self.names))


class ProcessKubelet:
    def __init__(
        self,
        secret: SecretSource,
        root: Path,
        net: HostNet | None = None,
        hidden: Sequence[str] = (),
        dns: ClusterDns | None = None,
        project: ProjectSource | None = None,
        service: tuple[str, str] = ("10.96.0.1", "443"),
    ) -> None:
        """``secret(namespace, name)`` reads a Secret as the pod's node may (the emulator's
        store, or the real API server with the node's own credentials); ``dns``: the names
        this kubelet's pods share with other nodes' pods (default: its own); ``project``: the
        files of a projected volume (none without it); ``service``: the API server's host and
        port, the ``kubernetes`` Service's endpoint that in-cluster clients reach."""
        self.secret, self.root, self.net = secret, root, net
        self.project, self.service = project, service
        #: directories a pod does not see (on test hosts): its filesystem is not the kernel's
        self.hidden = tuple(hidden)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        #: each pod's terminationGracePeriodSeconds: SIGTERM, then SIGKILL that much later
        self.graces: dict[str, float] = {}
        #: each pod's host, with test hosts
        self.pod_hosts: dict[str, Host] = {}
        self.dns = dns or ClusterDns(root / "hosts.json")
        net = (random.randrange(1, 250), random.randrange(1, 250))
        self._ips = (f"127.{net[0]}.{net[1]}.{i}" for i in range(2, 250))
        self._ready: set[str] = set()
        self._exited: set[str] = set()

    async def sync(self, pod: dict[str, Any], api: Api) -> None:
        name = pod["metadata"]["name"]
        if name not in self.procs:
            await self._start(pod, api)
            return
        proc = self.procs[name]
        code = proc.poll()
        if code is not None and name not in self._exited:
            self._exited.add(name)
            await self._report_exit(pod, api, code)
        elif code is None and name not in self._ready and await self._probe(pod):
            self._ready.add(name)
            status = {"conditions": [condition("PodScheduled", True), condition("Ready", True)]}
            await api.patch("pods", pod, {"status": status}, status=True)

    async def _start(self, pod: dict[str, Any], api: Api) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        container = spec["containers"][0]
        name = meta["name"]
        command = container["command"] + container.get("args", [])
        if self.net is None:
            ip = next(self._ips)
        else:
            host = await asyncio.to_thread(self.net.add, spec.get("hostname") or name)
            self.pod_hosts[name] = host
            ip, command = host.ip, host.command(command, hidden=self.hidden)
        pod = {**pod, "status": {**(pod.get("status") or {}), "podIP": ip}}
        secrets = {n: await self.secret(meta["namespace"], n) for n in _secret_names(pod)}
        projected = {
            v["name"]: await self.project(pod, v["projected"])
            for v in spec.get("volumes") or []
            if "projected" in v and self.project is not None
        }
        workdir = self.root / name
        workdir.mkdir()
        mounts = self._volumes(pod, workdir, secrets, projected)
        env = self._env(pod, container, mounts, secrets)
        bound = {
            m["mountPath"]: Path(mounts[m["mountPath"]])
            for m in container.get("volumeMounts") or []
            if m["name"] in projected
        }
        if bound and sandbox.usable():
            command = sandbox.wrap(command, bound, workdir)
            env["JMN_POD_HOSTNAME"] = env["HOSTNAME"]
        if spec.get("hostname") and spec.get("subdomain"):
            short = f"{spec['hostname']}.{spec['subdomain']}"
            for host in (
                short,
                f"{short}.{meta['namespace']}.svc",
                f"{short}.{meta['namespace']}.svc.cluster.local",
            ):
                self.dns.names[host] = ip
            self.dns.write()
        log = (workdir / "container.log").open("wb")
        self.graces[name] = spec.get("terminationGracePeriodSeconds", 30)
        self.procs[name] = subprocess.Popen(
            command,
            env=env,
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        status = {
            "phase": "Running",
            "podIP": ip,
            "startTime": now(),
            "conditions": [condition("PodScheduled", True), condition("Ready", False)],
            "containerStatuses": [
                container_status(container, {"running": {"startedAt": now()}}, False)
            ],
        }
        await api.patch("pods", pod, {"status": status}, status=True)

    def _volumes(
        self,
        pod: dict[str, Any],
        workdir: Path,
        secrets: dict[str, dict[str, Any]],
        projected: dict[str, dict[str, bytes]],
    ) -> dict[str, str]:
        """Materialize Secret, projected and emptyDir volumes; return mount path → directory."""
        by_name = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        mounts: dict[str, str] = {}
        for mount in pod["spec"]["containers"][0].get("volumeMounts") or []:
            volume = by_name[mount["name"]]
            target = workdir / "volumes" / mount["name"]
            target.mkdir(parents=True)
            if "secret" in volume:
                secret = secrets[volume["secret"]["secretName"]]
                for key, value in (secret.get("data") or {}).items():
                    (target / key).write_bytes(base64.b64decode(value))
            for key, data in projected.get(mount["name"], {}).items():
                (target / key).write_bytes(data)
            mounts[mount["mountPath"]] = str(target)
        return mounts

    def _env(
        self,
        pod: dict[str, Any],
        container: dict[str, Any],
        mounts: dict[str, str],
        secrets: dict[str, dict[str, Any]],
    ) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"  # the image's python
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(DNS_DIR), env.get("PYTHONPATH")]))
        env["JUPYTER_MN_TEST_HOSTS"] = str(self.dns.path)
        env["HOSTNAME"] = pod["spec"].get("hostname") or pod["metadata"]["name"]
        if self.hidden:  # the container's own filesystem keeps its cache (not the machine's home)
            env["JUPYTER_MN_FILE_CACHE"] = str(self.root / pod["metadata"]["name"] / "files")
        env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"] = self.service
        for item in container.get("env") or []:
            value = (
                item["value"] if "value" in item else _value_from(pod, item["valueFrom"], secrets)
            )
            env[item["name"]] = mounts.get(value, value)
        return env

    def log_of(self, name: str) -> tuple[Path | None, bool]:
        """The pod's container log and whether its process runs (``pods/log``)."""
        proc = self.procs.get(name)
        if proc is None:
            return None, False
        return self.root / name / "container.log", proc.poll() is None

    async def _probe(self, pod: dict[str, Any]) -> bool:
        container = pod["spec"]["containers"][0]
        probe = (container.get("readinessProbe") or {}).get("tcpSocket")
        if probe is None:
            return True
        port = probe["port"]
        if isinstance(port, str):
            port = next(p["containerPort"] for p in container["ports"] if p.get("name") == port)
        try:
            _, writer = await asyncio.open_connection(pod["status"]["podIP"], port)
        except OSError:
            return False
        writer.close()
        return True

    async def _report_exit(self, pod: dict[str, Any], api: Api, code: int) -> None:
        container = pod["spec"]["containers"][0]
        terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "finishedAt": now(),
        }
        status = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "conditions": [condition("PodScheduled", True), condition("Ready", False)],
            "containerStatuses": [container_status(container, {"terminated": terminated}, False)],
        }
        await api.patch("pods", pod, {"status": status}, status=True)

    async def reap(self, live: set[str]) -> None:
        for name in set(self.procs) - live:
            grace = self.graces.pop(name, 30)
            await asyncio.to_thread(self._stop, self.procs.pop(name), grace)
            await asyncio.to_thread(self._unplug, name)

    def _unplug(self, name: str) -> None:
        """A deleted pod's host goes with it (and whatever its process left running there)."""
        host = self.pod_hosts.pop(name, None)
        if host is not None and self.net is not None:
            self.net.remove(host)

    def _stop(self, proc: subprocess.Popen[bytes], grace: float = 30.0) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def shutdown(self) -> None:
        for name in list(self.procs):
            self._stop(self.procs.pop(name), grace=5.0)
            self._unplug(name)
