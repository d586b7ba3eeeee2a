"""Checkpoint helpers in one process (no gang): layout, COMPLETE marker, RNG, retention, errors.

The multi-rank case (a rank killed mid-training, resumed bit for bit) is in test_faults.py.
"""

from __future__ import annotations

import json
import random
from datetime import timedelta

import numpy
import pytest
import torch
import torch.distributed as dist

from jupyter_mn import checkpoint
from jupyter_mn.errors import CheckpointError


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(16, 4)).sum().backward()
    opt.step()
    return model, opt


def _draws() -> tuple[float, float, float]:
    return random.random(), float(numpy.random.rand()), torch.rand(1).item()


def test_round_trip_restores_model_optimizer_values_and_rng(tmp_path):
    model, opt = _model()
    path = checkpoint.save({"model": model, "opt": opt, "epoch": 3}, tmp_path, 40)
    assert sorted(p.name for p in path.iterdir()) == ["COMPLETE", "manifest.json", "rank-00000.pt"]
    manifest = json.loads((path / "manifest.json").read_text())
    assert (manifest["step"], manifest["world_size"], manifest["keys"]) == (
        40,
        1,
        ["epoch", "model", "opt"],
    )
    expected = _draws()

    fresh, fresh_opt = _model()
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    restored = checkpoint.load(checkpoint.latest(tmp_path), {"model": fresh, "opt": fresh_opt})
    assert (restored["step"], restored["epoch"]) == (40, 3)
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert fresh_opt.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]
    assert _draws() == expected  # python, numpy and torch draw what they drew after the save


def test_latest_skips_checkpoints_without_the_complete_marker(tmp_path):
    model, _ = _model()
    checkpoint.save({"model": model}, tmp_path, 20)
    checkpoint.save({"model": model}, tmp_path, 40)
    (tmp_path / "step-000000040" / "COMPLETE").unlink()  # as if a rank died while saving
    (tmp_path / "step-000000060").mkdir()
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    assert checkpoint.latest(tmp_path).name == "step-000000020"
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        checkpoint.load(tmp_path / "step-000000040")
    assert checkpoint.latest(tmp_path / "missing") is None


def test_keep_deletes_all_but_the_newest(tmp_path):
    model, _ = _model()
    for step in (10, 20, 30, 40):
        checkpoint.save({"model": model}, tmp_path, step, keep=2)
    assert [p.name for p in checkpoint.complete(tmp_path)] == ["step-000000030", "step-000000040"]


def test_shards_of_another_gang_size_are_refused_unless_asked_for(tmp_path, monkeypatch):
    model, _ = _model()
    checkpoint.save({"model": model}, tmp_path, 5)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(CheckpointError, match=r"written by 1 rank\(s\); this is rank 1 of 2"):
        checkpoint.load(checkpoint.latest(tmp_path), {"model": model})
    assert checkpoint.load(checkpoint.latest(tmp_path), {"model": model}, rank=0)["step"] == 5
    with pytest.raises(CheckpointError, match="has no 'opt'"):
        checkpoint.load(checkpoint.latest(tmp_path), {"opt": object()}, rank=0)


@pytest.mark.parametrize(
    ("step", "keep", "message"),
    [(-1, None, "step must be a non-negative integer"), (1, 0, "keep must be a positive")],
)
def test_bad_arguments_are_refused_before_writing(tmp_path, step, keep, message):
    with pytest.raises(CheckpointError, match=message):
        checkpoint.save({}, tmp_path / "c", step, keep=keep)
    assert not (tmp_path / "c").exists()


def test_prime_ddp_changes_no_state(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=timedelta(seconds=9))
    try:
        model, _ = _model()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        example = torch.randn(4, 4)
        rng = torch.get_rng_state()
        checkpoint.prime_ddp(ddp, example)
        assert torch.equal(torch.get_rng_state(), rng)
        after = model.state_dict()
        assert all(torch.equal(before[k], after[k]) for k in before)  # BN statistics included
        assert all(p.grad is None for p in model.parameters()) and ddp.training
    finally:
        dist.destroy_process_group()
