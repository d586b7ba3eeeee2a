"""Gangs on a real Slurm (``slurm.py``): one slurmd per test host, one batch job per gang."""

from __future__ import annotations

from slurm import SlurmCluster


def test_the_test_slurm_runs_a_step_on_each_host(slurm: SlurmCluster):
    out = slurm.run("srun", "--nodes=2", "--ntasks-per-node=1", "sh", "-c", "hostname; hostname -I")
    lines = sorted(out.split("\n")[:-1])
    hosts = {h.hostname: h.ip for h in slurm.net.hosts}
    assert [x for x in lines if x in hosts] == sorted(hosts)
    assert {ip.strip() for ip in lines if ip.strip() not in hosts} == set(hosts.values())
