"""A real gang's ranks come from their node's template (``node/template.py``): fresh processes
in every way a rank can tell, a restarted rank forked from the same template."""

from __future__ import annotations

import asyncio
import concurrent.futures
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


# These two run before the module's templated gang is up: its background re-forming would
# count as theirs.
@pytest.mark.parametrize("value", [None, "0"])
def test_the_template_is_off_unless_asked_for(monkeypatch, value):
    if value is None:
        monkeypatch.delenv(template.ENABLE, raising=False)
    else:
        monkeypatch.setenv(template.ENABLE, value)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a loop of its own, whatever runs here
        started = pool.submit(asyncio.run, template.starter("jmn-off")).result()
    assert started is start_in_session
    template.prestart("jmn-off")
    assert not [p for p in psutil.Process().children() if p.cmdline() == TEMPLATE]


def test_nodes_closed_while_their_templates_import_end_them_without_a_word(
    capfd, monkeypatch, no_leftovers
):
    """A gang brought up without ranks and closed at once (``%cluster doctor`` does): its
    templates are still importing, and end quietly with their nodes."""
    monkeypatch.setenv(template.ENABLE, "1")
    with Cluster(nodes=2, gpus=1).nodes():
        pass
    assert "Traceback" not in capfd.readouterr().err


@pytest.fixture(scope="module")
def templated() -> Iterator[Cluster]:
    """A 2×2 gang whose nodes start their ranks from templates (opt-in)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv(template.ENABLE, "1")  # the local nodes inherit it
        with Cluster(nodes=2, gpus=2) as cluster:
            cluster.up()
            yield cluster


def test_ranks_are_fresh_processes_forked_from_their_nodes_template(templated):
    seen = probe(templated)
    for rank, info in enumerate(seen):
        assert info["group"] == rank
        assert info["parent_cmdline"] == TEMPLATE
        assert info["sid"] == info["pid"]  # it leads its session: gc's killpg reaches it all
        assert info["cmdline"] == [sys.executable, "-m", "jupyter_mn.rank.runtime"]
        assert (info["proc_rank"], info["proc_job"]) == (str(rank), templated.gang.id)
        assert info["shared"] == ["/dev/null"]  # nothing of the template's stayed open in it
        assert info["threads"] == FRESH_THREADS
        assert info["cuda"] is False
    templates = [info["parent"] for info in seen]
    assert templates[0] == templates[1] != templates[2] == templates[3]  # one per node


def test_a_killed_rank_is_forked_again_from_the_same_template(templated):
    before = probe(templated)
    kill = "import os, signal\nif dist.get_rank() == 3:\n    os.kill(os.getpid(), signal.SIGKILL)"
    assert not templated.run(kill).ok
    after = probe(templated)
    assert after[3]["pid"] != before[3]["pid"]
    assert [a["parent"] for a in after] == [b["parent"] for b in before]
    assert [a["pid"] for a in after[:2]] == [b["pid"] for b in before[:2]]  # node 0's kept
    assert after[3]["threads"] == FRESH_THREADS and after[3]["shared"] == ["/dev/null"]
