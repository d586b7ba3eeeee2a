"""Notebooks under papermill with the "Python 3 (jupyter_mn)" kernel (no %load_ext needed)."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import papermill
import pytest

ROOT = Path(__file__).resolve().parents[2]

CONTRACT = [
    ("parameters", "nodes = 1\ngpus = 1"),
    (
        None,
        "%%cluster --nodes $nodes --gpus $gpus --all\nimport os\n"
        "env = {k: os.environ[k] for k in ['RANK', 'LOCAL_RANK', 'WORLD_SIZE', "
        "'LOCAL_WORLD_SIZE', 'NODE_RANK', 'NNODES', 'MASTER_ADDR', 'MASTER_PORT']}\n"
        "t = torch.tensor([1.0 + dist.get_rank()])\ndist.all_reduce(t)\n"
        "print('hello from', env['RANK'])\n(env, t.item())",
    ),
    (
        None,
        "rows = _\nworld = nodes * gpus\nassert len(rows) == world\n"
        "assert {r[0]['MASTER_PORT'] for r in rows} == {rows[0][0]['MASTER_PORT']}\n"
        "for rank, (env, total) in enumerate(rows):\n"
        "    assert int(env['RANK']) == rank and int(env['WORLD_SIZE']) == world\n"
        "    assert int(env['NODE_RANK']) == rank // gpus == int(env['RANK']) // gpus\n"
        "    assert int(env['LOCAL_RANK']) == rank % gpus\n"
        "    assert int(env['LOCAL_WORLD_SIZE']) == gpus and int(env['NNODES']) == nodes\n"
        "    assert env['MASTER_ADDR'] == '127.0.0.1'\n"
        "    assert total == world * (world + 1) / 2\n"
        "'contract ok'",
    ),
    (None, "%cluster down"),
]


def _notebook(cells: list[tuple[str | None, str]], path: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["language_info"] = {"name": "python"}
    for tag, source in cells:
        cell = nbformat.v4.new_code_cell(source)
        if tag:
            cell.metadata["tags"] = [tag]
        nb.cells.append(cell)
    nbformat.write(nb, path)
    return path


def _texts(nb: nbformat.NotebookNode | list) -> str:
    out = []
    for cell in nb if isinstance(nb, list) else nb.cells:
        for o in cell.get("outputs", []):
            out.append(o.get("text") or o.get("data", {}).get("text/plain", "") or "")
    return "\n".join(out)


@pytest.mark.parametrize(("nodes", "gpus"), [(1, 1), (1, 3), (2, 2), (3, 1)])
def test_env_contract_notebook_on_every_shape(tmp_path, nodes, gpus, no_leftovers):
    src = _notebook(CONTRACT, tmp_path / "contract.ipynb")
    nb = papermill.execute_notebook(
        str(src),
        str(tmp_path / "out.ipynb"),
        kernel_name="jupyter_mn",
        parameters={"nodes": nodes, "gpus": gpus},
        progress_bar=False,
    )
    text = _texts(nb)
    assert "'contract ok'" in text
    for rank in range(nodes * gpus):
        assert f"[node {rank // gpus} rank {rank}] hello from {rank}" in text


def run_quickstart(out: Path) -> None:
    """The quick-start notebook, top to bottom, under papermill; its key outputs are there."""
    nb = papermill.execute_notebook(
        str(ROOT / "notebooks" / "01-quickstart.ipynb"),
        str(out),
        kernel_name="jupyter_mn",
        progress_bar=False,
        cwd=str(ROOT / "notebooks"),
    )
    text = _texts(nb)
    assert "6.0" in text and "final loss" in text and "cluster released" in text
    assert "already loaded" not in text  # the kernel's own preload keeps %load_ext quiet


def test_quickstart_notebook(tmp_path, no_leftovers):
    run_quickstart(tmp_path / "out.ipynb")


@pytest.mark.slow
def test_ddp_training_notebook_recovers_from_a_lost_rank(tmp_path, no_leftovers):
    nb = papermill.execute_notebook(
        str(ROOT / "notebooks" / "02-ddp-training.ipynb"),
        str(tmp_path / "out.ipynb"),
        kernel_name="jupyter_mn",
        parameters={"workdir": str(tmp_path / "run")},
        progress_bar=False,
        cwd=str(tmp_path),
    )
    text = _texts(nb)
    assert "retry 1/1: rank 3 (node 1) was lost; running the cell again" in text
    for rank in range(4):
        assert f"[node {rank // 2} rank {rank}] resumed from step 100 (step-000000100)" in text
    assert "bitwise identical: True" in text
    assert "['step-000000160', 'step-000000180', 'step-000000200']" in text


def test_a_breakpoint_under_papermill_is_skipped_and_said(tmp_path, no_leftovers):
    src = _notebook(
        [
            (
                None,
                "%%cluster --nodes 1 --gpus 2\nx = dist.get_rank() + 40\n"
                "if dist.get_rank() == 1:\n    breakpoint()\nx + 2",
            ),
            (None, "%cluster down"),
        ],
        tmp_path / "stops.ipynb",
    )
    nb = papermill.execute_notebook(
        str(src), str(tmp_path / "out.ipynb"), kernel_name="jupyter_mn", progress_bar=False
    )
    text = _texts(nb)
    assert "42" in _texts(nb.cells[:1])  # rank 0's value: nothing waited for a prompt
    assert "rank 1 skipped breakpoint() at Cell In[" in text
    assert "rank 0 skipped" not in text


def test_failing_cell_fails_the_run_with_the_rank_and_its_traceback(tmp_path, no_leftovers):
    src = _notebook(
        [
            (
                None,
                "%%cluster --nodes 1 --gpus 2\nif dist.get_rank() == 1:\n"
                "    raise RuntimeError('bad shard')\n",
            )
        ],
        tmp_path / "fail.ipynb",
    )
    with pytest.raises(papermill.PapermillExecutionError) as info:
        papermill.execute_notebook(
            str(src), str(tmp_path / "out.ipynb"), kernel_name="jupyter_mn", progress_bar=False
        )
    err = info.value
    assert err.ename == "CellError"
    assert "rank 1 (node 0) raised RuntimeError: bad shard" in err.evalue
    assert any("line 2" in line for line in err.traceback)
    out = nbformat.read(tmp_path / "out.ipynb", 4)
    assert out.cells[-1].metadata.papermill.status == "failed"


def test_batch_output_keeps_logs_the_summary_table_and_the_widget_state(tmp_path, no_leftovers):
    src = _notebook(
        [
            (None, "%%cluster --nodes 2 --gpus 1\nfor i in range(30):\n    print('step', i)\n"),
            (None, "%%cluster --view widget\nprint('from the widget cell')\n1 + 1"),
            (None, "%cluster down"),
        ],
        tmp_path / "views.ipynb",
    )
    nb = papermill.execute_notebook(
        str(src), str(tmp_path / "out.ipynb"), kernel_name="jupyter_mn", progress_bar=False
    )
    text = _texts(nb.cells[0:1])
    assert "[node 1 rank 1] step 29" in text  # every line, as text
    took = r"[\d.]+ s( \(\+[\d.]+ s start\))?"  # the cell's time, and the wait for its gang
    header = rf"jupyter_mn: cell \d+ · DONE · 2×1 local · no GPU · {took} · gang READY"
    assert re.search(header, text)
    assert "no GPU" not in text.split("gang READY")[1]  # said once, plainly: no NVML words
    assert "NVML" not in text and "node 1: gloo (CPU)" in text
    assert " rank  node  status" in text
    widget_out = nb.cells[1].outputs
    shown = next(o for o in widget_out if o["output_type"] == "display_data")
    # folded when the cell ended (update_display_data): plain HTML (nbclient keeps the state of
    # every model it saw opened in the metadata, closed or not)
    assert "application/vnd.jupyter.widget-view+json" not in shown["data"]
    assert "[rank 0] from the widget cell" in shown["data"]["text/html"]
    plain = shown["data"]["text/plain"]
    assert "[rank 1] from the widget cell" in plain and "node 0: gloo (CPU)" in plain
    assert "· DONE ·" in plain and "· gang READY" in plain


@pytest.mark.slow
@pytest.mark.timeout(900)  # imports Lightning, transformers and inductor on four loaded ranks
def test_frameworks_notebook_trains_with_each_framework(tmp_path, no_leftovers):
    nb = papermill.execute_notebook(
        str(ROOT / "notebooks" / "05-frameworks.ipynb"),
        str(tmp_path / "out.ipynb"),
        kernel_name="jupyter_mn",
        progress_bar=False,
        cwd=str(tmp_path),
    )
    text = _texts(nb)
    for value in [
        "(4, 'gloo', True, False)",
        "('fabric', 4, True)",
        "('trainer', 4, 4)",
        "('accelerate', 4, True)",
        "('hf trainer', 4, 3)",
        "('fsdp2', True, (8, 8), (16, 8))",
        "('compile', True)",
    ]:
        assert value in text
    for rank in range(4):
        assert re.search(rf"\[node {rank // 2} rank {rank}\] rank {rank}: loss \d", text)
    assert "cluster released" in text
