"""A ``%%cluster --bg`` cell's handle in a real kernel, used as the README shows it: fetched with
``h = %cluster last`` after another cell returned a value, its output shown as lines, its
summary with the gang's shape and the cell's number."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.kernels import Kernel, module_kernel

BG = (
    "%%cluster --nodes 2 --gpus 1 --bg\nimport time\nfor i in range(3):\n    print('step', i)\n"
    "time.sleep(0.5)\n'done'"
)


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    with module_kernel() as k:
        yield k


def test_the_newest_background_handle_survives_other_cells_values(kernel):
    none = kernel.run("%cluster last")
    assert none.status == "error" and "no %%cluster --bg cell has run" in none.stderr
    started = kernel.run(BG)
    assert started.status == "ok" and "running" in started.result
    assert kernel.run("41 + 1").result == "42"  # `_` is 42 now, not the handle
    assert kernel.run("h = %cluster last").status == "ok"
    assert kernel.run("h.result(timeout=120)").result == "'done'"
    output = kernel.run("h.output").result  # as lines, not a repr full of \n escapes
    assert "\\n" not in output and not output.startswith("'")
    assert "[node 1 rank 1] step 2\n" in output
    # its summary: the 2×1 gang and the cell's own number
    assert f"cell {started.execution_count} · DONE · 2×1 local" in output, output
    assert f"In[{started.execution_count}]: done" in kernel.run("h").result
