"""Per-node log files: filters, tail, follow cursor, rotation, a line still being written."""

from __future__ import annotations

from pathlib import Path

from jupyter_mn.jobs.joblogs import JobLogWriter, format_cursor, parse_cursor, read_logs
from jupyter_mn.wire.events import LogLines


def _write(writer: JobLogWriter, node: int, rank: int, *lines: str, t: float = 1.0) -> None:
    writer.write(LogLines(node, 1, ((rank, "out", lines),)), now=t)


def test_filters_tail_and_order_across_nodes(tmp_path: Path):
    w = JobLogWriter(tmp_path)
    _write(w, 0, 0, "a0", "a1", t=1.0)
    _write(w, 1, 2, "b0", t=2.0)
    _write(w, 0, 1, "c0", t=3.0)
    lines, cursor = read_logs(tmp_path)
    assert [x.labelled for x in lines] == [
        "[node 0 rank 0] a0",
        "[node 0 rank 0] a1",
        "[node 1 rank 2] b0",
        "[node 0 rank 1] c0",
    ]
    assert cursor == {0: 3, 1: 1}
    assert [x.text for x in read_logs(tmp_path, node=0, rank=0)[0]] == ["a0", "a1"]
    assert [x.text for x in read_logs(tmp_path, tail=2)[0]] == ["b0", "c0"]
    assert read_logs(tmp_path, node=5) == ([], {})


def test_follow_returns_only_new_lines_and_the_cursor_skips_filtered_ones(tmp_path: Path):
    w = JobLogWriter(tmp_path)
    _write(w, 0, 0, "old")
    _, cursor = read_logs(tmp_path, rank=1)
    assert cursor == {0: 1}
    _write(w, 0, 0, "new-from-0")
    _write(w, 0, 1, "new-from-1")
    lines, cursor = read_logs(tmp_path, rank=1, after=parse_cursor(format_cursor(cursor)))
    assert [x.text for x in lines] == ["new-from-1"]
    assert cursor == {0: 3}
    assert read_logs(tmp_path, after=cursor)[0] == []


def test_rotation_bounds_the_files_and_keeps_sequence_numbers(tmp_path: Path):
    w = JobLogWriter(tmp_path, max_bytes=2000)
    for i in range(300):
        _write(w, 0, 0, f"line {i:04d} " + "x" * 20, t=float(i))
    w.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["node-0.log", "node-0.log.1"]
    assert all((tmp_path / f).stat().st_size <= 2000 for f in files)
    lines, cursor = read_logs(tmp_path, tail=1000)
    assert cursor == {0: 300}
    assert lines[-1].text.startswith("line 0299")
    seqs = [x.seq for x in lines]
    assert seqs == list(range(seqs[0], 301)) and len(seqs) > 40  # both files, no gap


def test_a_half_written_last_line_is_not_returned(tmp_path: Path):
    w = JobLogWriter(tmp_path)
    _write(w, 0, 0, "complete")
    with (tmp_path / "node-0.log").open("ab") as f:
        f.write(b"2\t1.0\t0\tout\tpart")
    lines, cursor = read_logs(tmp_path)
    assert [x.text for x in lines] == ["complete"] and cursor == {0: 1}


def test_text_with_tabs_and_markup_comes_back_verbatim(tmp_path: Path):
    w = JobLogWriter(tmp_path)
    text = "a\tb <img src=x onerror=alert(1)> é"
    _write(w, 0, 0, text)
    assert read_logs(tmp_path)[0][0].text == text


def test_a_mark_shows_once_across_nodes_and_whatever_rank_is_asked_for(tmp_path: Path):
    w = JobLogWriter(tmp_path)
    _write(w, 0, 0, "before", t=1.0)
    w.mark(2, "In[3] started 12:00:00", now=2.0)
    _write(w, 1, 3, "after", t=3.0)
    lines, _ = read_logs(tmp_path)
    assert [x.labelled for x in lines] == [
        "[node 0 rank 0] before",
        "──── In[3] started 12:00:00 ────",
        "[node 1 rank 3] after",
    ]
    assert [x.text for x in read_logs(tmp_path, node=1, rank=3)[0]] == [
        "In[3] started 12:00:00",
        "after",
    ]
