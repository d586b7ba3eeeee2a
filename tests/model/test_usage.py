"""GPU-hours without processes: the meter on a fake clock, a registry row's count, the totals
of ``jupyter mn usage``, and a bad ``--max-gpu-hours`` or ``--since`` refused before anything
runs."""

from __future__ import annotations

import queue
import threading
import time

import psutil
import pytest
from IPython.core.error import UsageError as MagicUsageError
from IPython.core.interactiveshell import InteractiveShell

from jupyter_mn.cli import main
from jupyter_mn.errors import SpecError
from jupyter_mn.jobs.registry import Registry
from jupyter_mn.kernel import cluster
from jupyter_mn.kernel.lifetime import GangLifetime
from jupyter_mn.model import usage
from jupyter_mn.model.spec import ClusterSpec
from jupyter_mn.model.usage import Meter, UsageError, job_hours, parse_since, totals
from jupyter_mn.wire.events import HoursUnit
from tests.support.jobs import make_job


class FakeClock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_the_meter_counts_nodes_times_gpus_times_seconds_from_up_to_release():
    clock = FakeClock()
    meter = Meter(slots=4, clock=clock)
    clock.now += 50  # scheduling: the nodes are not ours yet
    assert meter.hours() == 0.0
    meter.up()
    clock.now += 900
    assert meter.hours() == pytest.approx(1.0)  # 4 × 15 min, still counting
    clock.now += 900
    meter.release()
    clock.now += 3600  # released: the count stands
    assert meter.hours() == pytest.approx(2.0)
    meter.started(gpu=True)
    assert meter.text() == "2.0 GPU-hours"
    meter.release()  # a second release does not move the end
    assert meter.seconds() == pytest.approx(1800)


def test_cpu_ranks_are_counted_as_rank_hours_from_the_gangs_start_on():
    clock = FakeClock()
    meter = Meter(slots=4, clock=clock)
    meter.up()
    clock.now += 9
    assert meter.text() == ""  # its ranks have not said yet: no unit, no text (not GPU-hours)
    meter.started(gpu=False)
    assert meter.text() == "0.01 rank-hours"
    meter.started(gpu=True)  # fixed at the start
    assert meter.text() == "0.01 rank-hours"


@pytest.mark.parametrize(
    ("hours", "text"),
    [(0, "0"), (3.11e-05, "< 0.01"), (0.00227, "< 0.01"), (0.0274, "0.03"), (0.996, "1.0"),
     (1.23, "1.2"), (9.96, "10"), (12.4, "12"), (1234.5, "1,234")],
)  # fmt: skip
def test_hours_read_as_a_person_writes_them_never_in_scientific_notation(hours, text):
    assert usage.number(hours) == text
    assert "e-" not in usage.text(hours, "rank-hours")  # the unit has none either


def test_a_registry_row_says_its_count_once_its_unit_is_known(registry: Registry):
    registry.save(make_job("jmn-usage-text", up=time.time() - 36, world_size=2))
    assert registry.job("jmn-usage-text").usage == ""  # its ranks have not said which unit
    registry.save(make_job("jmn-usage-text", up=time.time() - 36, world_size=2, unit="rank-hours"))
    assert registry.job("jmn-usage-text").usage == "0.02 rank-hours"


def test_a_gang_that_never_got_its_nodes_used_nothing():
    meter = Meter(slots=8, clock=FakeClock())
    meter.release()
    assert meter.hours() == 0.0


def test_a_registry_row_counts_to_its_end_or_while_live_to_now():
    now = time.time()
    live = make_job(up=now - 3600, world_size=2)
    assert job_hours(live, now) == pytest.approx(2.0)
    done = make_job(up=now - 3600, ended=now - 1800, world_size=2, state="CLOSED")
    assert job_hours(done, now + 10_000) == pytest.approx(1.0)
    assert job_hours(make_job(up=None), now) == 0.0


def test_a_live_job_read_from_the_registry_shows_its_count_so_far(registry: Registry):
    registry.save(make_job("jmn-usage-live", up=time.time() - 360, world_size=2, unit="GPU-hours"))
    job = registry.job("jmn-usage-live")
    assert job.gpu_hours == pytest.approx(0.2, rel=0.01)


def test_an_orphaned_job_counts_to_its_last_heartbeat_not_to_when_it_was_noticed(
    registry: Registry,
):
    beat = time.time() - 600
    registry.save(make_job("jmn-usage-orphan", up=beat - 3600, heartbeat=beat, pid=2**22 + 7))
    job = registry.job("jmn-usage-orphan")  # its pid is no process: orphaned when read
    assert job.state == "ORPHANED" and job.ended == pytest.approx(beat)
    assert job.gpu_hours == pytest.approx(2.0)


def test_totals_by_notebook_and_by_job_count_only_what_was_used_since():
    now = time.time()
    jobs = [
        make_job("a", up=now - 7200, ended=now - 3600, notebook="x.ipynb", unit="GPU-hours"),
        make_job("b", up=now - 3600, ended=now, notebook="x.ipynb", unit="GPU-hours"),
        make_job("c", up=now - 1800, ended=now, notebook="y.ipynb", unit="rank-hours"),
        make_job("d", up=None, notebook="y.ipynb"),  # never got its nodes
    ]
    for job in jobs:
        job.gpu_hours = job_hours(job, now)
    by_notebook = totals(jobs, lambda j: j.notebook or "", since=0)
    assert [(t.key, t.unit, t.jobs, round(t.hours, 6)) for t in by_notebook] == [
        ("x.ipynb", HoursUnit.GPU, 2, 4.0),
        ("y.ipynb", HoursUnit.RANK, 1, 1.0),
    ]
    recent = totals(jobs, lambda j: j.id, since=now - 1800)
    assert [(t.key, round(t.hours, 6)) for t in recent] == [("b", 1.0), ("c", 1.0)]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("7d", 7 * 86400), ("12h", 43200), ("30m", 1800), ("90s", 90), ("2w", 14 * 86400),
     ("1d12h", 129600), ("1.5h", 5400)],
)  # fmt: skip
def test_since_reads_a_span(text, seconds):
    assert parse_since(text) == seconds


@pytest.mark.parametrize("text", ["7x", "", "d", "-1d", "7 days", "1e3h", "7d;rm"])
def test_a_bad_since_is_a_one_line_error(text, capsys):
    with pytest.raises(UsageError, match="expected a span like 7d"):
        parse_since(text)
    assert main(["usage", f"--since={text}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jupyter mn usage: --since") and err.count("\n") == 1


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "max_gpu_hours must be a positive number of hours"),
        (-1, "max_gpu_hours must be a positive number of hours"),
        (float("nan"), "max_gpu_hours must be a positive number of hours"),
        (float("inf"), "max_gpu_hours must be a positive number of hours"),
        ("1", "max_gpu_hours must be a positive number of hours"),
        (1e6, r"max_gpu_hours 1e\+06 on 4 GPU\(s\) is 250000 h of wall time"),
    ],
)
def test_a_bad_max_gpu_hours_is_refused_before_anything_launches(value, message):
    with pytest.raises(SpecError, match=message):
        ClusterSpec(nodes=2, gpus=2, max_gpu_hours=value)


def test_the_cap_is_a_spec_field_a_kwarg_and_an_environment_variable(monkeypatch):
    assert ClusterSpec.build({"max_gpu_hours": 2.5}).max_gpu_hours == 2.5
    monkeypatch.setenv("JUPYTER_MN_MAX_GPU_HOURS", "0.5")
    assert ClusterSpec.build().max_gpu_hours == 0.5
    assert usage.cap_seconds(0.5, 4) == 450


@pytest.mark.parametrize(
    ("flag", "error", "message"),
    [
        ("--max-gpu-hours nan", SpecError, "max_gpu_hours must be a positive number of hours"),
        ("--max-gpu-hours -0.5", SpecError, "max_gpu_hours must be a positive number of hours"),
        ("--max-gpu-hours 9e9", SpecError, "max_gpu_hours 9e\\+09 on 4 GPU"),
        ("--max-gpu-hours lots", MagicUsageError, "invalid float value: 'lots'"),
    ],
)
def test_a_bad_max_gpu_hours_on_a_cell_is_a_short_error_and_starts_nothing(flag, error, message):
    shell = InteractiveShell.instance()
    shell.extension_manager.load_extension("jupyter_mn")
    children = len(psutil.Process().children(recursive=True))
    try:
        with pytest.raises(error, match=message) as info:
            shell.run_cell_magic("cluster", f"--nodes 2 --gpus 2 {flag}", "1")
        assert len(str(info.value)) < 200 and "\n" not in str(info.value)
        assert cluster.current() is None or cluster.current().gang is None
        assert len(psutil.Process().children(recursive=True)) == children
    finally:
        cluster.shutdown()
        InteractiveShell.clear_instance()


@pytest.mark.parametrize("busy", [False, True])
def test_the_sooner_cap_fires_the_gpu_hours_one_when_the_meter_reaches_it(busy):
    clock = FakeClock()
    meter = Meter(slots=4, clock=clock)
    meter.up()
    meter.started(gpu=False)
    clock.now += 17.5  # half a second short of 0.02 rank-hours on 4 ranks
    stopped: queue.SimpleQueue[str] = queue.SimpleQueue()
    lifetime = GangLifetime(threading.RLock(), lambda: busy, stopped.put, stopped.put)
    reason = "--max-gpu-hours reached (0.02 rank-hours: 4 × 18 s)"
    try:
        lifetime.started(ClusterSpec(nodes=2, gpus=2, max_gpu_hours=0.02, max_runtime=3600), meter)
        if busy:  # the running job is stopped; the gang goes when it has ended
            assert stopped.get(timeout=30) == reason and lifetime.take_expired() == reason
        else:
            assert stopped.get(timeout=30) == f"torn down: {reason}"
    finally:
        lifetime.close()


def test_a_gang_gone_before_its_cap_is_not_torn_down_by_it():
    clock = FakeClock()
    meter = Meter(slots=4, clock=clock)
    meter.up()
    stopped: queue.SimpleQueue[str] = queue.SimpleQueue()
    lifetime = GangLifetime(threading.RLock(), lambda: False, stopped.put, stopped.put)
    lifetime.started(ClusterSpec(nodes=2, gpus=2, max_gpu_hours=1), meter)
    lifetime.gone()
    clock.now += 3600
    lifetime.cap(ClusterSpec(nodes=2, gpus=2, max_gpu_hours=1))  # a later cell's spec
    assert stopped.empty()
    lifetime.close()
