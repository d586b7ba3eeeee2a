"""GPU-hours on real gangs: a 2×2 local gang's count against the time its nodes were held, the
count in the registry, ``jupyter mn list`` and ``jupyter mn usage``, and ``--max-gpu-hours``
ending a gang at its cap."""

from __future__ import annotations

import time

import pytest

from jupyter_mn import Cluster
from jupyter_mn.cli import main
from jupyter_mn.errors import CellInterrupted
from jupyter_mn.gang.local import LocalProvisioner
from jupyter_mn.jobs.registry import JobModel, Registry
from tests.gang.test_faults import error_of
from tests.support.polling import wait_until


def _closed(registry: Registry, gang_id: str) -> JobModel:
    return wait_until(
        lambda: (job := registry.job(gang_id)).state == "CLOSED" and job, 20, "the job CLOSED"
    )


@pytest.fixture
def held(monkeypatch) -> dict[str, float]:
    """When the local backend handed its nodes over and when it had them back, on a clock of
    the test's own."""
    times: dict[str, float] = {}
    provision, release = LocalProvisioner.provision, LocalProvisioner.release

    def timed_provision(self, *args):
        nodes = provision(self, *args)
        times["up"] = time.monotonic()
        return nodes

    def timed_release(self):
        release(self)
        times.setdefault("down", time.monotonic())

    monkeypatch.setattr(LocalProvisioner, "provision", timed_provision)
    monkeypatch.setattr(LocalProvisioner, "release", timed_release)
    return times


def test_a_2x2_gang_counts_four_ranks_times_the_seconds_its_nodes_were_held(
    no_leftovers, registry, held, capsys
):
    cluster = Cluster(nodes=2, gpus=2, name="gpu-hours-2x2")
    try:
        gang = cluster.up()
        result = cluster.run("import time\ntime.sleep(8)")
        assert result.ok, result.unwrap()
        assert cluster.status()["unit"] == "rank-hours"  # CPU ranks, labelled so
    finally:
        cluster.close()
    wall = held["down"] - held["up"]
    assert gang.core.usage.hours() == pytest.approx(4 * wall / 3600, rel=0.02)
    job = _closed(registry, gang.core.id)
    assert job.unit == "rank-hours"
    assert job.gpu_hours == pytest.approx(4 * wall / 3600, rel=0.02)
    assert job.last_cell["hours"] == pytest.approx(4 * result.elapsed / 3600, rel=0.02)
    assert job.last_cell["hours"] < job.gpu_hours  # the gang was held before and after its cell

    capsys.readouterr()
    assert main(["list"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if gang.core.id in line)
    assert job.usage.endswith(" rank-hours") and job.usage in row
    assert main(["usage", "--since", "1h"]) == 0
    out = capsys.readouterr().out
    assert "by notebook:" in out and "by job:" in out
    line = next(line for line in out.splitlines() if gang.core.id in line)
    assert "gpu-hours-2x2" in line and job.usage in line


@pytest.mark.slow
def test_max_gpu_hours_ends_a_running_gang_at_its_cap(no_leftovers, registry):
    cap = 0.02  # 4 CPU ranks: 18 s from the nodes being up
    cluster = Cluster(nodes=2, gpus=2, max_gpu_hours=cap)
    try:
        gang = cluster.up()
        result = cluster.run("import time\ntime.sleep(120)")
        error = error_of(result)
        assert isinstance(error, CellInterrupted)
        reason = "--max-gpu-hours reached (0.02 rank-hours: 4 × 18 s)"
        assert str(error).startswith(reason)
        assert f"the gang was torn down: {reason}" in error.notes
        status = cluster.status()
        assert (status["state"], status["detail"]) == ("RELEASED", f"torn down: {reason}")
    finally:
        cluster.close()
    job = _closed(registry, gang.core.id)
    # stopped at the cap: the cell's stop and the teardown add seconds, never another cap's worth
    assert cap <= job.gpu_hours < 2 * cap, job.gpu_hours
