"""Gangs on a real Slurm (``slurm.py``): one slurmd per test host, one batch job per gang.

The preflight doctor runs in the first gang test only; the others are about scheduling and skip it
(on a loaded 2-core machine it costs a minute).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

import nbformat
import psutil
import pytest

from jupyter_mn import Cluster
from jupyter_mn.checkpoint import latest
from jupyter_mn.errors import Preempted, SchedulingError
from jupyter_mn.gang.slurm import commands
from jupyter_mn.gang.slurm.provision import dry_run, output_dir
from jupyter_mn.gang.slurm.sbatch import STEP_MODULE
from jupyter_mn.jobs.gc import collect
from jupyter_mn.jobs.registry import ORPHAN_AFTER_S, Registry
from jupyter_mn.model.slurmspec import SlurmOptions
from jupyter_mn.model.spec import ClusterSpec
from jupyter_mn.wire.events import NodesWaiting
from tests.e2e.test_detached_runs import (
    TRAIN,
    ended,
    job,
    jobs,
    mn,
    notebook,
    outputs,
    running_cell,
    submit,
)
from tests.hosts.test_hosts_dask import CHECK
from tests.support.bigvalue import check_big_push, check_big_value
from tests.support.jobs import make_job
from tests.support.kernels import Kernel
from tests.support.otheruser import other_user
from tests.support.polling import wait_until
from tests.support.runs import JUPYTER_MN, submit_in_a_shell
from tests.support.slurm import SlurmCluster

pytestmark = pytest.mark.system


def test_the_test_slurm_runs_a_step_on_each_host(slurm: SlurmCluster):
    out = slurm.run("srun", "--nodes=2", "--ntasks-per-node=1", "sh", "-c", "hostname; hostname -I")
    lines = sorted(out.split("\n")[:-1])
    hosts = {h.hostname: h.ip for h in slurm.net.hosts}
    assert [x for x in lines if x in hosts] == sorted(hosts)
    assert {ip.strip() for ip in lines if ip.strip() not in hosts} == set(hosts.values())


def _environ(proc: psutil.Process) -> dict[str, str]:
    with contextlib.suppress(psutil.Error):
        return proc.environ()
    return {}


def _is_task(proc: psutil.Process, job_id: str) -> bool:
    """A task of the gang's step (not its srun), by its command line and job."""
    with contextlib.suppress(psutil.Error):
        return proc.cmdline()[1:3] == ["-m", STEP_MODULE] and (
            proc.environ().get("SLURM_JOB_ID") == job_id
        )
    return False


@pytest.mark.slow
def test_a_gang_is_one_job_whose_nodes_reduce_across_the_hosts_until_its_idle_release(
    slurm, no_leftovers, monkeypatch
):
    """The job's environment holds neither the gang's key nor the kernel's credentials, nor
    what the allowlist does not name (``MYSQL_PWD``)."""
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "planted-hub-token")
    monkeypatch.setenv("MYSQL_PWD", "planted-mysql-pwd")
    cluster = Cluster(nodes=2, gpus=1, backend="slurm", idle_timeout=10)
    try:
        rows = [json.loads(v) for v in cluster.run(CHECK, return_all=True).unwrap()]
        leaked = cluster.run(
            "import os\n[k for k, v in os.environ.items() if 'planted-' in v or 'KEY-----' in v]"
        )
        assert leaked.value == []
        check_big_value(cluster, mib=16)
        check_big_push(cluster, mib=16)
        (job,) = slurm.jobs()
        tasks = [_environ(p) for p in psutil.process_iter() if _is_task(p, job.split()[0])]
        assert len(tasks) == 2  # their environment as the job gave it (slurmctld keeps it)
        for env in tasks:
            assert not [v for v in env.values() if "planted-" in v or "KEY---" in v]
        assert not list(output_dir().glob("*-tls"))  # the nodes have read the certificate
        assert job.split()[1] == "RUNNING"
        wait_until(lambda: not slurm.jobs(), 10 + 30, "the idle release to cancel the job")
    finally:
        cluster.close()
    hosts = slurm.net.hosts
    assert [r["host"] for r in rows] == [h.hostname for h in hosts]
    assert {r["master"] for r in rows} == {hosts[0].ip}
    assert all(r["sum"] == 1 for r in rows)
    assert all((r["gloo"], r["nccl"]) == ("eth0", "=eth0") for r in rows)


def test_a_job_that_cannot_start_shows_why_and_is_cancelled_at_the_schedule_timeout(
    slurm, no_leftovers
):
    seen: list[NodesWaiting] = []
    held = SlurmOptions(sbatch_args=("--hold",), schedule_timeout=2)
    cluster = Cluster(ClusterSpec(nodes=2, gpus=1, backend="slurm", slurm=held))
    with pytest.raises(
        SchedulingError, match=r"did not start within .* 2 s \(pending: JobHeldUser"
    ):
        cluster.up(on_event=lambda e: seen.append(e) if isinstance(e, NodesWaiting) else None)
    cluster.close()
    (job,) = {e.message for e in seen}
    assert [e.reason for e in seen] == ["pending: JobHeldUser"]
    assert job.startswith("Slurm job ")
    wait_until(lambda: not slurm.jobs(), 30, "the held job to leave squeue")


#: A loop that saves when the gang is preempted; DCP is imported first, as a warm training loop
#: has it (the test Slurm's KillWait is 5 s, and the import alone takes seconds on a loaded host).
SAVES_WHEN_PREEMPTED = """
import time, torch.distributed.checkpoint
from jupyter_mn import checkpoint
model = torch.nn.Linear(2, 1)
print("looping")
for step in range(6000):
    if checkpoint.preempted():
        checkpoint.save({"model": model}, CKPT, step)
        break
    time.sleep(0.1)
"""


def test_a_requeued_job_is_a_preemption_its_loop_saves_in_and_the_next_cell_gets_a_new_job(
    slurm, tmp_path, no_leftovers
):
    ckpt = tmp_path / "ckpt"  # the test hosts share this machine's filesystem
    with Cluster(nodes=2, gpus=1, backend="slurm", preflight=False) as cluster:
        cluster.up()
        (first,) = (line.split()[0] for line in slurm.jobs())
        cell = cluster.submit(SAVES_WHEN_PREEMPTED, namespace={"CKPT": str(ckpt)})
        wait_until(lambda: "looping" in cell.output, 60, "the loop to run")
        slurm.run("scontrol", "requeue", first)  # SIGTERM to every process of the job
        with pytest.raises(Preempted) as preempted:
            cell.result(timeout=60)
        assert preempted.value.cause == "slurm", preempted.value
        assert preempted.value.checkpoint == str(latest(ckpt)), preempted.value
        assert cluster.run("1 + 1").unwrap() == 2
        (second,) = (line.split()[0] for line in slurm.jobs() if "RUNNING" in line)
        assert second != first
    wait_until(lambda: not slurm.jobs(), 30, "both jobs to leave squeue")


@pytest.mark.slow
def test_down_cancels_the_job_and_a_killed_kernels_job_ends_within_the_orphan_timeout(slurm):
    kernel = Kernel()
    try:
        flags = "--backend slurm --nodes 2 --gpus 1 --orphan-timeout 5 --no-preflight"
        cell = f"%%cluster {flags}\n1 + 1"
        assert kernel.run(cell).result == "2"
        down = kernel.run("%cluster down")
        assert down.status == "ok", down.error_text
        wait_until(lambda: not slurm.jobs(), 30, "%cluster down to leave squeue empty")
        assert kernel.run(cell).result == "2"
        (job,) = slurm.jobs()
        os.kill(kernel.pid, signal.SIGKILL)
        killed = time.monotonic()
        wait_until(lambda: not slurm.jobs(), 5 + 30, f"job {job} to end after its kernel")
        assert time.monotonic() - killed > 5  # the job ended by itself: no kernel cancelled it
    finally:
        kernel.shutdown()


def test_a_kernel_inside_an_allocation_starts_a_step_there_and_submits_nothing(slurm, tmp_path):
    script = tmp_path / "inside.py"
    script.write_text(
        "import json\nfrom jupyter_mn import Cluster\n"
        "with Cluster(nodes=2, gpus=1, backend='slurm', preflight=False) as c:\n"
        f"    print(json.dumps(c.run({CHECK!r}, return_all=True).unwrap()))\n"
    )
    out = tmp_path / "out"
    argv = ["sbatch", "--parsable", "--wait", "--nodes=2", f"--output={out}"]
    outer = slurm.run(*argv, "--wrap", f"{sys.executable} {script}", timeout=300).strip()
    rows = [json.loads(v) for v in json.loads(out.read_text().splitlines()[-1])]
    hosts = slurm.net.hosts
    assert [r["host"] for r in rows] == [h.hostname for h in hosts]
    assert {r["master"] for r in rows} == {hosts[0].ip}
    assert all(r["sum"] == 1 for r in rows)
    after = slurm.run("sbatch", "--parsable", "--output=/dev/null", "--wrap", "true").strip()
    assert int(after) == int(outer) + 1  # no job was submitted from inside
    wait_until(lambda: not slurm.jobs(), 30, "the jobs to leave squeue")


def test_gc_cancels_the_slurm_job_of_a_dead_kernel_and_no_other(slurm, tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a kernel pid that no longer exists
    ids = {}
    for gang in ("jmn-dead-0001", "jmn-other-0002"):
        argv = ["sbatch", "--parsable", f"--job-name={gang}", "--output=/dev/null"]
        ids[gang] = slurm.run(*argv, "--hold", "--wrap", "sleep 300").strip()
    registry = Registry(tmp_path / "reg")
    try:
        stale = time.time() - ORPHAN_AFTER_S - 1
        job = make_job("jmn-dead-0001", backend="slurm", pid=gone.pid, heartbeat=stale)
        registry.save(job)
        assert collect(registry, keep_s=1e9, dry_run=True) == [
            f"jmn-dead-0001: would cancel Slurm job {ids['jmn-dead-0001']}"
        ]
        assert collect(registry, keep_s=1e9) == [
            f"jmn-dead-0001: cancelled Slurm job {ids['jmn-dead-0001']}"
        ]
        wait_until(
            lambda: [j.split()[0] for j in slurm.jobs()] == [ids["jmn-other-0002"]],
            30,
            "only the other job to stay",
        )
    finally:
        registry.close()
        slurm.run("scancel", *ids.values())
        wait_until(lambda: not slurm.jobs(), 30, "the jobs to leave squeue")


def test_dry_run_prints_the_batch_script_without_gpus_on_a_cpu_only_cluster(slurm):
    script = dry_run(ClusterSpec(nodes=2, gpus=1, backend="slurm"))
    assert "#SBATCH --nodes=2" in script
    assert "--gres" not in script
    assert "sinfo did not answer" not in script
    assert not slurm.jobs()


def test_the_pending_reason_is_shown_as_it_changes_until_the_job_starts(slurm, no_leftovers):
    argv = ["sbatch", "--parsable", "--nodes=2", "--exclusive", "--output=/dev/null"]
    blocker = slurm.run(*argv, "--wrap", "sleep 300").strip()
    wait_until(lambda: f"{blocker} RUNNING" in " ".join(slurm.jobs()), 30, "the blocker to run")
    reasons: list[str] = []

    def waiting(event: object) -> None:
        if isinstance(event, NodesWaiting):
            reasons.append(event.reason)
            if event.reason == "pending: Resources":
                slurm.run("scancel", blocker)  # the nodes free up: the gang's job starts

    with Cluster(nodes=2, gpus=1, backend="slurm", preflight=False) as cluster:
        cluster.up(on_event=waiting)
        assert cluster.run("dist.get_world_size()").unwrap() == 2
    assert reasons[-1] == "pending: Resources"
    assert set(reasons) <= {"pending: None", "pending: Priority", "pending: Resources"}
    wait_until(lambda: not slurm.jobs(), 30, "the jobs to leave squeue")


def test_a_job_sbatch_submitted_before_it_timed_out_is_cancelled(
    slurm, tmp_path, monkeypatch, no_leftovers
):
    """No job id came back, yet the job exists: it is found by its name and cancelled."""
    wrapper = tmp_path / "sbatch"
    wrapper.write_text(f'#!/bin/sh\n{shutil.which("sbatch")} "$@"\nexec sleep 60\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(commands, "_TIMEOUT_S", 3.0)
    cluster = Cluster(nodes=1, gpus=1, backend="slurm", preflight=False)
    with pytest.raises(SchedulingError, match="sbatch did not answer in 3 s"):
        cluster.up()
    cluster.close()
    wait_until(lambda: not slurm.jobs(), 30, "the submitted job to be cancelled")


# ---- jupyter mn submit --backend slurm (jobs/slurmrun.py): the run is one job
SUBMIT = ["--backend", "slurm", "--nodes", "2", "--gpus", "1", "--no-preflight"]
#: A job that marks where the next test's jobs start (this test Slurm's ids count up)
MARK = ["sbatch", "--parsable", "--output=/dev/null", "--wrap", "true"]


def jobs_after(slurm: SlurmCluster, mark: str) -> list[str]:
    """The names of the jobs Slurm was given after ``mark``, ended ones too (slurmctld keeps
    them for MinJobAge, 300 s: this test Slurm has no accounting database for sacct)."""
    out = slurm.run("squeue", "-h", "--states=all", "-o", "%i %j")
    return sorted(
        name for i, name in (line.split() for line in out.splitlines()) if int(i) > int(mark)
    )


def test_a_submitted_run_is_one_slurm_job_its_kernel_and_ranks_share_and_outlives_its_shell(
    slurm, tmp_path, no_leftovers
):
    nb = notebook(
        tmp_path / "three.ipynb",
        "import os\nprint('kernel job', os.environ['SLURM_JOB_ID'], flush=True)",
        "%%cluster\nimport os, socket\n"
        "print('rank job', os.environ['SLURM_JOB_ID'], socket.gethostname(), flush=True)",
        "print('done')",
    )
    mark = slurm.run(*MARK).strip()
    job_id, said = submit_in_a_shell(str(nb), *SUBMIT)
    slurm_id = said.rsplit("(queued as Slurm job ", 1)[1].rstrip(")\n")
    run = ended(job_id)
    assert (run.state, run.cells, run.error) == ("SUCCEEDED", 3, None), run
    assert run.backend == "slurm" and run.host == slurm.nodes[0]  # the kernel ran in the job
    mn("fetch", job_id, str(tmp_path / "out.ipynb"))
    cells = nbformat.read(tmp_path / "out.ipynb", 4).cells
    assert outputs(cells[0]) == f"kernel job {slurm_id}\n"
    for rank, host in enumerate(slurm.nodes):
        assert f"[node {rank} rank {rank}] rank job {slurm_id} {host}" in outputs(cells[1])
    assert outputs(cells[2]) == "done\n"
    wait_until(lambda: not slurm.jobs(), 30, "the run's job to leave squeue")
    assert jobs_after(slurm, mark) == [job_id]  # the run was one job, its cells none


def test_cancel_of_a_slurm_run_mid_cell_leaves_no_process_or_job(slurm, tmp_path, no_leftovers):
    nb = notebook(tmp_path / "long.ipynb", "steps = 10_000\npause = 0.2", TRAIN, "print('never')")
    job_id = submit(str(nb), *SUBMIT)
    running_cell(job_id, "[node 1 rank 1] step 1 of 2")
    assert mn("cancel", job_id, "--wait", "60").stdout == f"{job_id}: CANCELLED\n"
    run = job(job_id)
    assert (run.state, run.detail) == ("CANCELLED", "cancelled at cell 2 of 3"), run
    wait_until(lambda: not slurm.jobs(), 30, "the run's job to leave squeue")


def test_a_slurm_run_whose_job_is_scancelled_fails_saying_so(slurm, tmp_path, no_leftovers):
    nb = notebook(tmp_path / "killed.ipynb", "steps = 10_000\npause = 0.2", TRAIN)
    job_id = submit(str(nb), *SUBMIT, "--retries", "1")  # a scancel is no requeue
    running_cell(job_id, "[node 1 rank 1] step 1 of 2")
    slurm.run("scancel", f"--name={job_id}")  # the job is named after the run
    run = ended(job_id)
    assert (run.state, run.error) == (
        "FAILED",
        "stopped by Slurm at cell 2 of 2 (scancel, --time or a node lost)",
    ), run
    wait_until(lambda: not slurm.jobs(), 30, "the run's job to leave squeue")


def test_cancel_scancels_a_slurm_run_whose_runner_does_not_answer(slurm, tmp_path, no_leftovers):
    nb = notebook(tmp_path / "stuck.ipynb", "steps = 10_000\npause = 0.2", TRAIN)
    job_id = submit(str(nb), *SUBMIT)
    running_cell(job_id, "[node 1 rank 1] step 1 of 2")
    os.kill(job(job_id).pid, signal.SIGSTOP)  # the runner, on the job's first node
    cancelled = mn("cancel", job_id, "--wait", "3").stdout
    assert cancelled == f"{job_id}: no answer within 3 s; its Slurm job is cancelled\n"
    wait_until(lambda: not slurm.jobs(), 60, "the run's job to leave squeue")
    assert ended(job_id).state in {"CANCELLED", "FAILED", "ORPHANED"}


def test_a_queued_slurm_run_is_listed_until_cancel_cancels_its_job(slurm, tmp_path, no_leftovers):
    nb = notebook(tmp_path / "held.ipynb", "x = 1", "print(x)")
    job_id = submit(str(nb), *SUBMIT, "--sbatch-arg=--hold")
    (slurm_id,) = (line.split()[0] for line in slurm.jobs() if "JobHeldUser" in line)
    queued = job(job_id)
    assert (queued.state, queued.backend, queued.pid) == ("SUBMITTED", "slurm", 0)
    assert mn("cancel", job_id).stdout == f"{job_id}: CANCELLED\n"
    assert job(job_id).detail == "cancelled while queued in Slurm"
    wait_until(lambda: not slurm.jobs(), 30, f"job {slurm_id} to leave squeue")


def test_gc_fails_a_queued_run_whose_job_was_cancelled_in_slurm(slurm, tmp_path, no_leftovers):
    nb = notebook(tmp_path / "held.ipynb", "x = 1", "print(x)")
    job_id = submit(str(nb), *SUBMIT, "--sbatch-arg=--hold")
    slurm.run("scancel", f"--name={job_id}")  # not through jupyter mn: its row stays queued
    wait_until(lambda: not slurm.jobs(), 30, "the run's job to leave squeue")
    registry = Registry()
    try:
        queued = registry.job(job_id)
        queued.started -= ORPHAN_AFTER_S  # queued as long as a run must be before gc looks
        registry.save(queued)
        said = [line for line in collect(registry, keep_s=1e9) if line.startswith(job_id)]
        assert said == [f"{job_id}: marked FAILED: its Slurm job is gone"]  # others: earlier tests'
    finally:
        registry.close()
    assert job(job_id).error == "its Slurm job ended before it started (cancelled in Slurm?)"


def test_a_requeued_run_starts_over_per_retries_and_finishes(slurm, tmp_path, no_leftovers):
    nb = notebook(
        tmp_path / "requeued.ipynb",
        "import os\nrestart = os.environ.get('SLURM_RESTART_COUNT', '0')",
        "%%cluster\nimport os, time\nprint('attempt', os.environ.get('SLURM_RESTART_COUNT', '0'),"
        " flush=True)\nwhile 'SLURM_RESTART_COUNT' not in os.environ:\n    time.sleep(0.2)",
        "print('finished at restart', restart)",
    )
    job_id = submit(str(nb), *SUBMIT, "--retries", "1")
    running_cell(job_id, "[node 1 rank 1] attempt 0")
    (slurm_id,) = (line.split()[0] for line in slurm.jobs())
    slurm.run("scontrol", "requeue", slurm_id)
    requeued = wait_until(
        lambda: (j := job(job_id)).state == "SUBMITTED" and j, 60, "the run to be requeued"
    )
    assert requeued.detail.startswith("requeued by Slurm at cell 2 of 3"), requeued
    queued = f"{slurm_id} PENDING BeginTime"  # Slurm's delay (120 s) once its processes are gone
    wait_until(lambda: queued in slurm.jobs(), 60, "the job to be queued again")
    slurm.run("scontrol", "update", f"JobId={slurm_id}", "StartTime=now")
    run = ended(job_id)
    assert (run.state, run.error) == ("SUCCEEDED", None), run
    mn("fetch", job_id, str(tmp_path / "out.ipynb"))
    cells = nbformat.read(tmp_path / "out.ipynb", 4).cells
    assert "[node 1 rank 1] attempt 1" in outputs(cells[1])
    assert outputs(cells[2]) == "finished at restart 1\n"
    wait_until(lambda: not slurm.jobs(), 30, "the run's job to leave squeue")


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--nodes", "3"], "Requested node configuration is not available"),
        (["--partitoin", "debug"], "unrecognized arguments: --partitoin debug"),
    ],
)
def test_a_slurm_run_the_cluster_cannot_hold_is_refused_in_one_line_before_anything_is_submitted(
    slurm, tmp_path, flags, error
):
    nb = notebook(tmp_path / "nb.ipynb", "x = 1", "print(x)")
    mark = slurm.run(*MARK).strip()
    argv = [*JUPYTER_MN, "submit", str(nb), "--backend", "slurm", *flags]
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    (line,) = refused.stderr.splitlines()
    assert error in line and line.startswith("jupyter mn"), line
    assert not [j for j in jobs() if j.notebook == str(nb)]
    assert jobs_after(slurm, mark) == []


def test_a_notebook_in_a_directory_whose_name_holds_a_newline_is_refused_and_runs_nothing(
    slurm, tmp_path
):
    """Another user names a shared directory ``d⏎touch NAME #``: its ``--chdir`` line would
    end at the newline and the batch script run ``touch``; the run is refused in one line."""
    with other_user() as other:
        pwned = f"pwned-{os.getpid()}"
        other.sh(f"mkdir -m 777 \"$(printf 'd\\ntouch {pwned} #')\"")
        (folder,) = other.shared.iterdir()
        nb = notebook(folder / "nb.ipynb", "x = 1", "print(x)")
        mark = slurm.run(*MARK).strip()
        argv = [*JUPYTER_MN, "submit", str(nb), *SUBMIT]
        refused = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        (line,) = refused.stderr.splitlines()
        assert "holds a control character" in line and "--chdir=" in line, line
        assert not [j for j in jobs() if j.notebook == str(nb)]
        assert jobs_after(slurm, mark) == []
        assert not list(tmp_path.rglob(f"{pwned}*")) and not list(other.shared.rglob(f"{pwned}*"))


def test_a_slurm_runs_secrets_reach_its_ranks_and_nothing_slurm_keeps_or_shows(
    slurm, tmp_path, no_leftovers
):
    """A secret parameter and a secret ``--env`` value: the ranks see the value, the fetched
    notebook has the parameter, and neither is in what Slurm shows of the job (``scontrol show
    job -dd``, its batch script), keeps (slurmctld's state, slurmd's spool, the logs) or gives
    the step (its tasks' environment)."""
    token, value = "hf_" + uuid.uuid4().hex, "wandb-" + uuid.uuid4().hex
    seen = hashlib.sha256(value.encode()).hexdigest()
    go = tmp_path / "go"
    nb = notebook(
        tmp_path / "secret.ipynb",
        "token = ''",
        "%%cluster\nimport hashlib, os\n"
        "print('ranks see', hashlib.sha256(os.environ['WANDB_API_KEY'].encode()).hexdigest())",
        f"import os, time\nwhile not os.path.exists({str(go)!r}):\n    time.sleep(0.2)",
    )
    job_id = submit(str(nb), *SUBMIT, "-p", "token", token, "--env", f"WANDB_API_KEY={value}")
    running_cell(job_id, f"[node 1 rank 1] ranks see {seen}")
    (slurm_id,) = (line.split()[0] for line in slurm.jobs())
    shown = slurm.run("scontrol", "show", "job", "-dd", slurm_id)
    shown += slurm.run("scontrol", "write", "batch_script", slurm_id, "-")
    kept = [
        str(path)
        for path in slurm.root.rglob("*")
        if path.is_file() and any(s.encode() in path.read_bytes() for s in (token, value))
    ]
    steps = [  # the step's srun and its task on each node, with the environment srun gave
        p.info
        for p in psutil.process_iter(["cmdline", "environ"])
        if STEP_MODULE in (p.info["cmdline"] or [])
    ]
    assert len([step for step in steps if step["environ"]]) >= 2
    in_steps = [step["cmdline"] for step in steps if value in str(step["environ"])]
    go.touch()
    run = ended(job_id)
    assert run.state == "SUCCEEDED", run.error
    assert "#SBATCH" in shown and token not in shown and value not in shown
    assert kept == [] and in_steps == []
    mn("fetch", job_id, str(tmp_path / "out.ipynb"))
    assert token in nbformat.read(tmp_path / "out.ipynb", 4).cells[1].source
    wait_until(lambda: not slurm.jobs(), 30, "the run's job to leave squeue")
