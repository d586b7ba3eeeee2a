"""What a Kubernetes driver pod's log carries, read back as ``fetch`` and ``list`` read it."""

from __future__ import annotations

import json

from jupyter_mn.jobs.podlog import PodLog, Progress, notebook_line, progress_line


def test_the_last_notebook_and_progress_are_read_back_between_output_lines():
    first, last = json.dumps({"cells": [1]}), json.dumps({"cells": [1, 2], "text": "é\x1e"})
    text = "\n".join(
        [
            "──── cell 1 of 2 started 12:00:00 ────",
            progress_line(Progress("RUNNING", 1, 2, "cell 1 of 2")),
            notebook_line(first),
            "[node 0 rank 0] step 0",
            progress_line(Progress("SUCCEEDED", 2, 2, "done")),
            notebook_line(last),
            "",
        ]
    )
    log = PodLog.parse(text)
    assert log.lines == ["──── cell 1 of 2 started 12:00:00 ────", "[node 0 rank 0] step 0"]
    assert log.progress == Progress("SUCCEEDED", 2, 2, "done")
    assert log.notebook == last


def test_a_log_without_records_has_neither():
    assert PodLog.parse("kernel starting\n") == PodLog(["kernel starting"], None, None)
