"""Cancelling a detached run in a driver pod, on the real control plane, side by side with the
way it was cancelled before: a foreground delete of its Job, waited out (``kubectl delete job
--cascade=foreground --wait``, which is what ``jupyter mn cancel`` did).

Each round submits the same notebook twice with ``jupyter mn submit --backend kubernetes`` (a
cell of a 2 × 1 gang printing a step every 0.2 s), waits for its steps in the driver's log, then
stops one run each way and times:

* answer: from the command's start until it returns (the user's wait);
* nothing left: until no Job, pod or Secret of the run, nor any object of its gang, exists.

Run: ``.venv/bin/python -m bench.cancel [--rounds 5]`` (root: the test kubelet mounts the
driver's ServiceAccount in a mount namespace of its own; about a minute to start the plane, a
minute a run on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import nbformat

from jupyter_mn.gang.kubernetes.manifests import MANAGED_BY, MANAGER
from jupyter_mn.jobs.kuberun import name_of
from jupyter_mn.node.ports import is_free, listen_port
from tests.support.kube import real
from tests.support.kube.accounts import DOCUMENTED_ROLE, service_account_kubeconfig
from tests.support.polling import wait_until
from tests.support.runs import JUPYTER_MN

LOOP = "import time\nfor i in range(10_000):\n    print('step', i, flush=True)\n    time.sleep(0.2)"
#: The same loop, slow to stop: interrupted, it holds on for ``{}`` seconds (a checkpoint's
#: save, a cleanup), as a driver whose graceful end is slow does.
SLOW_LOOP = (
    "try:\n"
    + "".join(f"    {line}\n" for line in LOOP.splitlines())
    + ("except KeyboardInterrupt:\n    time.sleep({})\n    raise")
)
#: A run's start: a kernel in its pod, then a gang of two ranks that import torch.
RUN_S = 300


def _port() -> int:
    while True:  # the pods' processes share this machine's ports; pod 0 also takes port + 1
        port = listen_port("127.0.0.1")
        if is_free("127.0.0.1", port + 1):
            return port


def _mn(*args: str) -> str:
    return subprocess.run(
        [*JUPYTER_MN, *args], capture_output=True, text=True, check=True, timeout=RUN_S
    ).stdout


def _left(control: real.ControlPlane, job_id: str) -> list[str]:
    """What of the run, and of any gang, still exists, as the admin sees it."""
    found = []
    for selector in (f"jupyter-mn.io/run%3D{job_id}", f"{MANAGED_BY}%3D{MANAGER}"):
        for path in ("/apis/batch/v1/namespaces/default/jobs", "/api/v1/namespaces/default/pods"):
            found += control.rest.get(f"{path}?labelSelector={selector}")["items"]
    secret = f"/api/v1/namespaces/default/secrets?fieldSelector=metadata.name%3D{name_of(job_id)}"
    return [i["metadata"]["name"] for i in found + control.rest.get(secret)["items"]]


def _running(folder: Path, flags: list[str], hold: float) -> str:
    """A submitted run whose gang prints its steps (holding on ``hold`` seconds once
    interrupted): its id."""
    notebook = folder / f"long-{time.monotonic_ns()}.ipynb"
    body = SLOW_LOOP.format(hold) if hold else LOOP
    cell = f"%%cluster --nodes 2 --gpus 1 --gang none --dask-port {_port()}\n{body}"
    cells = [nbformat.v4.new_code_cell(c) for c in ("print('first')", cell)]
    nbformat.write(nbformat.v4.new_notebook(cells=cells), notebook)
    job_id = _mn("submit", str(notebook), *flags).strip()
    wait_until(lambda: "step 2" in _mn("logs", job_id), RUN_S, f"{job_id}'s steps")
    return job_id


def _timed(
    control: real.ControlPlane, job_id: str, stop: Callable[[], None]
) -> tuple[float, float]:
    start = time.perf_counter()
    stop()
    answer = time.perf_counter() - start
    wait_until(lambda: not _left(control, job_id), RUN_S, f"nothing of {job_id} left")
    return answer, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--slow-stop", type=float, default=0.0, help="seconds the cell holds on once interrupted"
    )
    args = parser.parse_args()
    bins = real.binaries()
    with (
        tempfile.TemporaryDirectory() as tmp,
        real.ControlPlane(
            Path(tmp), nodes={"node-a": 2, "node-b": 2}, with_kueue=False, bin_dir=bins
        ) as control,
    ):
        os.environ["JUPYTER_RUNTIME_DIR"] = str(Path(tmp) / "runtime")  # a registry of its own
        os.environ["KUBECONFIG"] = str(control.kubeconfig)
        os.environ.pop("KUBERNETES_SERVICE_HOST", None)
        service_account_kubeconfig(control, "driver", DOCUMENTED_ROLE)
        flags = ["--backend", "kubernetes", "--image", "agent:1", "--service-account", "driver"]
        kubectl = [str(bins / f"kubernetes-{real.KUBERNETES}" / "kubectl")]
        kubectl += ["--kubeconfig", str(control.kubeconfig), "-n", "default"]
        rows: dict[str, list[tuple[float, float]]] = {"cancel": [], "foreground": []}
        for _ in range(args.rounds):
            job_id = _running(Path(tmp), flags, args.slow_stop)
            rows["cancel"].append(_timed(control, job_id, lambda j=job_id: _mn("cancel", j)))
            job_id = _running(Path(tmp), flags, args.slow_stop)
            delete = [*kubectl, "delete", "job", name_of(job_id), "--cascade=foreground"]
            rows["foreground"].append(
                _timed(control, job_id, lambda d=delete: subprocess.run(d, check=True))
            )
    held = f"a cell holding on {args.slow_stop:g} s once interrupted"
    print(f"{args.rounds} rounds, {held}; medians (s)")
    print(f"{'':32} {'answer':>8} {'nothing left':>13}")
    for name, label in (
        ("cancel", "jupyter mn cancel"),
        ("foreground", "foreground delete, waited"),
    ):
        answer = statistics.median(a for a, _ in rows[name])
        left = statistics.median(b for _, b in rows[name])
        print(f"{label:32} {answer:8.2f} {left:13.2f}")
    ratio = statistics.median(
        a / b for (a, _), (b, _) in zip(rows["cancel"], rows["foreground"], strict=True)
    )
    print(f"answer, cancel / foreground: {ratio:.2f}x (median of the rounds' ratios)")


if __name__ == "__main__":
    main()
