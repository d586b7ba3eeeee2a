"""Debugging a rank from a real kernel whose client answers its input requests, as a notebook's
input box does: ``%cluster debug`` after a failed cell, ``breakpoint()`` in a cell, and both
where nothing can answer (papermill's way: ``allow_stdin`` false). One kernel and one 2×2 gang
serve the module; a plain script with stdin piped covers the Python API."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from collections import Counter
from collections.abc import Iterator

import pytest

from tests.support.kernels import Kernel
from tests.support.procs import ours, started_now, wait_gone

FAILING = """%%cluster --nodes 2 --gpus 2
def inner(batch):
    local_name = batch * 100 + dist.get_rank()
    raise ValueError(f"bad batch {batch}")

def outer():
    batch = 7
    return inner(batch)

keep = dist.get_rank() * 11
if dist.get_rank() == 1:
    outer()
dist.barrier()
"""

PAUSING = """%%cluster --nodes 2 --gpus 2 --timeout 3
y = dist.get_rank() * 10
if dist.get_rank() in (1, 3):
    breakpoint()
y + 5
"""


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    started = started_now()
    k = Kernel()
    yield k
    k.run("%cluster down")
    k.shutdown()
    left = wait_gone(ours(started))
    assert not left, "processes left running:\n" + "\n".join(left)


def test_post_mortem_shows_the_failed_ranks_frames_and_leaves_the_gang_as_it_was(kernel):
    failed = kernel.run(FAILING)
    assert failed.ename == "CellError" and "rank 1" in failed.evalue
    typed = iter(["p local_name", "up", "p batch", "where", "q"])
    debug = kernel.run("%cluster debug", answer=lambda prompt: next(typed))
    assert debug.status == "ok", debug.error_text
    assert debug.prompts == ["(Pdb rank 1) "] * 5
    out = debug.stdout
    assert "ValueError: bad batch 7" in out
    assert "\n701\n" in out  # the local of rank 1's failing frame: 7 * 100 + 1
    assert "\n7\n" in out  # ``up``: its caller's local
    assert "inner(batch)" in out and "outer()" in out  # ``where``
    after = kernel.run("%%cluster --all\nkeep")  # namespaces intact, every rank answers
    assert after.status == "ok", after.error_text
    assert after.result == "[0, 11, 22, 33]"


def test_debug_refuses_what_it_cannot_debug_in_one_line(kernel):
    kernel.run(FAILING)
    no_rank = kernel.run("%cluster debug --rank 9")
    assert no_rank.ename == "DebugUnavailable"
    assert no_rank.evalue == "there is no rank 9 (ranks 0-3)"
    no_stdin = kernel.run("%cluster debug", allow_stdin=False)
    assert no_stdin.ename == "DebugUnavailable" and "cannot answer a prompt" in no_stdin.evalue
    kernel.run("%%cluster\n1")
    passed = kernel.run("%cluster debug")
    assert passed.ename == "DebugUnavailable" and "did not fail" in passed.evalue
    assert passed.prompts == []


def test_breakpoints_on_two_ranks_prompt_in_turn_each_labelled_and_the_cell_returns(kernel):
    asked: Counter[str] = Counter()

    def answer(prompt: str) -> str:
        asked[prompt] += 1
        if sum(asked.values()) == 1:  # the user thinks longer than --timeout 3: it waits
            threading.Event().wait(4)
        return "p dist.get_rank()" if asked[prompt] == 1 else "c"

    reply = kernel.run(PAUSING, answer=answer)
    assert reply.status == "ok", reply.error_text
    assert reply.elapsed > 4
    assert reply.result == "5"
    assert sorted(reply.prompts) == ["(Pdb rank 1) "] * 2 + ["(Pdb rank 3) "] * 2
    first = reply.prompts[0]
    assert reply.prompts[1] == first  # one rank's session, then the other's
    for rank in (1, 3):
        assert f"\n{rank}\n" in reply.stdout


def test_a_breakpoint_without_a_frontend_to_answer_is_skipped_with_a_line(kernel):
    reply = kernel.run(PAUSING, allow_stdin=False, timeout=60)
    assert reply.status == "ok", reply.error_text
    assert reply.result == "5" and reply.prompts == []
    text = reply.stdout + reply.stderr
    for rank in (1, 3):
        assert f"rank {rank} skipped breakpoint() at Cell In[" in text


SCRIPT = textwrap.dedent(
    """
    from jupyter_mn import Cluster

    c = Cluster(nodes=1, gpus=2)
    failed = c.run("def f(a):\\n    local = a + 40\\n    raise KeyError(a)\\n"
                   "if dist.get_rank() == 1:\\n    f(2)\\n")
    print("failed on rank", failed.root_cause.rank)
    c.debug()
    print("value", c.run("y = 5\\nbreakpoint()\\ny + dist.get_rank()").value)
    print("torch's", c.run("dist.breakpoint(rank=1)\\n7").value)
    c.close()
    """
)


def test_the_python_api_debugs_from_a_piped_stdin(tmp_path, no_leftovers):
    script = tmp_path / "debug_me.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)],
        input="p local\nq\n" + "p y + 1\nc\n" * 2 + "p dist.get_rank() + 100\nc\n",
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "failed on rank 1" in out
    assert "(Pdb rank 1) 42\n" in out  # the prompt input() wrote, then pdb's answer
    assert "(Pdb rank 0) 6\n" in out and "(Pdb rank 1) 6\n" in out
    assert "value 5\n" in out
    assert "(Pdb rank 1) 101\n" in out  # torch.distributed.breakpoint: no /dev/stdin needed
    assert out.rstrip().endswith("torch's 7")


def test_the_stop_button_at_an_open_prompt_interrupts_the_cell_and_the_gang_goes_on(kernel):
    def stop(prompt: str) -> None:
        kernel.km.interrupt_kernel()  # the notebook's stop button; the prompt is never answered

    reply = kernel.run(PAUSING, answer=stop)
    assert reply.prompts and reply.prompts[0] in ("(Pdb rank 1) ", "(Pdb rank 3) ")
    assert reply.ename == "CellInterrupted", reply.error_text
    assert "was interrupted: KeyboardInterrupt" in reply.evalue  # not killed: its pdb let go
    assert "killed" not in reply.error_text and "restarted" not in reply.error_text
    after = kernel.run("%%cluster\n6 * 7")
    assert after.status == "ok", after.error_text
    assert after.result == "42"
