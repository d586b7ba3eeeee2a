"""``Cluster.launch(fn, *args, **kwargs)``: an existing function on every rank of a 2×2 gang."""

from __future__ import annotations

from typing import Any

import pytest

from jupyter_mn import Cluster
from jupyter_mn.errors import CellError, SpecError
from jupyter_mn.kernel.runfunction import parse_call

#: Functions as a notebook defines them: in ``__main__``, reading a notebook global.
NOTEBOOK = """
SCALE = 10

def train(steps, *, fn="sum", fail_rank=-1):
    import torch, torch.distributed as dist
    rank = dist.get_rank()
    if rank == fail_rank:
        raise ValueError(f"bad batch on rank {rank}")
    t = torch.tensor([float(rank + 1)])
    for _ in range(steps):
        dist.all_reduce(t)
    print("rank", rank, "done")
    return {"rank": rank, "total": t.item() * SCALE, "fn": fn}
"""


@pytest.fixture
def notebook() -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(NOTEBOOK, namespace)
    return namespace


def test_launch_calls_a_notebook_function_on_every_rank_and_returns_rank_0s_value(
    gang_2x2: Cluster, notebook: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    value = gang_2x2.launch(notebook["train"], 1, fn="mean")
    assert value == {"rank": 0, "total": 100.0, "fn": "mean"}  # (1+2+3+4) × SCALE
    out = capsys.readouterr().out
    for rank in range(4):
        assert f"[node {rank // 2} rank {rank}] rank {rank} done" in out
    # the ranks keep their namespaces: a cell still works after a launch
    assert gang_2x2.run("t = torch.ones(1)\ndist.all_reduce(t)\nt.item()").value == 4.0


def test_a_failing_launch_raises_the_root_cause_and_bad_input_starts_nothing(
    gang_2x2: Cluster, notebook: dict[str, Any]
) -> None:
    with pytest.raises(CellError, match=r"rank 2 .*ValueError: bad batch on rank 2"):
        gang_2x2.launch(notebook["train"], 1, fail_rank=2)
    cells = gang_2x2.cells
    with pytest.raises(SpecError, match="launch needs a function to run on the ranks, not int"):
        gang_2x2.launch(42)
    assert gang_2x2.cells == cells  # refused before anything ran
    assert gang_2x2.launch(notebook["train"], 0)["total"] == 10.0  # the gang re-formed


def test_parse_call_evaluates_the_arguments_in_the_notebook() -> None:
    def train(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("parse_call must not call it")

    namespace = {"train": train, "cfg": {"lr": 0.1}}
    assert parse_call(" train(cfg, 3, name='a b') ", namespace) == (
        train,
        ({"lr": 0.1}, 3),
        {"name": "a b"},
    )
    assert parse_call("train", namespace) == (train, (), {})
    with pytest.raises(SpecError, match=r"not a function call .*flags go before ' -- '"):
        parse_call("--nodes 2 train", namespace)
    with pytest.raises(SpecError, match=r"\*args and \*\*kwargs are not supported"):
        parse_call("train(*cfg)", namespace)
    with pytest.raises(SpecError, match="needs a function"):
        parse_call("  ", namespace)
