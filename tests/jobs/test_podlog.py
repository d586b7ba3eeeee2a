"""What a Kubernetes driver pod's log carries, read back as ``fetch`` and ``list`` read it."""

from __future__ import annotations

import base64
import gzip
import json

from cryptography.fernet import Fernet

from jupyter_mn.jobs.podlog import MARK, PodLog, Progress, new_key, notebook_line, progress_line

KEY = new_key()


def test_the_last_notebook_and_progress_are_read_back_between_output_lines():
    first, last = json.dumps({"cells": [1]}), json.dumps({"cells": [1, 2], "text": "é\x1e"})
    text = "\n".join(
        [
            "──── cell 1 of 2 started 12:00:00 ────",
            progress_line(KEY, Progress("RUNNING", 1, 2, "cell 1 of 2")),
            notebook_line(KEY, first),
            "[node 0 rank 0] step 0",
            progress_line(KEY, Progress("SUCCEEDED", 2, 2, "done")),
            notebook_line(KEY, last),
            "",
        ]
    )
    log = PodLog.parse(text, KEY)
    assert log.lines == ["──── cell 1 of 2 started 12:00:00 ────", "[node 0 rank 0] step 0"]
    assert log.progress == Progress("SUCCEEDED", 2, 2, "done")
    assert log.notebook == last


def test_a_log_without_records_has_neither():
    assert PodLog.parse("kernel starting\n", KEY) == PodLog(["kernel starting"], None, None)


def test_records_are_sealed_so_a_reader_without_the_key_finds_no_notebook_in_them():
    line = notebook_line(KEY, json.dumps({"source": "token = 'hf_secret'"}))
    packed = line[len(MARK) :].encode()
    assert b"hf_secret" not in base64.urlsafe_b64decode(packed)
    assert PodLog.parse(line, new_key()).notebook is None  # another run's key opens nothing


def test_a_record_printed_by_the_notebook_is_an_output_line_and_a_malformed_one_breaks_nothing():
    """What a notebook prints may start like a record; without the run's key it is none, and
    nothing shaped like one, however malformed, makes ``parse`` raise."""
    seal = Fernet(KEY.encode()).encrypt
    printed = [
        MARK + "progress " + json.dumps({"state": "SUCCEEDED", "cells": 9, "cells_total": 9}),
        MARK + "notebook " + base64.b64encode(gzip.compress(b"{}")).decode(),
        MARK + "progress {",
        MARK,
        progress_line(new_key(), Progress("SUCCEEDED", 2, 2)),
        MARK + seal(b"not gzip").decode(),
        MARK + seal(gzip.compress(b"[1, 2]")).decode(),
        MARK + seal(gzip.compress(b'{"progress": {"state": "x"}}')).decode(),
    ]
    text = "\n".join([progress_line(KEY, Progress("RUNNING", 1, 2)), *printed, ""])
    log = PodLog.parse(text, KEY)
    assert log.progress == Progress("RUNNING", 1, 2)
    assert log.notebook is None
    assert log.lines == printed
