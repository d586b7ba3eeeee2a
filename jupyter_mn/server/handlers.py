"""REST handlers under ``/jupyter-mn/api/``: list and read jobs, read logs, cancel/release/forget
(one job, or every finished one); submitting a notebook is ``submitapi.py``.

Every handler requires Jupyter authentication and authorization (resource ``jupyter_mn``: reads
are "read", POST and DELETE are "write"); POST and DELETE also need the XSRF token or a token
header, as every Jupyter API does. Cancel and release become rows the owning kernel polls; the
handler waits briefly for the kernel's answer so the panel can say what happened.

SQLite and the log files are read on the event loop's thread pool, never on the loop itself: the
log viewer polls every second, and one slow read (a busy disk, a large file) must not stall the
rest of the Jupyter server.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.ioloop import IOLoop

from ..errors import JupyterMNError
from ..jobs.joblogs import format_cursor, parse_cursor, read_logs
from ..jobs.launch import stop_unanswered
from ..jobs.registry import JobModel, JobNotFound, Registry, RegistryError
from .runoutputs import remove_outputs

#: How long a cancel/release POST waits for the kernel's answer before replying 202.
ANSWER_WAIT_S = 3.0
MAX_TAIL = 5000
T = TypeVar("T")


class JobAPI(APIHandler):
    auth_resource = "jupyter_mn"

    def initialize(self, registry: Registry, root_dir: str) -> None:
        self.registry = registry
        self.root_dir = os.path.realpath(root_dir)

    def _model(self, job: JobModel) -> dict[str, Any]:
        """The job as JSON, with its notebook and a run's executed notebook as links when they
        lie under the server root."""
        job.link = self._link(job.notebook)
        job.output_link = self._link(job.output)
        return job.to_json()

    def _link(self, path: str | None) -> str | None:
        """``path`` relative to the server root, if it lies under it."""
        if not path or not os.path.isabs(path):
            return None
        path = os.path.realpath(path)
        if os.path.commonpath([path, self.root_dir]) != self.root_dir:
            return None
        return os.path.relpath(path, self.root_dir).replace(os.sep, "/")

    async def _off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the loop's thread pool (it reads SQLite or files)."""
        return await IOLoop.current().run_in_executor(None, fn, *args)

    async def _job(self, job_id: str) -> JobModel:
        try:
            return await self._off_loop(self.registry.job, job_id)
        except JobNotFound as exc:
            raise web.HTTPError(404, str(exc)) from None

    def _int(self, name: str, default: int | None, low: int = 0, high: int = 2**31) -> int | None:
        raw = self.get_query_argument(name, None)
        if raw in (None, ""):
            return default
        try:
            value = int(raw)
        except ValueError:
            raise web.HTTPError(400, f"{name} must be an integer, got {raw!r}") from None
        if not low <= value <= high:
            raise web.HTTPError(400, f"{name} must be between {low} and {high}, got {value}")
        return value


class JobsHandler(JobAPI):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        jobs = await self._off_loop(lambda: [self._model(job) for job in self.registry.jobs()])
        self.finish(json.dumps({"jobs": jobs, "now": time.time()}))

    @web.authenticated
    @authorized
    async def delete(self) -> None:
        """Forget every finished job, its logs and a run's executed notebook in the panel's folder
        ("Clear finished"); live jobs are untouched."""
        forgot = await self._off_loop(self.registry.forget_finished)
        await self._off_loop(remove_outputs, self.root_dir, forgot)
        self.finish(json.dumps({"forgot": forgot}))


class JobHandler(JobAPI):
    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        self.finish(json.dumps(self._model(await self._job(job_id))))

    @web.authenticated
    @authorized
    async def delete(self, job_id: str) -> None:
        """Forget a finished job, its logs and a run's executed notebook in the panel's folder."""
        await self._job(job_id)
        try:
            await self._off_loop(self.registry.forget, job_id)
        except RegistryError as exc:
            raise web.HTTPError(409, str(exc)) from None
        await self._off_loop(remove_outputs, self.root_dir, [job_id])
        self.set_status(204)
        self.finish()


class LogsHandler(JobAPI):
    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        """``?node=&rank=&tail=&after=``: the newest lines; ``after`` is the last reply's cursor."""
        job = await self._job(job_id)
        try:
            after = parse_cursor(self.get_query_argument("after", ""))
        except ValueError:
            raise web.HTTPError(400, "after must look like 0:12,1:40") from None
        node, rank = self._int("node", None), self._int("rank", None)
        tail = self._int("tail", 500, high=MAX_TAIL) or 0
        lines, cursor = await self._off_loop(
            lambda: read_logs(
                self.registry.log_dir(job.id),
                node=job.node_of(rank) if node is None and rank is not None else node,
                rank=rank,
                tail=tail,
                after=after,
            )
        )
        self.finish(
            json.dumps(
                {
                    "lines": [vars(line) for line in lines],
                    "cursor": format_cursor(cursor),
                    "state": job.state,
                }
            )
        )


class ActionHandler(JobAPI):
    @web.authenticated
    @authorized
    async def post(self, job_id: str, action: str) -> None:
        """Ask the job's kernel to cancel its running cell or release its gang (a run no runner
        answers is stopped here: ``launch.stop_unanswered``)."""
        job = await self._job(job_id)
        if action == "cancel":
            try:
                stopped = await self._off_loop(stop_unanswered, self.registry, job, None)
            except JupyterMNError as exc:
                raise web.HTTPError(409, str(exc)) from None
            if stopped is not None:
                self.finish(json.dumps({"request": None, "outcome": stopped.state}))
                return
        try:
            request = await self._off_loop(self.registry.request, job.id, action, "panel")
        except RegistryError as exc:
            raise web.HTTPError(409, str(exc)) from None
        deadline = time.monotonic() + ANSWER_WAIT_S
        outcome = await self._off_loop(self.registry.outcome, request)
        while outcome is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            outcome = await self._off_loop(self.registry.outcome, request)
        self.set_status(200 if outcome else 202)
        self.finish(json.dumps({"request": request, "outcome": outcome}))


def setup_handlers(web_app: Any, registry: Registry, root_dir: str) -> None:
    base = url_path_join(web_app.settings["base_url"], "jupyter-mn", "api", "jobs")
    job = r"/(?P<job_id>[\w.-]+)"
    options = {"registry": registry, "root_dir": root_dir}
    web_app.add_handlers(
        ".*$",
        [
            (base, JobsHandler, options),
            (base + job, JobHandler, options),
            (base + job + "/logs", LogsHandler, options),
            (base + job + "/(?P<action>cancel|release)", ActionHandler, options),
        ],
    )
