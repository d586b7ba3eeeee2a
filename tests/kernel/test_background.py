"""``%%cluster --bg`` handles: what ``output`` keeps over a kernel's life."""

from __future__ import annotations

import re
import time

from jupyter_mn.cli import main as jupyter_mn_cli
from jupyter_mn.kernel.background import OUTPUT_LINES

_NOTE = re.compile(
    r"^jupyter_mn: (\d+) earlier line\(s\) are not kept here: `jupyter mn logs (\S+)` shows"
)


def test_a_background_cell_keeps_its_newest_lines_and_names_the_logs_for_the_rest(gang_2x2, capsys):
    per_rank = OUTPUT_LINES // 4 + 500
    handle = gang_2x2.submit(f"for i in range({per_rank}):\n    print('line', i)")
    assert handle.cell_result(timeout=120).ok
    note, *kept = handle.output.splitlines()
    found = _NOTE.match(note)
    assert found, note
    assert len(kept) == OUTPUT_LINES and int(found.group(1)) >= 4 * per_rank - OUTPUT_LINES
    for rank in range(4):
        assert f"[node {rank // 2} rank {rank}] line {per_rank - 1}" in kept
    # the job's logs have every line: rank 3's first one is there
    first = "[node 1 rank 3] line 0"
    argv = ["logs", found.group(2), "--rank", "3", "--tail", str(per_rank)]
    deadline = time.monotonic() + 30
    while True:  # the registry writes the lines from its own thread: polled, with a deadline
        assert jupyter_mn_cli(argv) == 0
        shown = capsys.readouterr().out.splitlines()
        if len(shown) == per_rank or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert shown[0] == first and len(shown) == per_rank
