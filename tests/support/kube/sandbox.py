"""A pod's process in namespaces of its own, as a container runtime gives it: a mount
namespace where each projected volume is bind-mounted at its fixed ``mountPath`` (the
ServiceAccount's token, ``ca.crt`` and ``namespace`` at
``/var/run/secrets/kubernetes.io/serviceaccount``, where the official client's
``load_incluster_config`` reads them), and a UTS namespace whose hostname is the pod's, so
``socket.gethostname()`` names the pod as in a real container.

A mount point the machine lacks is made inside an overlay of its nearest existing ancestor
(upper layer in the pod's directory), so nothing is written outside the pod's directory and the
machine's own files stay visible. Needs root (``unshare -m``); without it ``usable()`` is false
and the kubelet runs the pod without these mounts.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

_SCRIPT = """set -e
while [ "$#" -gt 0 ] && [ "$1" != -- ]; do
  case "$1" in
    overlay) mount -t overlay overlay -o "lowerdir=$2,upperdir=$3,workdir=$4" "$2"; shift 4 ;;
    bind) mkdir -p "$3"; mount --bind "$2" "$3"; shift 3 ;;
  esac
done
shift
hostname "$JMN_POD_HOSTNAME"
unset JMN_POD_HOSTNAME
exec "$@"
"""


def usable() -> bool:
    return os.geteuid() == 0 and shutil.which("unshare") is not None


def wrap(command: list[str], mounts: dict[str, Path], workdir: Path) -> list[str]:
    """``command`` run with each directory of ``mounts`` (mount path → directory) at its mount
    path; the hostname comes from ``JMN_POD_HOSTNAME`` in the process's environment."""
    steps: list[str] = []
    overlaid: set[str] = set()
    for target, source in mounts.items():
        real = Path(os.path.realpath(target))
        base = next(p for p in (real, *real.parents) if p.exists())
        if base != real and str(base) not in overlaid:  # a mount point made in an overlay
            overlaid.add(str(base))
            layer = workdir / "overlay" / str(len(overlaid))
            (layer / "upper").mkdir(parents=True)
            (layer / "work").mkdir()
            steps += ["overlay", str(base), str(layer / "upper"), str(layer / "work")]
        steps += ["bind", str(source), str(real)]
    unshare = ["unshare", "--mount", "--uts", "--propagation", "private"]
    return [*unshare, "sh", "-c", _SCRIPT, "sandbox", *steps, "--", *command]
