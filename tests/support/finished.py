"""A notebook of finished ``%%cluster`` cells as a real run leaves it: its cells run once through
a real kernel (nbclient, the widget view forced), saved with the widget state of the models
still open at the end, which is what JupyterLab's "save widget state" keeps (a closed model
leaves its manager), and signed as Lab signs what it saves. ``bench/labheap.py`` and
``tests/browser/test_lab_finished.py`` open it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient
from nbformat.sign import NotebookNotary

CLUSTER_CELL = (
    "%%cluster --nodes 2 --gpus 1 --view widget\nt = torch.ones(1)\ndist.all_reduce(t)\n"
    "print('loss', t.item())\nt.item()"
)
#: the plain notebook's cell: the same print and value, in the kernel itself
PLAIN_CELL = "t = 2.0\nprint('loss', t)\nt"


class _LabLikeClient(NotebookClient):
    """nbclient keeps a closed model's state; a Lab save does not."""

    def handle_comm_msg(self, outs: list[Any], msg: dict[str, Any], cell_index: int) -> None:
        super().handle_comm_msg(outs, msg, cell_index)
        if msg["msg_type"] == "comm_close":
            self.widget_state.pop(msg["content"]["comm_id"], None)


def run_notebook(path: Path, cell: str, count: int) -> Path:
    """``count`` copies of ``cell`` then ``%cluster down``, run in a real jupyter_mn kernel and
    saved at ``path`` with their outputs and the open models' widget state."""
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(cell) for _ in range(count)]
        + [nbformat.v4.new_code_cell("%cluster down")]
    )
    nb.metadata["kernelspec"] = {
        "name": "jupyter_mn",
        "display_name": "Python 3 (jupyter_mn)",
        "language": "python",
    }
    here = {"metadata": {"path": str(path.parent)}}
    client = _LabLikeClient(nb, timeout=300, kernel_name="jupyter_mn", resources=here)
    client.execute()
    NotebookNotary().sign(nb)  # trusted, as a notebook its user saved: its HTML is not sanitized
    nbformat.write(nb, path)
    return path
