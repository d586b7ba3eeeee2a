"""One run protocol for every job on a warm gang: Cancel (a registry request, as the panel and
``jupyter mn cancel`` send it) and ``--max-runtime`` stop a script, a node command and the doctor
as they stop a cell (docs/architecture.md, "The run protocol")."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_mn import Cluster
from jupyter_mn.doctor import doctor
from jupyter_mn.errors import Stopped
from jupyter_mn.gang.script import run_script
from jupyter_mn.gang.shell import run_on_nodes
from jupyter_mn.jobs.registry import JobModel, Registry
from tests.support.polling import wait_until
from tests.support.procs import ours, started_now, wait_gone

#: The probe of the doctor waits for this file (named in the ranks' env) before it goes on, so
#: the test knows it is cancelling a doctor that is still running.
SLOW_PROBE = """
import os, sys, time
gate = os.environ.get("JMN_TEST_PROBE_GATE")
if gate and len(sys.argv) > 1 and '"reach_timeout"' in sys.argv[1]:
    deadline = time.monotonic() + 60
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)
"""


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("slow-probe")
    (site / "sitecustomize.py").write_text(SLOW_PROBE)
    return site


@pytest.fixture(scope="module")
def cluster(gate: Path) -> Iterator[Cluster]:
    started = started_now()
    env = {"PYTHONPATH": str(gate), "JMN_TEST_PROBE_GATE": str(gate / "open")}
    c = Cluster(nodes=2, gpus=1, env=env)
    c.up()
    yield c
    c.close()
    assert not wait_gone(ours(started))


def _job(registry: Registry, cluster: Cluster) -> JobModel:
    return next(j for j in registry.jobs() if j.gang == cluster.gang.core.id)


def _cancel_while_running(
    registry: Registry, cluster: Cluster, work: Callable[[], Any]
) -> tuple[Any, float]:
    """Start ``work`` on a thread, cancel it through the registry once the gang is RUNNING;
    its outcome (or exception) and how long it took."""
    outcome: list[Any] = []

    def go() -> None:
        try:
            outcome.append(work())
        except Exception as exc:
            outcome.append(exc)

    started = time.monotonic()
    runner = threading.Thread(target=go)
    runner.start()
    wait_until(lambda: _job(registry, cluster).state == "RUNNING", 30, "the job RUNNING")
    request = registry.request(_job(registry, cluster).id, "cancel", "cli")
    assert wait_until(lambda: registry.outcome(request), 10, "answer") == (
        "cancelling the running cell"
    )
    runner.join(40)
    assert not runner.is_alive(), "the cancelled job went on"
    return outcome[0], time.monotonic() - started


def test_cancel_stops_a_script_on_the_warm_gang(registry, cluster, tmp_path):
    script = tmp_path / "slow.py"
    script.write_text("import time\nprint('started', flush=True)\ntime.sleep(60)\n")

    def work() -> Any:
        with cluster.nodes() as gang:
            return run_script(gang, str(script), [], None)

    result, took = _cancel_while_running(registry, cluster, work)
    assert took < 30
    assert "the script was stopped: cancelled from jupyter mn" in result.notes
    assert {r.status for r in result.ranks} == {"interrupted"}
    assert cluster.run("dist.get_world_size()").value == 2


def test_cancel_stops_a_node_command(registry, cluster):
    def work() -> Any:
        with cluster.nodes() as gang:
            return run_on_nodes(gang, "echo begun; sleep 60", [0, 1], 120)

    outputs, took = _cancel_while_running(registry, cluster, work)
    assert took < 30
    assert [o.status() for o in outputs] == ["stopped: cancelled from jupyter mn"] * 2
    assert all(o.output.startswith("begun") for o in outputs)
    assert cluster.status()["state"] == "READY"


def test_cancel_stops_the_doctor(registry, cluster, gate):
    error, took = _cancel_while_running(registry, cluster, lambda: doctor(cluster))
    (gate / "open").touch()  # let the abandoned probes end
    assert isinstance(error, Stopped)
    assert str(error) == "the doctor was stopped: cancelled from jupyter mn"
    assert took < 30
    assert cluster.run("dist.get_rank()").value == 0


def test_max_runtime_stops_a_node_command_and_tears_the_gang_down(no_leftovers):
    cluster = Cluster(nodes=1, gpus=1, max_runtime=6)
    try:
        cluster.up()
        started = time.monotonic()
        with cluster.nodes() as gang:
            (output,) = run_on_nodes(gang, "sleep 60", [0], 120)
        assert time.monotonic() - started < 20
        assert output.status() == "stopped: --max-runtime 6 s reached"
        status = cluster.status()
        assert (status["state"], status["detail"]) == (
            "RELEASED",
            "torn down: --max-runtime 6 s reached",
        )
    finally:
        cluster.close()
