"""The dask backend on a real CLI-started TLS cluster: claims, node order, failures, release."""

from __future__ import annotations

import json
import os
import signal
import socket
import socketserver
import threading
import time

import dask
import psutil
import pytest
from distributed import Client, LocalCluster, Security

from jupyter_mn import Cluster
from jupyter_mn.cli import main as jupyter_mn_cli
from jupyter_mn.errors import NodeLost, SchedulingError, SpecError
from jupyter_mn.gang.dask import (
    Candidate,
    candidates,
    could_change,
    preference,
    shortage,
    silent_workers,
)
from jupyter_mn.gang.shell import run_on_nodes
from jupyter_mn.model.spec import ClusterSpec
from jupyter_mn.wire.events import Note
from tests.kernel.test_cluster import ENV_CHECK
from tests.support.bigvalue import check_big_push, check_big_value
from tests.support.daskcli import tls_config
from tests.support.polling import wait_until
from tests.support.procs import ours, rank_processes, wait_gone


def dask_cluster(address: str, **options) -> Cluster:
    return Cluster(backend="dask", scheduler=address, **options)


@pytest.fixture
def other_user(dask_cli):
    """Another client of the same cluster, holding data and a task result while we work."""
    with dask.config.set(tls_config(dask_cli.certs)):
        client = Client(dask_cli.address, security=Security(), set_as_default=False)
    data = client.scatter(list(range(10)), broadcast=True)
    total = client.submit(sum, data)
    yield client, total
    client.close()


def test_bad_input_is_refused_before_connecting(dask_tls, no_leftovers):
    with pytest.raises(SpecError, match="needs --scheduler"):
        Cluster(backend="dask")
    with pytest.raises(SpecError, match="expected PROTOCOL://HOST:PORT"):
        Cluster(backend="dask", scheduler="tls://127.0.0.1")
    with dask.config.set({"distributed.comm.tls.ca-file": None}):
        cluster = dask_cluster(dask_tls)
        with pytest.raises(SpecError, match=r"distributed\.comm\.tls\.ca-file"):
            cluster.run("1")
    started = time.monotonic()
    with pytest.raises(SchedulingError, match="cannot connect to the dask scheduler"):
        dask_cluster("tcp://127.0.0.1:9", start_timeout=3, insecure=True).run("1")
    assert time.monotonic() - started < 20
    assert not rank_processes(ours(no_leftovers))


def _routable_ipv4() -> str | None:
    for addresses in psutil.net_if_addrs().values():
        for a in addresses:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return None


class _Doorbell(socketserver.ThreadingTCPServer):
    """A TCP listener that notes each connection and hangs up: it is no scheduler."""

    def __init__(self, host: str) -> None:
        self.rung: list[tuple[str, int]] = []
        super().__init__((host, 0), socketserver.BaseRequestHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def verify_request(self, request, client_address) -> bool:
        self.rung.append(client_address)
        return False  # closed at once


def test_plain_tcp_scheduler_off_this_machine_needs_insecure(capsys, monkeypatch):
    """Pickles would cross the network unencrypted: refused before any connection, unless
    --insecure (or JUPYTER_MN_INSECURE=1) says the network is trusted."""
    host = _routable_ipv4()
    if host is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    with _Doorbell(host) as door:
        address = f"tcp://{host}:{door.server_address[1]}"
        argv = ["doctor", "--backend", "dask", "--scheduler", address, "--start-timeout", "2"]
        try:
            assert jupyter_mn_cli(argv) == 2
            err = capsys.readouterr().err
            assert f"--scheduler {address} is plain TCP" in err and "--insecure" in err
            assert not door.rung

            assert jupyter_mn_cli([*argv, "--insecure"]) == 2  # it connects, to no scheduler
            assert "cannot connect to the dask scheduler" in capsys.readouterr().err
            assert door.rung
        finally:
            door.shutdown()
    monkeypatch.setenv("JUPYTER_MN_INSECURE", "1")
    assert ClusterSpec.build({"backend": "dask", "scheduler": address}).insecure


def test_plain_tcp_on_loopback_needs_insecure_unless_the_scheduler_is_this_kernels_own():
    """Every user of a login node or a JupyterHub host reaches its loopback addresses."""
    for loopback in ("tcp://127.0.0.1:8786", "tcp://[::1]:1", "tcp://localhost:1"):
        with pytest.raises(SpecError, match="any user of this machine, on loopback"):
            ClusterSpec(backend="dask", scheduler=loopback)
        assert ClusterSpec(backend="dask", scheduler=loopback, insecure=True)
    assert not ClusterSpec(backend="dask", scheduler="tls://10.0.0.5:8786").insecure
    with LocalCluster(n_workers=0, processes=False, protocol="tcp", dashboard_address=None) as own:
        assert own.scheduler_address.startswith("tcp://127.0.0.1:")
        assert not ClusterSpec(backend="dask", scheduler=own.scheduler_address).insecure


def test_2x2_gang_follows_the_contract_and_leaves_the_cluster_as_it_was(
    dask_tls, dask_cli, other_user, no_leftovers
):
    client, total = other_user
    pids = dask_cli.worker_pids()
    notes: list[str] = []
    cluster = dask_cluster(dask_tls, nodes=2, gpus=2)
    result = cluster.run(
        ENV_CHECK,
        return_all=True,
        on_event=lambda e: notes.append(e.text) if isinstance(e, Note) else None,
    )
    rows = [json.loads(v) for v in result.unwrap()]
    assert [r["info"]["nodes"] for r in rows[:1]] == [["127.0.0.1", "127.0.0.2"]]
    for rank, row in enumerate(rows):
        env = row["env"]
        assert row["rank"] == rank and row["ws"] == 4 and row["sum"] == 6
        assert int(env["NODE_RANK"]) == rank // 2 and int(env["LOCAL_RANK"]) == rank % 2
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert row["info"]["backend"] == "dask"
    assert any(n.startswith("preflight: ") and "✔" in n for n in notes), notes
    check_big_value(cluster, mib=16)
    check_big_push(cluster, mib=16)
    ranks = rank_processes(ours(no_leftovers))
    assert len(ranks) == 4
    lines: list[tuple[int, str]] = []
    with cluster.nodes() as gang:  # %cluster exec: its lines come on a topic of the gang's
        run_on_nodes(gang, "echo hi", [0, 1], 10, lambda *line: lines.append(line))
    assert sorted(lines) == [(0, "hi"), (1, "hi")]
    cluster.close()
    assert not wait_gone(ranks)
    # The user's cluster: same workers (same processes), the other client's work intact,
    # no key or claim of ours left on the scheduler.
    assert dask_cli.worker_pids() == pids
    assert client.status == "running" and total.result() == 45
    keys = [k for ks in client.has_what().values() for k in ks if "jupyter-mn" in str(k)]
    assert keys == []
    topics = client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler._broker._topics))
    assert not [t for t in topics if t.startswith("jupyter-mn-")]


def test_two_gangs_never_share_a_worker(dask_tls, no_leftovers):
    first = dask_cluster(dask_tls, nodes=2, gpus=1)
    first.up()
    second = dask_cluster(dask_tls, nodes=1, gpus=1, start_timeout=2)
    try:
        with pytest.raises(SchedulingError) as info:
            second.run("1")
        message = str(info.value)
        assert "0 host(s) available, 1 requested" in message
        assert f"is claimed by gang {first.gang.core.id}" in message
    finally:
        first.close()
    with dask_cluster(dask_tls, nodes=2, gpus=1) as third:  # the claims were given back
        assert third.run("1").value == 1


WHERE = "import os\nprint('{who} runs here')\nos.environ['MASTER_ADDR']"


def test_two_gangs_of_one_name_are_two_gangs(dask_tls, no_leftovers):
    """Two notebooks both call their gang "train" on one scheduler: each has its own agents and
    sees only its own logs, and releasing one leaves the other working."""
    from jupyter_mn.jobs.joblogs import read_logs
    from jupyter_mn.jobs.registry import Registry

    first = dask_cluster(dask_tls, nodes=1, gpus=1, name="train")
    second = dask_cluster(dask_tls, nodes=1, gpus=1, name="train")
    registry = Registry()
    try:
        first.up()
        second.up()
        assert first.gang.core.id != second.gang.core.id
        hosts = {
            first.run(WHERE.format(who="first")).value,
            second.run(WHERE.format(who="second")).value,
        }
        assert hosts == {"127.0.0.1", "127.0.0.2"}  # one node each, not one shared agent

        def logged(cluster: Cluster) -> list[str]:
            jobs = [j for j in registry.jobs() if j.gang == cluster.gang.core.id]
            assert len(jobs) == 1 and jobs[0].name == "train"
            return [line.text for line in read_logs(registry.log_dir(jobs[0].id))[0]]

        wait_until(lambda: "first runs here" in logged(first), what="the first gang's log")
        wait_until(lambda: "second runs here" in logged(second), what="the second gang's log")
        assert "second runs here" not in logged(first)
        assert "first runs here" not in logged(second)
        first.close()
        assert second.run(WHERE.format(who="second again")).value in hosts
        assert second.gang.core.status.usable
    finally:
        first.close()
        second.close()
        registry.close()


def test_too_few_hosts_says_what_is_missing(dask_tls, no_leftovers):
    started = time.monotonic()
    with pytest.raises(SchedulingError) as info:
        dask_cluster(dask_tls, nodes=3, start_timeout=2).run("1")
    assert "2 host(s) available, 3 requested" in str(info.value)
    assert time.monotonic() - started < 30
    # --same-host: every worker is a node; two workers exist.
    with pytest.raises(SchedulingError, match=r"2 worker\(s\) available, 3 requested"):
        dask_cluster(dask_tls, nodes=3, same_host=True, start_timeout=2).run("1")
    assert not rank_processes(ours(no_leftovers))  # none was ever started


# ---- choosing workers (pure functions over what the scheduler and workers report)
KERNEL = {"jupyter_mn": "0.1.0", "torch": "2.13.0"}


def _workers(*hosts: str) -> dict[str, dict]:
    return {f"tls://{h}:{9000 + i}": {"host": h, "name": f"w{i}"} for i, h in enumerate(hosts)}


def test_workers_without_packages_are_named_and_skipped():
    workers = _workers("10.0.0.1", "10.0.0.2", "10.0.0.3")
    addrs = list(workers)
    facts = {
        addrs[0]: {"jupyter_mn": "0.1.0", "torch": "2.13.0+cu128"},
        addrs[1]: {"jupyter_mn": "0.1.0", "torch": None},
        addrs[2]: Exception("ModuleNotFoundError(\"No module named 'jupyter_mn'\")"),
    }
    found = candidates(workers, facts, {}, KERNEL)
    assert [c.problem for c in found] == ["", "lacks torch 2.13.0", "lacks jupyter_mn"]
    spec = ClusterSpec(backend="dask", scheduler="tls://10.0.0.9:8786", nodes=3)
    message = shortage(spec, [found[0]], found, {})
    assert message.startswith("1 host(s) available, 3 requested")
    assert "host 10.0.0.2: worker w1 (tls://10.0.0.2:9001) lacks torch 2.13.0" in message
    assert "host 10.0.0.3: worker w2 (tls://10.0.0.3:9002) lacks jupyter_mn" in message


def test_matching_idle_workers_are_preferred_and_same_host_is_suggested():
    workers = _workers("10.0.0.1", "10.0.0.1", "10.0.0.2")
    addrs = list(workers)
    facts = {
        addrs[0]: {"jupyter_mn": "0.0.9", "torch": "2.13.0"},
        addrs[1]: {"jupyter_mn": "0.1.0", "torch": "2.13.0"},
        addrs[2]: {"jupyter_mn": "0.1.0", "torch": "2.13.0"},
    }
    found = candidates(workers, facts, {addrs[2]: ("someone-elses-task",)}, KERNEL)
    assert found[0].mismatch == "jupyter_mn 0.0.9 (kernel 0.1.0)"
    order = [c.name for c in sorted(found, key=preference)]
    assert order == ["w1", "w2", "w0"]  # matching and idle, matching but busy, mismatched
    spec = ClusterSpec(backend="dask", scheduler="tls://10.0.0.9:8786", nodes=3)
    assert "--same-host makes each worker a node" in shortage(spec, found[1:], found, {})
    assert isinstance(found[0], Candidate)


def test_a_silent_worker_is_not_asked_and_is_waited_for():
    """Cut off or frozen: asking it would wait for a connection timeout; it may come back."""
    workers = _workers("10.0.0.1", "10.0.0.2")
    addrs = list(workers)
    workers[addrs[0]]["last_seen"] = 1000.0
    workers[addrs[1]]["last_seen"] = 1000.0 - 12.4  # the scheduler's clock: the kernel's unused
    silent = silent_workers(workers)
    assert silent == {addrs[1]: pytest.approx(12.4)}
    facts = {addrs[0]: {"jupyter_mn": "0.1.0", "torch": "2.13.0"}}
    found = candidates(workers, facts, {}, KERNEL, silent)
    spec = ClusterSpec(backend="dask", scheduler="tls://10.0.0.9:8786", nodes=2)
    assert (
        "host 10.0.0.2: worker w1 (tls://10.0.0.2:9001) has not reached the scheduler for 12 s"
        in (shortage(spec, found[:1], found, {}))
    )
    assert could_change(spec, found, {})  # two hosts, neither claimed: only its silence
    assert not could_change(spec, candidates(workers, facts, {}, KERNEL), {})
    workers[addrs[1]]["last_seen"] = 1000.0 - 4  # one heartbeat late is not silent
    assert silent_workers(workers) == {}


@pytest.fixture
def bare_worker(dask_cli):
    """A worker whose environment lacks jupyter_mn: ``python -S`` skips the .pth files (our
    editable install is one) while site-packages stays importable through PYTHONPATH."""
    import site

    dask_cli.start_worker(
        "w-bare",
        "127.0.0.3",
        env={"PYTHONPATH": site.getsitepackages()[0]},
        python_flags=("-S",),
    )
    yield
    dask_cli.stop_worker("w-bare")


def test_a_worker_without_jupyter_mn_is_named_not_used(no_leftovers, dask_tls, bare_worker):
    with pytest.raises(SchedulingError) as info:
        dask_cluster(dask_tls, nodes=3, start_timeout=2).run("1")
    message = str(info.value)
    assert "2 host(s) available, 3 requested" in message
    assert "host 127.0.0.3: worker w-bare" in message and "lacks jupyter_mn" in message
    with dask_cluster(dask_tls, nodes=2, gpus=1) as cluster:  # the two good hosts
        assert cluster.run("cluster_info().nodes").value == ("127.0.0.1", "127.0.0.2")


@pytest.fixture
def own_dask(tmp_path):
    """A cluster of its own (a test that kills workers must not touch the shared one)."""
    from tests.support.daskcli import DaskCLI

    cli = DaskCLI.start(tmp_path, {"k0": "127.0.0.1", "k1": "127.0.0.2"})
    try:
        with dask.config.set(tls_config(cli.certs)):
            yield cli
    finally:
        cli.stop()


@pytest.mark.parametrize("backend", ["local", "dask"])
def test_killing_a_node_mid_cell_breaks_the_gang_and_the_next_cell_works(
    backend, request, no_leftovers
):
    options = {"nodes": 2, "gpus": 1}
    if backend == "dask":
        options.update(backend="dask", scheduler=request.getfixturevalue("own_dask").address)
    cluster = Cluster(**options)
    try:
        gang = cluster.up()
        ranks = rank_processes(ours(no_leftovers))
        pid = gang.core.nodes.client.run(os.getpid, workers=[gang.core.addresses[1]])[
            gang.core.addresses[1]
        ]
        threading.Timer(1.5, os.kill, (pid, signal.SIGKILL)).start()
        started = time.monotonic()
        result = cluster.run("import time\ntime.sleep(30)\ndist.barrier()")
        assert time.monotonic() - started < 15
        cause = result.root_cause
        assert (cause.node, cause.status, cause.error.ename) == (1, "lost", "NodeLost")
        with pytest.raises(NodeLost, match=r"node 1 was lost: its agent \(a dask worker\)"):
            result.unwrap()
        # torn down in the background: BROKEN at once, CLOSED soon after
        assert gang.core.status.value in ("BROKEN", "CLOSED") and "torn down" in " ".join(
            result.notes
        )
        assert not wait_gone(ranks)
        assert cluster.run("dist.get_world_size()").value == 2  # a fresh gang
    finally:
        cluster.close()
