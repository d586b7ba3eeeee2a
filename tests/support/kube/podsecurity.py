"""The Pod Security Standards ("baseline", "restricted") as a checker of pod specs.

What the API server's PodSecurity admission enforces on a namespace labelled
``pod-security.kubernetes.io/enforce``, written from the standard's control tables
(kubernetes.io/docs/concepts/security/pod-security-standards, Kubernetes 1.28–1.37): each rule
names the field it restricts and the values it allows. ``violations`` returns one line per
broken rule, so a test shows exactly what a cluster would refuse.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

LEVELS = ("baseline", "restricted")
#: Baseline: capabilities a container may add (the container runtimes' default set).
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
RESTRICTED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
SELINUX_TYPES = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
#: Restricted: the only volume types (core ones, or storage through PersistentVolumes).
RESTRICTED_VOLUMES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
_APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
_HANDLERS = ("livenessProbe", "readinessProbe", "startupProbe")


def violations(
    pod: dict[str, Any], level: str, allow_capabilities: tuple[str, ...] = ()
) -> list[str]:
    """Every rule of ``level`` that ``pod`` (a Pod or a pod template) breaks.

    ``allow_capabilities``: capabilities the namespace's policy exempts beyond the level's list
    (e.g. ``IPC_LOCK`` for RDMA pods under "baseline").
    """
    if level not in LEVELS:
        raise ValueError(f"unknown level {level!r}")
    found = list(_baseline(pod, frozenset(allow_capabilities)))
    if level == "restricted":
        found += _restricted(pod, frozenset(allow_capabilities))
    return found


def _containers(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for kind in ("containers", "initContainers", "ephemeralContainers"):
        for c in spec.get(kind) or []:
            yield f"{kind}[{c.get('name')}]", c


def _baseline(pod: dict[str, Any], extra: frozenset[str]) -> Iterator[str]:
    meta, spec = pod.get("metadata") or {}, pod["spec"]
    pod_sc = spec.get("securityContext") or {}
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            yield f"host namespaces: spec.{field} must be false"
    contexts = [("spec.securityContext", pod_sc)] + [
        (f"{where}.securityContext", c.get("securityContext") or {})
        for where, c in _containers(spec)
    ]
    for where, sc in contexts:
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            yield f"HostProcess: {where}.windowsOptions.hostProcess must be false"
        if sc.get("privileged"):
            yield f"privileged: {where}.privileged must be false"
        if (sc.get("appArmorProfile") or {}).get("type") not in (
            None,
            "RuntimeDefault",
            "Localhost",
        ):
            yield f"AppArmor: {where}.appArmorProfile.type must be RuntimeDefault or Localhost"
        selinux = sc.get("seLinuxOptions") or {}
        if (
            selinux.get("type", "") not in SELINUX_TYPES
            or selinux.get("user")
            or selinux.get("role")
        ):
            yield f"SELinux: {where}.seLinuxOptions must not set a custom user, role or type"
        if sc.get("procMount", "Default") != "Default":
            yield f"/proc mount: {where}.procMount must be Default"
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            yield f"seccomp: {where}.seccompProfile.type must not be Unconfined"
        added = set((sc.get("capabilities") or {}).get("add") or []) - BASELINE_CAPABILITIES - extra
        if added:
            yield f"capabilities: {where}.capabilities.add has {sorted(added)}"
    for sysctl in pod_sc.get("sysctls") or []:
        if sysctl["name"] not in SAFE_SYSCTLS:
            yield f"sysctls: {sysctl['name']} is not in the safe set"
    for volume in spec.get("volumes") or []:
        if "hostPath" in volume:
            yield f"HostPath volumes: volume {volume['name']} is a hostPath"
    for where, c in _containers(spec):
        for port in c.get("ports") or []:
            if port.get("hostPort"):
                yield f"host ports: {where} port {port.get('containerPort')} has hostPort"
        handlers = [c.get(h) or {} for h in _HANDLERS]
        handlers += list((c.get("lifecycle") or {}).values())
        for handler in handlers:
            for action in ("httpGet", "tcpSocket"):
                if (handler.get(action) or {}).get("host"):
                    yield f"probe/lifecycle host: {where} {action}.host must be unset"
    for key, value in (meta.get("annotations") or {}).items():
        if key.startswith(_APPARMOR_ANNOTATION) and not (
            value == "runtime/default" or value.startswith("localhost/")
        ):
            yield f"AppArmor: annotation {key}={value}"


def _restricted(pod: dict[str, Any], extra: frozenset[str]) -> Iterator[str]:
    spec = pod["spec"]
    pod_sc = spec.get("securityContext") or {}
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            yield f"volume types: volume {volume['name']} is {sorted(kinds)}"
    if pod_sc.get("runAsUser") == 0:
        yield "running as non-root user: spec.securityContext.runAsUser must not be 0"
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    if pod_seccomp not in (None, "RuntimeDefault", "Localhost"):
        yield "seccomp: spec.securityContext.seccompProfile must be RuntimeDefault or Localhost"
    for where, c in _containers(spec):
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            yield f"privilege escalation: {where} must set allowPrivilegeEscalation false"
        non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
        if non_root is not True:
            yield f"running as non-root: {where} must have runAsNonRoot true (pod or container)"
        if sc.get("runAsUser") == 0:
            yield f"running as non-root user: {where}.securityContext.runAsUser must not be 0"
        seccomp = (sc.get("seccompProfile") or {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            yield f"seccomp: {where} must use the RuntimeDefault or a Localhost profile"
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            yield f"capabilities: {where}.securityContext.capabilities.drop must include ALL"
        added = set(caps.get("add") or []) - RESTRICTED_CAPABILITIES - extra
        if added:
            yield f"capabilities: {where} may add only NET_BIND_SERVICE, not {sorted(added)}"
