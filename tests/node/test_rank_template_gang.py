"""A real gang's ranks come from a rank template (``node/template.py``; a local gang's nodes
share one): fresh processes in every way a rank can tell, a restarted rank forked from the same
template."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import sys
from collections.abc import Iterator

import psutil
import pytest

from jupyter_mn import Cluster
from jupyter_mn.node import template
from jupyter_mn.node.process import start_in_session

#: What a rank is, as the cell sees it; and every descriptor of its node's template.
PROBE = """
import os, threading, psutil
me = psutil.Process()
def targets(pid):  # sockets and pipes by inode; anon inodes (epoll) have no identity here
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            found.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    return {t for t in found if not t.startswith("anon_inode:")}
{
    "pid": me.pid, "sid": os.getsid(0), "cmdline": me.cmdline(),
    "proc_rank": me.environ().get("RANK"), "proc_job": me.environ().get("JUPYTER_MN_JOB"),
    "parent": me.parent().pid, "parent_cmdline": me.parent().cmdline(),
    "shared": sorted(targets(me.pid) & targets(me.parent().pid)),
    "threads": sorted(t.name for t in threading.enumerate()),
    "cuda": torch.cuda.is_initialized(), "group": dist.get_rank(),
}
"""
FRESH_THREADS = ["MainThread", "jupyter-mn-parent-watch", "jupyter-mn-stacks"]
TEMPLATE = [sys.executable, "-m", "jupyter_mn.rank.prefork"]


def probe(gang) -> list[dict]:
    return gang.run(PROBE, return_all=True).unwrap()


# These two run before the module's gang is up: its background re-forming would count as theirs.
def test_the_template_is_off_when_asked(monkeypatch):
    monkeypatch.setenv(template.ENABLE, "0")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a loop of its own, whatever runs here
        started = pool.submit(asyncio.run, template.starter("jmn-off")).result()
    assert started is start_in_session
    before = set(psutil.Process().children())
    template.prestart("jmn-off")
    started = set(psutil.Process().children()) - before  # an earlier test's zombie is not
    assert not started, [" ".join(p.cmdline()) for p in started]


def test_nodes_closed_while_their_template_imports_end_it_without_a_word(capfd, no_leftovers):
    """A gang brought up without ranks and closed at once (``%cluster doctor`` does): its
    template is still importing, and ends quietly with its nodes."""
    with Cluster(nodes=2, gpus=1).nodes():
        pass
    assert "Traceback" not in capfd.readouterr().err


@pytest.fixture(scope="module")
def templated() -> Iterator[Cluster]:
    """A 2×2 gang, its ranks forked from a template (the default)."""
    with Cluster(nodes=2, gpus=2) as cluster:
        cluster.up()
        yield cluster


def test_ranks_are_fresh_processes_forked_from_the_gangs_template(templated):
    seen = probe(templated)
    for rank, info in enumerate(seen):
        assert info["group"] == rank
        assert info["parent_cmdline"] == TEMPLATE
        assert info["sid"] == info["pid"]  # it leads its session: gc's killpg reaches it all
        assert info["cmdline"] == [sys.executable, "-m", "jupyter_mn.rank.runtime"]
        assert (info["proc_rank"], info["proc_job"]) == (str(rank), templated.gang.core.id)
        assert info["shared"] == ["/dev/null"]  # nothing of the template's stayed open in it
        assert info["threads"] == FRESH_THREADS
        assert info["cuda"] is False
    (shared,) = {info["parent"] for info in seen}  # one for the local gang's nodes
    assert psutil.Process(shared).parent().pid == os.getpid()  # the kernel's: started first


def test_a_killed_rank_is_forked_again_from_the_same_template(templated):
    before = probe(templated)
    kill = "import os, signal\nif dist.get_rank() == 3:\n    os.kill(os.getpid(), signal.SIGKILL)"
    assert not templated.run(kill).ok
    after = probe(templated)
    assert after[3]["pid"] != before[3]["pid"]
    assert [a["parent"] for a in after] == [b["parent"] for b in before]
    assert [a["pid"] for a in after[:2]] == [b["pid"] for b in before[:2]]  # node 0's kept
    assert after[3]["threads"] == FRESH_THREADS and after[3]["shared"] == ["/dev/null"]
