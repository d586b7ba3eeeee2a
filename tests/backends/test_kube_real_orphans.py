"""A test run killed outright (SIGKILL: no ``finally`` runs) leaves no control plane behind:
each component dies with the process that started it (``tests/support/kube/processes.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.backends.test_kube_real import _binaries
from tests.support.procs import wait_gone

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
#: A test process: it starts a control plane, says its components' pids, then waits to be killed.
STARTER = """
import sys
from pathlib import Path
from tests.support.kube import real
plane = real.ControlPlane(Path(sys.argv[1]), nodes={}, with_kueue=False, bin_dir=Path(sys.argv[2]))
plane.start()
print(" ".join(str(p.popen.pid) for p in plane.procs), flush=True)
sys.stdin.read()
"""


def test_a_killed_test_process_takes_its_control_plane_with_it(tmp_path):
    bins = _binaries()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(tmp_path), str(bins)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    components: list[psutil.Process] = []
    try:
        assert starter.stdout is not None
        pids = starter.stdout.readline().split()  # once up: the start's own deadline bounds it
        components = [psutil.Process(int(pid)) for pid in pids]
        assert {"etcd", "kube-apiserver"} <= {c.name() for c in components}
        starter.kill()
        starter.wait()
        assert not wait_gone(components, 30)
    finally:
        starter.kill()
        starter.wait()
        for component in components:  # this test's own, by pid: nothing left whatever failed
            if component.is_running():
                component.kill()
