"""What the submitter of a Kubernetes run keeps of its driver, in its private registry (the run's
log directory, 0700; the file 0600), out of the run's row, which ``jupyter mn list --json`` and
the panel show: the key that seals the driver log's records (``podlog.py``) and the UID of the
driver's Job. The UID is how the driver is found again: a Job of the same name made after this
one was deleted, or a pod labelled like the driver, is not it (``kuberun.py``).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from .registry import RegistryError, open_private

FILE = "driver.json"


@dataclass(frozen=True)
class DriverRef:
    key: str
    job_uid: str

    def save(self, log_dir: Path) -> None:
        log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = open_private(log_dir / FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        with os.fdopen(fd, "w") as out:
            json.dump(asdict(self), out)

    @classmethod
    def load(cls, log_dir: Path, job_id: str) -> DriverRef:
        try:
            return cls(**json.loads((log_dir / FILE).read_text()))
        except (OSError, ValueError, TypeError):
            raise RegistryError(
                f"run {job_id}: no record of its driver here (it was submitted from another "
                "machine or user, or by an older jupyter_mn)"
            ) from None
