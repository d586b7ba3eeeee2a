"""A cold cell's view shows SCHEDULING before its backend imports its libraries (dask,
distributed, the Kubernetes client: seconds of a kernel's first cell), on every backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

#: A fresh kernel's first cell, stopped where its view gets its first event: what was imported
#: by then. The view ends the process there, before anything is provisioned.
FIRST_CELL = """
import json, os, sys
from jupyter_mn import Cluster
from jupyter_mn.model.kubespec import KubeOptions

OPTIONS = {
    "local": {},
    "dask": {"scheduler": "tls://127.0.0.1:9"},
    "kubernetes": {"kubernetes": KubeOptions(image="registry.example/agent:1")},
    "slurm": {},
}

def view(event):
    heavy = sorted(m for m in ("dask", "distributed", "kubernetes", "tornado") if m in sys.modules)
    print(json.dumps([type(event).__name__, str(getattr(event, "state", "")), heavy]), flush=True)
    os._exit(0)

backend = sys.argv[1]
Cluster(nodes=1, gpus=1, backend=backend, **OPTIONS[backend]).run("1", on_event=view)
"""


@pytest.mark.parametrize("backend", ["local", "dask", "kubernetes", "slurm"])
def test_a_cold_cell_shows_scheduling_before_its_backend_imports_dask(backend):
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    proc = subprocess.run(
        [sys.executable, "-c", FIRST_CELL, backend],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    first = json.loads(proc.stdout.splitlines()[-1])
    assert first == ["GangState", "SCHEDULING", []]
