"""A real dask cluster started from the CLI (``dask scheduler`` / ``dask worker``) with TLS.

Like a user's cluster: its own processes and sessions, certificates made here with
``cryptography`` (a CA and one certificate for scheduler, workers and clients). Workers listen on
distinct loopback addresses (127.0.0.1, 127.0.0.2, …), so each one is a distinct "host" to the
gang, as on a real multi-node cluster.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import ipaddress
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.polling import wait_until

BIN = Path(sys.executable).parent


def make_certs(folder: Path) -> dict[str, str]:
    """A CA and a node certificate valid for every loopback address used here."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "jupyter-mn test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans = [x509.DNSName("localhost")] + [
        x509.IPAddress(ipaddress.ip_address(f"127.0.0.{i}")) for i in range(1, 9)
    ]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dask-node")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "ca": folder / "ca.pem",
        "cert": folder / "node.pem",
        "key": folder / "node.key",
    }
    files["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files["key"].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    files["key"].chmod(0o600)
    return {k: str(v) for k, v in files.items()}


def tls_env(certs: dict[str, str]) -> dict[str, str]:
    """Dask config as environment variables: how a kernel gets the user's TLS settings."""
    return {
        "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": certs["ca"],
        "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": certs["cert"],
        "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": certs["key"],
    }


def tls_config(certs: dict[str, str]) -> dict[str, str]:
    """The same settings for ``dask.config.set`` in this process."""
    return {
        "distributed.comm.tls.ca-file": certs["ca"],
        "distributed.comm.tls.client.cert": certs["cert"],
        "distributed.comm.tls.client.key": certs["key"],
    }


def _tls_flags(certs: dict[str, str]) -> list[str]:
    return ["--tls-ca-file", certs["ca"], "--tls-cert", certs["cert"], "--tls-key", certs["key"]]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass
class DaskCLI:
    """A scheduler and workers, each a ``dask`` CLI process in its own session."""

    folder: Path
    certs: dict[str, str]
    scheduler: Proc | None = None
    address: str = ""
    workers: dict[str, Proc] = field(default_factory=dict)

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        log = self.folder / f"{name}.log"
        with log.open("w") as out:
            popen = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                cwd=self.folder,
                start_new_session=True,
            )
        return Proc(name, popen, log)

    def start_scheduler(self, env: dict[str, str] | None = None, host: str = "127.0.0.1") -> str:
        proc = self._spawn(
            "scheduler",
            [
                str(BIN / "dask"),
                "scheduler",
                "--protocol",
                "tls",
                "--host",
                host,
                "--port",
                "0",
                "--dashboard-address",
                f"{host}:0",
                *_tls_flags(self.certs),
            ],
            env,
        )
        self.scheduler = proc
        found = _wait_for(proc, re.compile(r"Scheduler at:\s+(tls://\S+)"))
        self.address = found.group(1)
        return self.address

    def start_worker(
        self,
        name: str,
        host: str,
        env: dict[str, str] | None = None,
        extra: list[str] | None = None,
        wait: bool = True,
        python_flags: tuple[str, ...] = (),
        on: Callable[[list[str]], list[str]] | None = None,
    ) -> Proc:
        """``dask worker`` (``python_flags``: run its module with these interpreter flags;
        ``on``: how to run a command on another host, e.g. ``hosts.Host.command``)."""
        command = (
            [sys.executable, *python_flags, "-m", "distributed.cli.dask_worker"]
            if python_flags
            else [str(BIN / "dask"), "worker"]
        )
        argv = [
            *command,
            self.address,
            "--name",
            name,
            "--host",
            host,
            "--nthreads",
            "1",
            "--memory-limit",
            "0",
            "--dashboard-address",
            f"{host}:0",
            *_tls_flags(self.certs),
            *(extra or []),
        ]
        proc = self._spawn(name, on(argv) if on else argv, env)
        self.workers[name] = proc
        if wait:
            _wait_for(proc, re.compile(r"Registered to:"))
        return proc

    @classmethod
    def start(cls, folder: Path, workers: dict[str, str]) -> DaskCLI:
        """Certificates, a scheduler and ``workers`` (name → host), all up; stopped on error."""
        cli = cls(folder, make_certs(folder / "certs"))
        try:
            cli.start_scheduler()
            for name, host in workers.items():
                cli.start_worker(name, host, wait=False)
            cli.wait_workers()
        except BaseException:
            cli.stop()
            raise
        return cli

    @classmethod
    @contextlib.contextmanager
    def on_hosts(
        cls, folder: Path, net: Any, hidden: Mapping[str, Sequence[str]] | None = None
    ) -> Iterator[DaskCLI]:
        """A scheduler on the test hosts' bridge (``tests/support/hosts.py``) and a worker on every
        host (``hidden``: directories a host does not see, by hostname), each with a file
        cache of its own; this process has their TLS config meanwhile. Stopped on the way
        out."""
        import dask
        import distributed  # noqa: F401  its defaults join dask's config now: were they to
        # join inside config.set, leaving it would remove all of "distributed" with them

        cli = cls(folder, make_certs(folder / "certs"))
        try:
            cli.start_scheduler(host=net.gateway)
            for host in net.hosts:
                unseen = (hidden or {}).get(host.hostname, ())
                cli.start_worker(
                    host.hostname,
                    host.ip,
                    env={"JUPYTER_MN_FILE_CACHE": str(folder / f"files-{host.hostname}")},
                    wait=False,
                    on=functools.partial(host.command, hidden=unseen),
                )
            cli.wait_workers()
            with dask.config.set(tls_config(cli.certs)):
                yield cli
        finally:
            cli.stop()

    def wait_workers(self) -> None:
        for proc in self.workers.values():
            _wait_for(proc, re.compile(r"Registered to:"))

    @contextlib.contextmanager
    def _client(self) -> Iterator[Any]:
        """A fresh client of this cluster (like another user's)."""
        import dask
        from distributed import Client, Security

        with (
            dask.config.set(tls_config(self.certs)),
            Client(self.address, security=Security(), set_as_default=False) as client,
        ):
            yield client

    def worker_pids(self) -> dict[str, int]:
        """Worker process (not nanny) pid by name, from a fresh client (like another user)."""
        with self._client() as client:
            info = client.scheduler_info(n_workers=-1)["workers"]
            pids = client.run(os.getpid)
        return {str(info[a]["name"]): pid for a, pid in pids.items()}

    def actors(self) -> dict[str, list[str]]:
        """The actors (keys) each worker holds, by name, from a fresh client (a worker being
        removed meanwhile is left out: it holds nothing any more)."""
        with self._client() as client:
            info = client.scheduler_info(n_workers=-1)["workers"]
            held = client.run(
                lambda dask_worker: [str(k) for k in dask_worker.state.actors], on_error="ignore"
            )
        return {str(info[a]["name"]): keys for a, keys in held.items() if a in info}

    def revive(self, hosts: list[Any]) -> list[str]:
        """Start again, on its host, every worker of ``hosts`` that stopped or is stopping (dask
        stops a worker whose scheduler connection broke: it says so in its log at once, before
        the scheduler or the process notice); their names. The old log is kept as ``.log.1``."""
        stopped = [
            host
            for host in hosts
            if (proc := self.workers[host.hostname]).popen.poll() is not None
            or "Stopping worker" in proc.text()
        ]
        for host in stopped:
            old = self.workers.pop(host.hostname)
            _stop(old.popen)
            old.log.rename(old.log.with_name(old.log.name + ".1"))
            # the scheduler refuses a worker whose name it still holds
            name = host.hostname
            wait_until(lambda n=name: n not in self.worker_names(), what=f"{name} released")
            self.start_worker(host.hostname, host.ip, on=host.command)
        return [host.hostname for host in stopped]

    def worker_names(self) -> set[str]:
        """The names of the workers the scheduler holds now."""
        with self._client() as client:
            return {str(w["name"]) for w in client.scheduler_info(n_workers=-1)["workers"].values()}

    def stop_worker(self, name: str) -> None:
        _stop(self.workers.pop(name).popen)

    def stop(self) -> None:
        for name in list(self.workers):
            self.stop_worker(name)
        if self.scheduler is not None:
            _stop(self.scheduler.popen)
            self.scheduler = None


def _wait_for(proc: Proc, pattern: re.Pattern[str], timeout: float = 60.0) -> re.Match[str]:
    """Poll the process's log for ``pattern`` (the CLI prints it once it listens)."""
    deadline = time.monotonic() + timeout
    while True:
        found = pattern.search(proc.text())
        if found:
            return found
        if proc.popen.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{proc.name} did not start:\n{proc.text()[-3000:]}")
        time.sleep(0.1)  # polling the log for the startup line


def _stop(popen: subprocess.Popen) -> None:
    """SIGTERM (the CLI closes its nanny and worker), then SIGKILL the session."""
    if popen.poll() is None:
        popen.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(20)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(popen.pid, signal.SIGKILL)
    popen.wait()
