"""``python -m jupyter_mn.jobs.podrunner``: a submitted run inside its Kubernetes driver pod.

``kuberun.py`` creates the driver (a Job) with the run's Secret mounted at ``RUN_DIR``: the
notebook, ``run.json`` (the ``Submission``'s job and parameters, and the run's row) and the key
that seals the log's records (the ``--env`` values are the ``JUPYTER_MN_ENV`` its kernel
inherits, from the same Secret). The run is ``runner.Run`` as on a laptop, with the pod's own
registry (a private runtime directory: the kernel's gangs are recorded there too); its kernel's
``%%cluster`` cells make their gangs with the pod's ServiceAccount (in-cluster config), owned by
this pod, so deleting the Job takes them with it. What the submitter sees goes to stdout, the
pod's log (``podlog.py``): the cells' output lines and, sealed with the key, the progress and
the executed notebook after each save. SIGTERM (``jupyter mn cancel`` deletes the Job) cancels
the run as a cancel request does: the running cell is interrupted and the kernel's gangs are
released before the pod's grace period ends.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path

from .joblogs import Marks, read_logs
from .podlog import Progress, notebook_line, progress_line
from .registry import JobModel, Registry
from .runner import POLL_S, Run
from .runstate import RunState
from .submit import Submission

#: The variable naming the mounted Secret's folder.
RUN_DIR = "JUPYTER_MN_RUN_DIR"
#: The Secret's files: the notebook, the run's row and parameters, the key of the log's records.
NOTEBOOK, RUN, KEY = "notebook.ipynb", "run.json", "key"


class Publisher:
    """Copies the run's log lines, progress and saved notebook to stdout as they change."""

    def __init__(self, run: Run, key: str) -> None:
        self.run, self.key = run, key
        self.output = Path(run.submission.output)
        self._cursor: dict[int, int] = {}
        self._marks = Marks()
        self._progress: Progress | None = None
        self._saved = 0

    def follow(self) -> None:
        while not self.run.done.wait(POLL_S):
            self.publish()

    def publish(self) -> None:
        directory = self.run.registry.log_dir(self.run.model.id)
        lines, self._cursor = read_logs(directory, tail=100_000, after=self._cursor)
        out = [line.labelled for line in self._marks.fresh(lines)]
        model = self.run.model
        progress = Progress(model.state, model.cells, model.cells_total, model.detail, model.error)
        if progress != self._progress:
            self._progress = progress
            out.append(progress_line(self.key, progress))
        saved = self.output.stat().st_mtime_ns if self.output.exists() else 0
        if saved != self._saved:
            text = self.output.read_text()
            try:
                json.loads(text)
                self._saved = saved
                out.append(notebook_line(self.key, text))
            except ValueError:  # papermill is writing it: the next poll reads it whole
                pass
        if out:
            print("\n".join(out), flush=True)


def main() -> int:
    run_dir = Path(os.environ[RUN_DIR])
    home = Path(tempfile.mkdtemp(prefix="jupyter-mn-run-"))
    os.environ["JUPYTER_RUNTIME_DIR"] = str(home / "runtime")  # the pod's own registry
    os.chdir(home)  # the notebook's folder, as on a laptop: its cells' files, nothing else
    given = json.loads((run_dir / RUN).read_text())
    model = JobModel.from_json(given["model"])
    registry = Registry()
    registry.save(model)
    shutil.copyfile(run_dir / NOTEBOOK, home / NOTEBOOK)
    submission = Submission(
        model.id, str(home / NOTEBOOK), str(home / "output.ipynb"), given["parameters"]
    )
    run = Run(submission, registry)
    signal.signal(signal.SIGTERM, lambda *_: run.cancel())
    publisher = Publisher(run, (run_dir / KEY).read_text())
    thread = threading.Thread(target=publisher.follow, name="jupyter-mn-publish", daemon=True)
    thread.start()
    run.run()
    thread.join()
    publisher.publish()  # the last lines, the end state and the final notebook
    return 0 if run.model.state == RunState.SUCCEEDED.value else 1


if __name__ == "__main__":
    sys.exit(main())
