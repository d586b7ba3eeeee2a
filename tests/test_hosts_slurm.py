"""Gangs on a real Slurm (``slurm.py``): one slurmd per test host, one batch job per gang."""

from __future__ import annotations

import json

from polling import wait_until
from slurm import SlurmCluster
from test_hosts_dask import CHECK

from jupyter_mn import Cluster


def test_the_test_slurm_runs_a_step_on_each_host(slurm: SlurmCluster):
    out = slurm.run("srun", "--nodes=2", "--ntasks-per-node=1", "sh", "-c", "hostname; hostname -I")
    lines = sorted(out.split("\n")[:-1])
    hosts = {h.hostname: h.ip for h in slurm.net.hosts}
    assert [x for x in lines if x in hosts] == sorted(hosts)
    assert {ip.strip() for ip in lines if ip.strip() not in hosts} == set(hosts.values())


def test_a_gang_is_one_job_whose_nodes_reduce_across_the_hosts(slurm, no_leftovers):
    with Cluster(nodes=2, gpus=1, backend="slurm") as cluster:
        rows = [json.loads(v) for v in cluster.run(CHECK, return_all=True).unwrap()]
        (job,) = slurm.jobs()
        assert job.split()[1] == "RUNNING"
    hosts = slurm.net.hosts
    assert [r["host"] for r in rows] == [h.hostname for h in hosts]
    assert {r["master"] for r in rows} == {hosts[0].ip}
    assert all(r["sum"] == 1 for r in rows)
    assert all((r["gloo"], r["nccl"]) == ("eth0", "=eth0") for r in rows)
    wait_until(lambda: not slurm.jobs(), 30, "the job to leave squeue")
