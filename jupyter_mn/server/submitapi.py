"""``/jupyter-mn/api/submit``: JupyterLab's "Submit notebook" command, through ``jobs/submit.py``.

GET ``?path=NB`` reads the notebook's form (its parameters with their values, its first
``%%cluster`` cell's flags), so the command asks for the parameters it has. POST ``{"path",
"parameters"}`` submits it with that cell's flags as the run's defaults: the same checks and the
same one-line errors as ``jupyter mn submit`` (a 400 whose message is the line; nothing is
submitted). The executed notebook is written into the folder the panel manages
(``runoutputs.py``), so the panel can open it and deletes it when the run is forgotten. Paths
are the server's (relative to its root, never outside it, never a hidden file unless the
contents manager serves those). Submitting runs code and writes a file: it needs what Jupyter's
own kernels and contents ask, ``execute`` on ``kernels`` and ``write`` on ``contents``, besides
``write`` on the extension's resource.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
from pathlib import Path
from typing import Any

from jupyter_core.paths import is_hidden
from jupyter_server.auth.decorator import authorized
from jupyter_server.utils import url_path_join
from tornado import web

from ..errors import JupyterMNError
from ..jobs.launch import launch
from ..jobs.registry import JobModel, Registry
from ..jobs.submit import Prepared, notebook_form, prepare
from ..model.credentials import mask_argv
from .handlers import JobAPI
from .runoutputs import output_path


class SubmitHandler(JobAPI):
    def _notebook(self, path: Any) -> str:
        """``path`` (relative to the server root) as an absolute path under the root; a hidden
        one (``.hidden/nb.ipynb``) is not there, as the contents manager says of it."""
        if not isinstance(path, str) or not path:
            raise web.HTTPError(400, "path: the notebook's path relative to the server root")
        full = os.path.realpath(os.path.join(self.root_dir, path))
        if os.path.commonpath([full, self.root_dir]) != self.root_dir:
            raise web.HTTPError(403, f"{path} is outside the server's root")
        if not self.contents_manager.allow_hidden and is_hidden(full, self.root_dir):
            raise web.HTTPError(404, f"no notebook {path} (hidden files are not served)")
        return full

    @web.authenticated
    @authorized
    @authorized("read", resource="contents")  # the notebook's parameters, with their values
    async def get(self) -> None:
        notebook = self._notebook(self.get_query_argument("path", ""))
        try:
            form = await self._off_loop(notebook_form, notebook)
        except JupyterMNError as exc:
            raise web.HTTPError(400, str(exc)) from None
        self.finish(json.dumps({"parameters": form.parameters, "cluster": form.line}))

    @web.authenticated
    @authorized
    @authorized("execute", resource="kernels")  # a kernel runs the notebook's code
    @authorized("write", resource="contents")  # its executed notebook is written beside it
    async def post(self) -> None:
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError:
            raise web.HTTPError(400, "the body is not JSON") from None
        notebook = self._notebook(body.get("path"))
        parameters = body.get("parameters", {})
        if not isinstance(parameters, dict) or not all(
            isinstance(v, str) for v in parameters.values()
        ):
            raise web.HTTPError(400, "parameters: an object of names to values as text")
        try:
            job = await self._off_loop(self._submit, notebook, list(parameters.items()))
        except JupyterMNError as exc:
            raise web.HTTPError(400, str(exc)) from None
        self.set_status(201)
        self.finish(json.dumps(self._model(job)))

    def _submit(self, notebook: str, parameters: list[tuple[str, str]]) -> JobModel:
        form = notebook_form(notebook)
        prepared = prepare(notebook, None, parameters, None, form.flags, _launcher(form.line))
        output = output_path(self.root_dir, prepared.model.id)
        return launch(_writing(prepared, output), self.registry)


def _launcher(line: str) -> str:
    """The run's origin as the panel and ``jupyter mn list`` show it, credentials masked (the
    line parsed when the form was read)."""
    return f"JupyterLab: submit {' '.join(mask_argv(shlex.split(line)))}".strip()[:300]


def _writing(prepared: Prepared, path: Path) -> Prepared:
    """``prepared`` writing its executed notebook to ``path``."""
    output = str(path)
    return dataclasses.replace(
        prepared,
        submission=dataclasses.replace(prepared.submission, output=output),
        model=dataclasses.replace(prepared.model, output=output),
    )


def setup_submit_handler(web_app: Any, registry: Registry, root_dir: str) -> None:
    base = url_path_join(web_app.settings["base_url"], "jupyter-mn", "api", "submit")
    options = {"registry": registry, "root_dir": root_dir}
    web_app.add_handlers(".*$", [(base, SubmitHandler, options)])
