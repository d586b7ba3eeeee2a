"""``%cluster exec`` lines on the kernel side: each shown once, in order, gaps filled at the end."""

from __future__ import annotations

from jupyter_mn.gang import shell
from jupyter_mn.gang.shell import _Lines


def _event(worker: str, lines: list[str], upto: int) -> dict:
    return {"token": "t", "worker": worker, "lines": lines, "upto": upto}


def test_lines_missed_or_late_come_from_the_reply_once_each(monkeypatch):
    monkeypatch.setattr(shell, "_LAST_LINES_S", 0.2)  # line 5 of node 0 will never come
    shown: list[tuple[int, str]] = []
    lines = _Lines({"w0": 0, "w1": 1}, lambda node, line: shown.append((node, line)))
    lines.arrived.put({"token": "t"})  # a probe: not a line
    lines.arrived.put(_event("w0", ["c", "d"], 4))  # lines 1-2 never came (sent before we listened)
    lines.arrived.put(_event("w1", ["x"], 1))
    for _ in range(3):
        lines.show(0)
    assert shown == [(0, "c"), (0, "d"), (1, "x")]
    # the replies: node 0 wrote 5 lines, node 1 wrote 3 of which the reply kept the last 2
    answers = {
        "w0": {"lines": 5, "output": "a\nb\nc\nd\ne\n"},
        "w1": {"lines": 3, "output": "y\nz"},
    }
    lines.arrived.put(_event("w1", ["y"], 2))  # late, but in time
    lines.finish(answers)
    assert shown[3:] == [(1, "y"), (0, "a"), (0, "b"), (0, "e"), (1, "z")]
