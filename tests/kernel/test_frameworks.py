"""Training frameworks run unchanged in cells, on one shared 2×2 gang (real packages, CPU/gloo).

Each framework must see ranks that look like torchrun's children: not interactive, torchelastic's
variables set, the process group already there. Ranks see different data; a framework that
synchronizes leaves equal weights. Nothing is downloaded: models are built from configs, data in
the cell.
"""

from __future__ import annotations

import pytest

from jupyter_mn import Cluster

pytest.importorskip("lightning")
pytest.importorskip("accelerate")
pytest.importorskip("transformers")


def _value(cluster: Cluster, code: str) -> object:
    return cluster.run(code).unwrap()


def test_a_rank_looks_like_a_torchrun_child(gang_2x2: Cluster) -> None:
    code = """
import os, sys
(hasattr(sys, "ps1"), dist.is_torchelastic_launched(), os.environ["TORCHELASTIC_RUN_ID"] != "")
"""
    assert _value(gang_2x2, code) == (False, True, True)


def test_lightning_fabric_ddp_trains_on_the_gangs_group(gang_2x2: Cluster) -> None:
    code = """
import lightning as L
fabric = L.Fabric(strategy="ddp", devices=2, num_nodes=2)
fabric.launch()
model = torch.nn.Linear(4, 1)
model, opt = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
x = torch.randn(8, 4, device=fabric.device) + fabric.global_rank
for _ in range(3):
    opt.zero_grad()
    fabric.backward(model(x).pow(2).mean())
    opt.step()
w = model.weight.detach()
same = bool((fabric.all_gather(w) - w).abs().max() == 0)
(fabric.world_size, type(fabric.strategy).__name__, same)
"""
    assert _value(gang_2x2, code) == (4, "DDPStrategy", True)


def test_lightning_trainer_ddp_fits(gang_2x2: Cluster) -> None:
    code = """
import lightning as L

class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, i):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
trainer = L.Trainer(strategy="ddp", devices=2, num_nodes=2, max_steps=4, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=8))
(trainer.world_size, trainer.global_step, dist.get_world_size())
"""
    assert _value(gang_2x2, code) == (4, 4, 4)


def test_accelerate_prepares_and_syncs_across_ranks(gang_2x2: Cluster) -> None:
    code = """
from accelerate import Accelerator
acc = Accelerator()
model = torch.nn.Linear(4, 1)
model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
x = torch.randn(8, 4, device=acc.device) + acc.process_index
for _ in range(3):
    opt.zero_grad()
    acc.backward(model(x).pow(2).mean())
    opt.step()
w = acc.unwrap_model(model).weight.detach()
same = bool((acc.gather(w[None]) - w).abs().max() == 0)
(acc.num_processes, acc.distributed_type.name, same)
"""
    assert _value(gang_2x2, code) == (4, "MULTI_CPU", True)


def test_hf_trainer_trains_a_model_built_from_a_config(gang_2x2: Cluster) -> None:
    code = """
import tempfile
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=16))
ids = torch.randint(0, 64, (64, 16), generator=torch.Generator().manual_seed(0))
args = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=3, report_to=[],
                         per_device_train_batch_size=4, save_strategy="no", disable_tqdm=True)
data = [{"input_ids": row, "labels": row} for row in ids]
trainer = Trainer(model=model, args=args, train_dataset=data)
out = trainer.train()
(args.world_size, out.global_step, args.parallel_mode.name)
"""
    assert _value(gang_2x2, code) == (4, 3, "DISTRIBUTED")


def test_fsdp2_shards_over_a_device_mesh(gang_2x2: Cluster) -> None:
    code = """
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
device = "cuda" if torch.cuda.is_available() else "cpu"
mesh = init_device_mesh(device, (2, 2), mesh_dim_names=("node", "local"))
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
for part in (model[0], model[2], model):
    fully_shard(part, mesh=mesh)  # a 2-D mesh: HSDP, sharded within a node, replicated across
opt = torch.optim.Adam(model.to(device).parameters(), lr=1e-2)
x = torch.randn(4, 8, device=device)
for _ in range(3):
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
w = model[0].weight
full = w.full_tensor()
same = full.clone()
dist.broadcast(same, 0)
(isinstance(w, DTensor), tuple(w.to_local().shape), tuple(full.shape), torch.equal(full, same))
"""
    assert _value(gang_2x2, code) == (True, (8, 8), (16, 8), True)


def test_torch_compile_compiles_a_ddp_model_in_a_cell(gang_2x2: Cluster) -> None:
    # inductor, the default backend: it compiles C++ on this CPU machine (gcc)
    code = """
device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
compiled = torch.compile(torch.nn.parallel.DistributedDataParallel(model.to(device)))
x = torch.randn(4, 8, device=device)
compiled(x).sum().backward()
grad = model[0].weight.grad
same = grad.clone()
dist.broadcast(same, 0)
(bool(torch.allclose(compiled(x), model(x))), bool(torch.equal(grad, same)))
"""
    assert _value(gang_2x2, code) == (True, True)
