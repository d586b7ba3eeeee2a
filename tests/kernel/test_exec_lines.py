"""``%cluster exec`` lines on the kernel side: each shown once, in order, gaps filled at the end."""

from __future__ import annotations

from jupyter_mn.gang.shell import _Lines


def _event(worker: str, lines: list[str], upto: int) -> dict:
    return {"token": "t", "worker": worker, "lines": lines, "upto": upto}


def test_lines_missed_or_late_come_from_the_reply_once_each():
    shown: list[tuple[int, str]] = []
    lines = _Lines({"w0": 0, "w1": 1}, lambda node, line: shown.append((node, line)))
    lines.show(_event("w0", ["c", "d"], 4))  # lines 1-2 never came (sent before we listened)
    lines.show(_event("w1", ["x"], 1))
    assert shown == [(0, "c"), (0, "d"), (1, "x")]
    # the replies: node 0 wrote 5 lines, node 1 wrote 3 of which the reply kept the last 2
    answers = {
        "w0": {"lines": 5, "output": "a\nb\nc\nd\ne\n"},
        "w1": {"lines": 3, "output": "y\nz"},
    }
    waited: list[float] = []

    def wait(until: float) -> None:  # line 2 of node 1 arrives late but in time; 5 never does
        waited.append(until)
        lines.show(_event("w1", ["y"], 2))
        assert not lines.complete()

    lines.finish(answers, wait)
    assert len(waited) == 1
    assert shown[3:] == [(1, "y"), (0, "a"), (0, "b"), (0, "e"), (1, "z")]
    assert lines.complete()
