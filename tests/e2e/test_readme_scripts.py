"""The README's Python API examples, and those of docs/, pasted into a file and run with plain
``python file.py``.

They are read from README.md and docs/*.md themselves, so the docs cannot drift from what works.
No example has a ``if __name__ == "__main__":`` guard, as a user's script often has none. The
output each ``print`` is expected to give is the comment at the end of its line: those lines end
the script's output (what jupyter_mn shows of a run, e.g. ``Cluster.launch``'s view, comes
before them).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_PRINTED = re.compile(r"^\s*print\(.*\)\s*#\s*(.+?)\s*$", re.M)


def script_examples(pages: list[Path] = PAGES) -> list[str]:
    """The pages' Python blocks that make their own ``Cluster``: a script, not a cell."""
    return [b for p in pages for b in _BLOCK.findall(p.read_text()) if "Cluster(" in b]


def test_the_readme_has_script_examples():
    assert script_examples([README])
    assert all(_PRINTED.search(s) for s in script_examples()), "each example says what it prints"


@pytest.mark.parametrize("script", script_examples())
def test_a_readme_example_runs_as_a_plain_script(script, tmp_path, no_leftovers):
    path = tmp_path / "train.py"
    path.write_text(script)
    run = subprocess.run(
        [sys.executable, str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-4000:]
    expected = _PRINTED.findall(script)
    assert run.stdout.splitlines()[-len(expected) :] == expected, run.stdout
