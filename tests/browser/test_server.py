"""The REST API of the server extension on a real Jupyter server: behaviour and security."""

from __future__ import annotations

import http.cookiejar
import json
import os
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from jupyter_mn.jobs.joblogs import JobLogWriter
from jupyter_mn.jobs.registry import JobModel, NodeModel, Registry
from jupyter_mn.wire.events import LogLines
from tests.support.jobs import make_job
from tests.support.lab import jupyter_server

API = "/jupyter-mn/api/jobs"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def jobs(lab) -> dict[str, JobModel]:
    """A live job (no kernel answers it) and a finished one with logs, in the real registry;
    both 1×2, so ranks 0 and 1 write node 0's file."""
    registry = Registry()
    one_node = {"gpus": 2, "shape": "1×2", "nodes": [NodeModel(0, ranks=["ready", "ready"])]}
    live = make_job("srv-live", notebook=str(lab.root / "sub" / "train.ipynb"), **one_node)
    done = make_job(
        "srv-done", state="CLOSED", ended=time.time(), notebook="/elsewhere/x.ipynb", **one_node
    )
    for job in (live, done):
        registry.save(job)
        writer = JobLogWriter(registry.log_dir(job.id))
        writer.write(LogLines(0, 1, ((0, "out", ("zero-a", "zero-b")), (1, "err", ("one",)))))
        writer.close()
    yield {"live": live, "done": done}
    registry.close()


def _status(lab, path: str, method: str = "GET", token: bool = True) -> int:
    try:
        lab.api(path, method, token)
    except urllib.error.HTTPError as exc:
        return exc.code
    return 200


ENDPOINTS = [
    ("GET", API),
    ("GET", f"{API}/srv-live"),
    ("GET", f"{API}/srv-live/logs"),
    ("POST", f"{API}/srv-live/cancel"),
    ("POST", f"{API}/srv-live/release"),
    ("DELETE", f"{API}/srv-done"),
    ("DELETE", API),
    ("GET", "/jupyter-mn/api/submit?path=x.ipynb"),
    ("POST", "/jupyter-mn/api/submit"),
]


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_every_endpoint_refuses_a_client_without_token(lab, jobs, method, path):
    assert _status(lab, path, method, token=False) in (401, 403)


def test_jobs_list_with_notebook_link_under_the_server_root(lab, jobs):
    data = lab.api(API)
    by_id = {j["id"]: j for j in data["jobs"]}
    assert abs(data["now"] - time.time()) < 5
    assert by_id["srv-live"]["link"] == "sub/train.ipynb"
    assert by_id["srv-done"]["link"] is None  # outside the root: no link
    assert set(by_id["srv-live"]) == {f for f in JobModel.__dataclass_fields__}
    assert lab.api(f"{API}/srv-done")["state"] == "CLOSED"


def test_logs_filter_tail_and_cursor(lab, jobs):
    page = lab.api(f"{API}/srv-live/logs")
    assert [(x["rank"], x["text"]) for x in page["lines"]] == [
        (0, "zero-a"),
        (0, "zero-b"),
        (1, "one"),
    ]
    assert page["cursor"] == "0:3" and page["state"] == "READY"
    assert [x["text"] for x in lab.api(f"{API}/srv-live/logs?rank=1")["lines"]] == ["one"]
    assert [x["text"] for x in lab.api(f"{API}/srv-live/logs?tail=1")["lines"]] == ["one"]
    assert lab.api(f"{API}/srv-live/logs?after=0:3")["lines"] == []


@pytest.mark.parametrize(
    ("path", "method", "code"),
    [
        (f"{API}/nope", "GET", 404),
        (f"{API}/nope/cancel", "POST", 404),
        (f"{API}/srv-live/logs?tail=x", "GET", 400),
        (f"{API}/srv-live/logs?tail=99999", "GET", 400),
        (f"{API}/srv-live/logs?after=zz", "GET", 400),
        (f"{API}/srv-done/cancel", "POST", 409),
        (f"{API}/srv-live", "DELETE", 409),
        (f"{API}/srv-live/stop", "POST", 404),
    ],
)
def test_bad_requests_get_clear_errors(lab, jobs, path, method, code):
    try:
        lab.api(path, method)
    except urllib.error.HTTPError as exc:
        assert exc.code == code
        if not path.endswith("/stop"):  # an unknown route is tornado's own 404 page
            assert json.loads(exc.read())["message"]
    else:
        pytest.fail(f"{method} {path} succeeded")


def test_a_request_no_kernel_answers_is_accepted_and_shown_pending(lab, jobs):
    req = urllib.request.Request(
        f"{lab.url}{API}/srv-live/cancel",
        method="POST",
        headers={"Authorization": f"token {lab.token}"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 202
        assert json.loads(resp.read())["outcome"] is None
    assert "cancel" in lab.api(f"{API}/srv-live")["pending"]


def test_forget_deletes_a_finished_job_and_its_logs(lab, jobs):
    registry = Registry()
    registry.save(make_job("srv-old", state="ORPHANED"))
    JobLogWriter(registry.log_dir("srv-old")).close()
    assert lab.api(f"{API}/srv-old", "DELETE") is None
    assert "srv-old" not in {j["id"] for j in lab.api(API)["jobs"]}
    assert not registry.log_dir("srv-old").exists()


def test_cookie_session_needs_the_xsrf_token_to_post(lab, jobs):
    jar = http.cookiejar.CookieJar()
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    browser.open(f"{lab.url}/lab?token={lab.token}", timeout=30).read()
    xsrf = next(c.value for c in jar if c.name == "_xsrf")
    url = f"{lab.url}{API}/srv-done/release"
    with pytest.raises(urllib.error.HTTPError) as refused:
        browser.open(urllib.request.Request(url, method="POST", data=b""), timeout=10)
    assert refused.value.code == 403
    with pytest.raises(urllib.error.HTTPError) as passed:
        browser.open(
            urllib.request.Request(url, method="POST", data=b"", headers={"X-XSRFToken": xsrf}),
            timeout=10,
        )
    assert passed.value.code == 409  # past authentication and XSRF: the job is finished
    assert browser.open(f"{lab.url}{API}", timeout=10).status == 200  # GET needs no XSRF


def test_an_authorizer_that_denies_jupyter_mn_gets_403(tmp_path, monkeypatch, jobs):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    with jupyter_server(
        tmp_path, "--ServerApp.authorizer_class=tests.support.authz.NoJobs", module="jupyter_server"
    ) as server:
        assert _status(server, "/api/status") == 200  # the user is logged in
        for method, path in ENDPOINTS:
            assert _status(server, path, method) == 403, (method, path)


def test_a_slow_log_read_does_not_delay_another_request(lab, jobs):
    """A log file that blocks its reader (a FIFO nobody writes yet) must not stall the loop."""
    registry = Registry()
    registry.save(make_job("srv-slow"))
    fifo = registry.log_dir("srv-slow") / "node-0.log"
    fifo.parent.mkdir(mode=0o700)
    os.mkfifo(fifo, 0o600)
    slow = threading.Thread(target=_status, args=(lab, f"{API}/srv-slow/logs"), daemon=True)
    try:
        slow.start()
        window = time.monotonic() + 3  # the log read blocks early in it; every request answers
        while time.monotonic() < window:
            started = time.monotonic()
            assert "srv-slow" in {j["id"] for j in lab.api(API)["jobs"]}
            assert time.monotonic() - started < 10  # blocked, it would wait for the EOF below
        assert slow.is_alive()  # the log read is still blocked
    finally:
        os.close(os.open(fifo, os.O_WRONLY))  # the reader gets EOF and the request ends
        slow.join(20)
        registry.close()
    assert not slow.is_alive()


def test_a_rank_filter_reads_only_that_ranks_node(lab, jobs):
    """Node 0's file is a FIFO that would block any reader: rank 1 lives on node 1."""
    registry = Registry()
    registry.save(make_job("srv-rank"))
    writer = JobLogWriter(registry.log_dir("srv-rank"))
    writer.write(LogLines(1, 1, ((1, "out", ("from rank one",)),)))
    writer.close()
    fifo = registry.log_dir("srv-rank") / "node-0.log"
    os.mkfifo(fifo, 0o600)
    registry.close()
    try:
        page = lab.api(f"{API}/srv-rank/logs?rank=1")
    finally:
        fifo.unlink()
    assert [x["text"] for x in page["lines"]] == ["from rank one"]
