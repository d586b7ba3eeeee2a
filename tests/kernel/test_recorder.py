"""A real gang in this process writes its job to the registry and obeys cancel/release rows."""

from __future__ import annotations

import logging
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from jupyter_mn import Cluster
from jupyter_mn.jobs.joblogs import read_logs
from jupyter_mn.jobs.registry import JobModel, Registry
from jupyter_mn.kernel.recorder import Recorder
from jupyter_mn.wire.events import PreemptCause, Preemption
from tests.support.polling import wait_until
from tests.support.tmpfs import small_tmpfs


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster(nodes=2, gpus=1)
    c.up()
    yield c
    c.close()


def _job(registry: Registry, cluster: Cluster) -> JobModel:
    return next(j for j in registry.jobs() if j.gang == cluster.gang.core.id)


def _when(registry: Registry, cluster: Cluster, check, what: str) -> JobModel:
    def matching() -> JobModel | None:
        job = _job(registry, cluster)
        return job if check(job) else None

    return wait_until(matching, 20, what)


def test_job_has_state_nodes_and_rank_labelled_logs(registry, cluster):
    cluster.run("print('hello from', dist.get_rank())\n'hi'", cell_id=7)
    job = _when(registry, cluster, lambda j: j.cells == 1 and j.state == "READY", "cell recorded")
    assert (job.backend, job.shape, job.world_size, job.pid) == ("local", "2×1", 2, job.pid)
    assert job.last_cell["outcome"] == "DONE" and job.error is None
    assert (job.last_cell["id"], job.last_cell["value"]) == (7, "'hi'")  # for a reloaded page
    for node in job.nodes:
        assert node.ranks == ["ready"] and node.transport == "gloo (CPU)"
        assert node.host and all(psutil.pid_exists(p) for p in node.pids) and node.pids
    logs = registry.log_dir(job.id)
    lines = wait_until(lambda: read_logs(logs)[0], 10, "log lines")
    assert {x.labelled for x in lines} >= {
        "[node 0 rank 0] hello from 0",
        "[node 1 rank 1] hello from 1",
    }
    marks = [x.text for x in lines if x.is_mark]  # one for both nodes, before the cell's lines
    assert len(marks) == 1 and marks[0].startswith("In[7] started ") and lines[0].is_mark


def test_a_cell_is_counted_when_it_starts(registry, cluster):
    before = _job(registry, cluster).cells
    cell = cluster.submit("import time\ntime.sleep(2)")
    _when(registry, cluster, lambda j: j.cells == before + 1 and j.state == "RUNNING", "counted")
    cell.result()


def test_a_new_cell_clears_the_last_ones_error_and_shows_it_runs(registry, cluster):
    assert not cluster.run("raise ValueError('boom')", cell_id=11).ok
    failed = _when(
        registry, cluster, lambda j: (j.last_cell or {}).get("id") == 11, "the failure recorded"
    )
    assert "boom" in failed.error and failed.last_cell["outcome"] == "FAILED"
    cell = cluster.submit("import time\ntime.sleep(2)", cell_id=12)
    running = _when(registry, cluster, lambda j: j.state == "RUNNING", "the next cell running")
    assert (running.error, running.running) == (None, "In[12]")
    assert running.last_cell["outcome"] == "FAILED"  # the last cell's outcome stays, apart
    cell.result()
    done = _when(registry, cluster, lambda j: j.last_cell["id"] == 12, "the next cell done")
    assert (done.state, done.error, done.running) == ("READY", None, "")


def test_a_preemption_notice_shows_in_the_panel_with_its_deadline(registry, cluster):
    deadline = time.time() + 100
    cluster.gang.core.hub.dispatch(Preemption(1, PreemptCause.POD, deadline))  # as from node 1
    until = time.strftime("%H:%M:%S", time.localtime(deadline))
    expected = (
        f"PREEMPTING node 1 (until {until}): its pod is being deleted (eviction or preemption)"
    )
    _when(registry, cluster, lambda j: j.error == expected, "the notice in the job")
    cluster.run("1")  # the next cell's outcome replaces it
    _when(registry, cluster, lambda j: j.error is None, "the notice replaced")


def test_a_failed_cell_records_its_root_cause(registry, cluster):
    result = cluster.run("if dist.get_rank() == 1:\n    raise RuntimeError('boom')")
    assert not result.ok
    job = _when(
        registry, cluster, lambda j: j.last_cell and j.last_cell["outcome"] != "DONE", "failure"
    )
    assert job.error == "rank 1 (node 1): RuntimeError: boom"


def _mn_logs(capsys, registry: Registry, cluster: Cluster) -> list[str]:
    """What ``jupyter mn logs JOB`` prints for the cluster's job."""
    from jupyter_mn.cli import main

    capsys.readouterr()
    assert main(["logs", _job(registry, cluster).id, "--tail", "500"]) == 0
    return capsys.readouterr().out.splitlines()


def _ctrl_c_when(registry: Registry, cluster: Cluster, state: str) -> threading.Thread:
    """Press Ctrl-C (SIGINT to the main thread, where the cell's loop runs) once the job is in
    ``state``."""

    def press() -> None:
        _when(registry, cluster, lambda j: j.state == state, state)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    thread = threading.Thread(target=press, daemon=True)
    thread.start()
    return thread


def test_the_logs_keep_a_failed_cells_outcome_and_its_root_cause_traceback(
    registry, cluster, capsys
):
    cluster.up()
    code = (
        "def inner():\n    raise RuntimeError('boom in the logs')\n"
        "if dist.get_rank() == 1:\n    inner()"
    )
    assert not cluster.run(code, cell_id=31).ok
    _when(registry, cluster, lambda j: (j.last_cell or {}).get("id") == 31, "cell 31 recorded")
    out = _mn_logs(capsys, registry, cluster)
    failed = next(i for i, x in enumerate(out) if x.startswith("──── In[31] FAILED: "))
    assert "rank 1 (node 1): RuntimeError: boom in the logs" in out[failed]
    traceback = [x for x in out[failed:] if x.startswith("[node 1 rank 1] ")]
    assert any("inner()" in x for x in traceback)
    assert traceback[-1] == "[node 1 rank 1] RuntimeError: boom in the logs"


def test_the_logs_keep_a_ctrl_c_as_an_interrupt_by_the_user(registry, cluster, capsys):
    cluster.up()
    presser = _ctrl_c_when(registry, cluster, "RUNNING")
    result = cluster.run("import time\ntime.sleep(60)", cell_id=32)
    presser.join(10)
    assert result.interrupted == "interrupted by the user"
    job = _when(registry, cluster, lambda j: (j.last_cell or {}).get("id") == 32, "cell 32")
    assert (job.last_cell["outcome"], job.error) == ("INTERRUPTED", "interrupted by the user")
    out = _mn_logs(capsys, registry, cluster)
    assert any(x.startswith("──── In[32] INTERRUPTED: interrupted by the user · ") for x in out)
    assert not any("In[32] FAILED" in x for x in out)


def test_the_logs_keep_a_hang_verdict_and_the_stop_that_ended_it(registry, cluster, capsys):
    cluster.up()
    code = "import time\nif dist.get_rank() == 1:\n    time.sleep(60)\ndist.barrier()"
    presser = _ctrl_c_when(registry, cluster, "HUNG")
    result = cluster.run(code, cell_id=33, hang_timeout=1)
    presser.join(10)
    assert result.outcome == "HUNG" and result.verdict
    _when(registry, cluster, lambda j: (j.last_cell or {}).get("id") == 33, "cell 33 recorded")
    out = _mn_logs(capsys, registry, cluster)
    verdicts = [x for x in out if x.startswith("──── In[33] hang verdict: ")]
    assert len(verdicts) == 1 and "rank 1 (node 1)" in verdicts[0]
    assert any(x.startswith("──── In[33] HUNG: interrupted by the user · ") for x in out)


def test_cancel_request_stops_a_running_cell_and_the_gang_stays_up(registry, cluster):
    results = []
    runner = threading.Thread(
        target=lambda: results.append(cluster.run("import time\ntime.sleep(60)"))
    )
    started = time.monotonic()
    runner.start()
    job = _when(registry, cluster, lambda j: j.state == "RUNNING", "RUNNING")
    request = registry.request(job.id, "cancel", "cli")
    outcome = wait_until(lambda: registry.outcome(request), 10, "the kernel's answer")
    assert outcome == "cancelling the running cell"
    runner.join(30)
    assert time.monotonic() - started < 20
    (result,) = results
    assert {r.status for r in result.ranks} == {"interrupted"}
    assert result.interrupted == "cancelled from jupyter mn"
    assert str(result.error()).startswith("cancelled from jupyter mn: rank ")
    assert cluster.run("dist.get_world_size()").value == 2


def test_cancel_when_no_cell_runs_says_so(registry, cluster):
    job = _when(registry, cluster, lambda j: j.state == "READY", "READY")
    request = registry.request(job.id, "cancel", "panel")
    assert wait_until(lambda: registry.outcome(request), 10, "answer") == "no cell was running"


def test_release_request_frees_the_idle_gang(registry, cluster):
    job = _when(registry, cluster, lambda j: j.state == "READY", "READY")
    pids = [p for node in job.nodes for p in node.pids]
    request = registry.request(job.id, "release", "panel")
    assert wait_until(lambda: registry.outcome(request), 10, "answer") == "releasing the gang"
    wait_until(lambda: registry.job(job.id).state == "CLOSED", 30, "CLOSED")
    assert registry.job(job.id).ended is not None
    # the row is CLOSED from inside the gang's close, on the releasing thread, which then
    # forgets the gang and says why: the cluster's view comes a moment later
    why = "released from the Multi-node jobs panel"
    wait_until(lambda: cluster.status()["detail"] == why, 30, "the cluster to say why")
    assert cluster.gang is None
    assert len(pids) == 2
    _, alive = psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)], 10)
    assert not alive


class AnswersLate(Registry):
    """A registry whose first answer fails (a database locked past its timeout) once the gang
    it answers for has gone: the release it answers is done, its job CLOSED."""

    def __init__(self, root: Path, gone) -> None:
        super().__init__(root)
        self.gone, self.failed = gone, False

    def answer(self, request_id: int, outcome: str) -> None:
        if not self.failed:
            self.failed = True
            wait_until(self.gone, 30, "the gang released")
            raise sqlite3.OperationalError("database is locked")
        super().answer(request_id, outcome)


def test_a_request_whose_answer_was_not_written_is_answered_once_its_job_is_gone(
    tmp_path, no_leftovers
):
    own = Cluster(nodes=1, gpus=1)
    registry = AnswersLate(tmp_path / "reg", lambda: own.gang is None)
    try:
        record = Recorder(registry).track(own, own.up())
        request = registry.request(record.model.id, "release", "panel")
        answered = wait_until(lambda: registry.outcome(request), 60, "the answer")
        assert answered == "releasing the gang"  # what was done, not done again
        assert registry.job(record.model.id).state == "CLOSED"
    finally:
        own.close()
        registry.close()


def test_gpu_samples_and_transport_reports_reach_the_job(registry, cluster):
    """Telemetry events (issue 4) feed the sidebar's GPU and transport badges."""
    from jupyter_mn.kernel.recorder import JobRecord
    from jupyter_mn.wire.events import GpuSample, GpuStat, TransportReport

    gang = cluster.up()  # an earlier test may have released it
    record = JobRecord(registry, cluster, gang)  # fed by hand: no live events race it
    gpus = (GpuStat(0, "H100", 80, 1000, 80000), GpuStat(1, "H100", 40, 1000, 80000))
    assert record.handle(GpuSample(node=1, gpus=gpus))
    report = TransportReport(node=1, network="IB", inter_node=("NET/IB/GDRDMA",), gdr=True)
    assert record.handle(report)
    assert not record.handle(TransportReport(node=-1))  # from log files, not a node of the job
    job = JobModel.from_json(record.model.to_json())  # the shape the sidebar reads
    assert job.nodes[1].gpu_util == 60 and job.nodes[0].gpu_util is None
    assert job.nodes[1].transport == "inter-node NET/IB/GDRDMA"
    record.logs.close()


def test_on_a_full_log_disk_states_are_still_saved_with_one_warning(cluster, tmp_path, caplog):
    """The log files fill a real (small) filesystem; the job's row keeps being written."""
    caplog.set_level(logging.WARNING)
    with small_tmpfs(tmp_path) as logs:
        registry = Registry(tmp_path / "reg")
        registry.logs_root = logs  # the logs live on the small disk, the database does not
        try:
            recorder = Recorder(registry)
            record = recorder.track(cluster, cluster.up())
            chatty = "for i in range(20):\n    print(i, 'x' * 20000)"
            for _ in range(3):
                assert cluster.run(chatty).ok
            wait_until(
                lambda: (j := registry.job(record.model.id)).cells == 3 and j.state == "READY",
                20,
                "3 cells saved, the last one done",
            )
            cluster.release("test")
            wait_until(lambda: registry.job(record.model.id).finished, 20, "CLOSED saved")
        finally:
            registry.close()
    ours = [r for r in caplog.records if r.name.startswith("jupyter_mn")]
    assert [r.getMessage() for r in ours if "cannot write logs" in r.getMessage()] == [
        f"jupyter_mn: cannot write logs to {logs / record.model.id} (No space left on device); "
        "dropping lines until it works"
    ]
    assert not [r for r in ours if r.exc_info]  # no traceback


def test_a_job_whose_log_dir_cannot_be_made_is_still_recorded(cluster, tmp_path, caplog):
    """A file where the job's log directory goes: its lines are lost (one warning), not the job:
    the panel, the CLI and gc still see it."""
    caplog.set_level(logging.WARNING)
    registry = Registry(tmp_path / "reg")
    try:
        gang = cluster.up()
        registry.log_dir(gang.core.id).write_text("in the way")
        record = Recorder(registry).track(cluster, gang)
        assert cluster.run("print('a line with nowhere to go')").ok
        wait_until(  # a cell is counted when it starts: wait for its end too
            lambda: (j := registry.job(record.model.id)).cells == 1 and j.state == "READY",
            20,
            "the cell saved",
        )
    finally:
        registry.close()
    warned = [r.getMessage() for r in caplog.records if "cannot write logs" in r.getMessage()]
    assert len(warned) == 1 and "File exists" in warned[0]


def test_a_hung_cell_shows_as_hung_with_its_verdict_until_the_cell_ends(registry, cluster):
    from jupyter_mn.kernel.recorder import JobRecord
    from jupyter_mn.wire.events import CellDone, CellOutcome, GangState, Hung

    gang = cluster.up()
    record = JobRecord(registry, cluster, gang)  # fed by hand: no live events race it
    verdict = "rank 3 (node 1) never entered all_reduce #4 (pg 0, float32[1]); …"
    assert record.handle(GangState("RUNNING"))
    assert record.handle(Hung(verdict, 300.0))
    job = JobModel.from_json(record.model.to_json())  # the shape the sidebar reads
    assert (job.state, job.detail, job.error) == ("HUNG", verdict, verdict)
    assert record.handle(Hung(verdict, 300.0, over=True))  # the ranks moved on
    assert JobModel.from_json(record.model.to_json()).state == gang.core.status.value
    assert record.handle(Hung(verdict, 300.0))
    assert record.handle(
        CellDone(4, 301.0, error="rank 3 (node 1) was interrupted", outcome=CellOutcome.HUNG)
    )
    assert record.handle(GangState("READY"))
    job = JobModel.from_json(record.model.to_json())
    assert (job.state, job.error) == ("READY", "rank 3 (node 1) was interrupted")
    record.logs.close()
