"""Hangs seen from a real kernel on one 2×2 gloo gang: the verdict names the rank that holds the
others up, the collective and its number, and the cell line, before the stacks (``--timeout``),
as the cell's error, and live while the cell runs (``--hang-timeout``). The verdict's logic on
records alone is in ``tests/model/test_verdict.py``; tests run in file order on the one gang."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.support.kernels import Kernel, Reply, module_kernel

HANG = "jupyter_mn: hang: "
#: every case leaves a gang whose next cell works; ``x`` shows which ranks kept their namespace
CHECK = "%%cluster --all\nt = torch.ones(1)\ndist.all_reduce(t)\n(t.item(), 'x' in globals())"


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    with module_kernel("%%cluster --nodes 2 --gpus 2 --view text\nx = 1") as k:
        yield k


def hang(
    kernel: Kernel, body: str, timeout: float = 3, kept: tuple[int, ...] = (0, 1, 2, 3)
) -> Reply:
    """Run ``body`` with ``--timeout``; the cell must end interrupted, and the next one work with
    the ranks in ``kept`` still holding their namespace (none killed: it ended promptly)."""
    reply = kernel.run(f"%%cluster --timeout {timeout:g}\n{body}", timeout=120)
    assert reply.ename == "CellInterrupted", reply.error_text
    after = kernel.run(CHECK, timeout=120)
    assert after.result == repr([(4.0, rank in kept) for rank in range(4)]), after.error_text
    assert kernel.run("%%cluster\nx = 1").status == "ok"  # for the next case's check
    return reply


def verdict(reply: Reply) -> str:
    """The verdict, said once: in the error after the stop's reason, not again above the
    stacks."""
    assert HANG not in reply.stderr, reply.stderr
    reason, _, text = (reply.evalue or "").partition(": ")
    assert reason.startswith("--timeout "), reply.evalue
    return text


def test_a_rank_that_skips_the_all_reduce_is_named_with_its_cell_line(kernel):
    reply = hang(
        kernel,
        "import time\nt = torch.ones(1)\nif dist.get_rank() != 3:\n    dist.all_reduce(t)\n"
        "else:\n    time.sleep(60)",
    )
    text = verdict(reply)
    assert re.fullmatch(
        r"rank 3 \(node 1\) never entered all_reduce #\d+ \(pg \d+, float32\[1\]\); the other 3 "
        r"ranks have waited in it for \d\.\d s; rank 3 is at Cell In\[\d+\], line 6: "
        r"time\.sleep\(60\)",
        text,
    ), text
    assert reply.evalue == f"--timeout 3 s reached: {text}"


def test_ranks_that_call_another_op_are_a_mismatch(kernel):
    reply = hang(
        kernel,
        "t = torch.ones(1)\nif dist.get_rank() < 2:\n    dist.all_reduce(t)\nelse:\n"
        "    dist.barrier()",
    )
    text = verdict(reply)
    assert re.fullmatch(
        r"collective mismatch at #\d+ \(pg \d+\): ranks 0, 1 are in all_reduce\(float32\[1\]\), "
        r"ranks 2, 3 in barrier",
        text,
    ), text
    assert text in reply.evalue


def test_a_rank_that_reduces_another_size_is_a_mismatch(kernel):
    reply = hang(kernel, "t = torch.ones(2 if dist.get_rank() == 3 else 1)\ndist.all_reduce(t)")
    assert verdict(reply).endswith(
        "ranks 0, 1, 2 are in all_reduce(float32[1]), rank 3 in all_reduce(float32[2])"
    )


def test_a_member_missing_from_a_subgroup_is_named_with_the_group(kernel):
    """Rank 2 is no member of "experts" and is not blamed. Ranks blocked in a subgroup's
    collective are not freed by the abort (it closes the default group's connections), so
    node 0's are killed and restarted."""
    reply = hang(
        kernel,
        "import time\nexperts = dist.new_group([0, 1, 3], group_desc='experts')\n"
        "t = torch.ones(1)\nif dist.get_rank() in (0, 1):\n    dist.all_reduce(t, group=experts)\n"
        "else:\n    time.sleep(60)",
        kept=(2, 3),
    )
    text = verdict(reply)
    assert re.fullmatch(
        r"rank 3 \(node 1\) never entered all_reduce #1 \(pg \d+ \(experts\), float32\[1\]\); the "
        r"other 2 ranks have waited in it for \d\.\d s; rank 3 is at Cell In\[\d+\], line 7: "
        r"time\.sleep\(60\)",
        text,
    ), text


def test_ranks_busy_in_their_own_code_get_the_stacks_and_no_verdict(kernel):
    reply = hang(kernel, "import time\ntime.sleep(60)", timeout=2)
    assert HANG not in reply.stderr
    assert "[node 1 rank 3] running" in reply.stderr and "time.sleep(60)" in reply.stderr
    assert "was interrupted: KeyboardInterrupt" in reply.evalue


def test_the_watchdog_shows_the_verdict_while_the_cell_runs_on(kernel):
    msgs = kernel.iopub_during(
        "%%cluster --hang-timeout 5\nimport time\nt = torch.ones(1)\nif dist.get_rank() == 3:\n"
        "    time.sleep(12)\ndist.all_reduce(t)\ntime.sleep(2)\nt.item()",
        timeout=120,
    )
    start = next(m["received"] for m in msgs if m["msg_type"] == "execute_input")
    shown = [m for m in msgs if m["msg_type"] == "stream" and HANG in m["content"]["text"]]
    assert shown, [m["content"] for m in msgs if m["msg_type"] == "stream"]
    text = shown[0]["content"]["text"]
    assert re.search(
        r"rank 3 \(node 1\) never entered all_reduce #\d+ \(pg \d+, float32\[1\]\)", text
    )
    assert "rank 3 is at Cell In[" in text and "(--hang-timeout); still running" in text
    seen_after = shown[0]["received"] - start
    result = next(m for m in msgs if m["msg_type"] == "execute_result")
    assert result["content"]["data"]["text/plain"] == "4.0"  # the cell went on and finished
    assert 5 <= seen_after < result["received"] - start, seen_after
    streams = [m for m in msgs if m["msg_type"] == "stream"]
    over = [m for m in streams if "the hang is over" in m["content"]["text"]]
    assert over and shown[0]["received"] < over[0]["received"] < result["received"]


def test_a_cell_that_keeps_completing_collectives_never_triggers_the_watchdog(kernel):
    """Ranks 0-2 spend the cell waiting in all_reduces for rank 3, which joins one every 0.2 s:
    slow, but progressing, for ten times the watchdog's patience."""
    reply = kernel.run(
        "%%cluster --hang-timeout 1\nimport time\nfor step in range(50):\n    t = torch.ones(1)\n"
        "    if dist.get_rank() == 3:\n        time.sleep(0.2)\n    dist.all_reduce(t)\nt.item()",
        timeout=120,
    )
    assert reply.result == "4.0", reply.error_text
    assert HANG not in reply.stderr + reply.stdout


def test_a_rank_frozen_inside_the_all_reduce_is_named(kernel):
    """Rank 2 enters the all_reduce, then SIGSTOPs itself; the others arrive after it."""
    reply = hang(
        kernel,
        "import os, signal, threading, time\nt = torch.ones(1)\nif dist.get_rank() == 2:\n"
        "    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGSTOP)).start()\nelse:\n"
        "    time.sleep(1.5)\ndist.all_reduce(t)",
        kept=(0, 1),  # node 1's ranks were killed and restarted
    )
    text = verdict(reply)
    assert re.fullmatch(
        r"rank 2 \(node 1\) is silent \(rank 2: no answer: its process is stopped \(SIGSTOP or a "
        r"debugger\)\); the other 3 ranks have waited in all_reduce #\d+ \(pg \d+, float32\[1\]\) "
        r"for \d\.\d s",
        text,
    ), text
    assert "then rank 2 (node 1) was lost: killed by SIGKILL" in reply.error_text
