"""Local backend: one dask worker per virtual node on this machine (the embedded default).

The scheduler and each node's worker are subprocesses (``node/localnode.py``), each in a session
of its own, so neither a script's top-level code runs again in them (as a spawned nanny's child
would re-import the main module) nor does a Jupyter interrupt (SIGINT to the kernel's process
group) reach them. The scheduler is not in the kernel: hearing its workers and relaying their log
batches would take the kernel's CPU and GIL (ipyparallel's controller is a process of its own
too). All start at once; the workers learn the scheduler's address on stdin once it listens.
Everything listens on 127.0.0.1 with TLS (fresh certificates per gang, handed over on stdin).
The nodes fork their ranks from one rank template the kernel starts first (``node/template.py``:
one import of torch for the whole gang, overlapping the nodes' start), or start them as their
workers' children; releasing kills what is left. Each node gets GPUs of its own
(``CUDA_VISIBLE_DEVICES`` in its worker's environment, which its ranks inherit): node i the
i-th ``gpus`` of those the kernel sees (``node/visible.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import time
from typing import Any

import psutil

from ..errors import SchedulingError
from ..model.spec import ClusterSpec
from ..node import template
from ..node.daskconfig import DASK_CONFIG
from ..node.process import rank_command
from ..node.visible import VISIBLE, local_split

#: What the processes get besides the kernel's dask config: quiet logs, and glibc returning freed
#: memory as dask's nanny would have set it (the ranks inherit both).
_PROCESS_CONFIG = {"logging": {"distributed": "critical", "jupyter_mn.scheduler": "critical"}}
_PROCESS_ENV = {"MALLOC_TRIM_THRESHOLD_": "65536"}
#: How often a start-up checks whether a process has already exited.
_EXIT_CHECK_S = 0.5
#: How long released processes get to close (their workers' agents stop their ranks) before
#: they and what is left of their children are killed.
_CLOSE_S = 3.0
_TLS_FIELDS = (
    "tls_ca_file",
    "tls_scheduler_cert",
    "tls_scheduler_key",
    "tls_worker_cert",
    "tls_worker_key",
    "tls_client_cert",
    "tls_client_key",
)


class LocalProvisioner:
    backend = "local"

    def __init__(self) -> None:
        self._client: Any = None
        #: the scheduler's process, then the nodes' in node order
        self._procs: list[subprocess.Popen[bytes]] = []
        #: the rank template the nodes share (``node/template.py``), when they use one
        self._template: subprocess.Popen[bytes] | None = None

    def provision(self, spec: ClusterSpec, gang_id: str) -> tuple[Any, list[str]]:
        # imported here, after the SCHEDULING the cell's view shows: dask is 0.4 s of a cold
        # kernel's first cell
        import dask
        from distributed import Client
        from distributed.security import Security

        rank_command()  # the workers inherit this environment: a bad command, before they start
        node_gpus = _node_gpus(spec)  # too few GPUs: before any process starts
        security = Security.temporary()
        pems = {f: getattr(security, f) for f in _TLS_FIELDS}
        deadline = time.monotonic() + spec.start_timeout
        try:
            with dask.config.set(DASK_CONFIG):
                config = dask.config.merge(dask.config.config, _PROCESS_CONFIG)
            env = {
                **os.environ,
                **_PROCESS_ENV,
                "DASK_INTERNAL_INHERIT_CONFIG": dask.config.serialize(config),
            }
            ends = self._start_template(gang_id, spec.nodes, env)
            try:
                scheduler = self._spawn(
                    env,
                    "scheduler",
                    {
                        "protocol": "tls",
                        "host": "127.0.0.1",
                        "dashboard": False,
                        "dashboard_address": "127.0.0.1:0",  # its HTTP server (health)
                        "connect_timeout": spec.start_timeout,
                    },
                    stdout=subprocess.PIPE,
                )
                for i in range(spec.nodes):
                    node_env = env if node_gpus is None else {**env, VISIBLE: node_gpus[i]}
                    shared = (ends[i].fileno(),) if ends else ()
                    if shared:
                        node_env = {**node_env, template.SHARED: str(shared[0])}
                    self._spawn(
                        node_env,
                        "worker",
                        {
                            "job": gang_id,
                            "name": str(i),
                            "host": "127.0.0.1",
                            "nthreads": 1,
                            "memory_limit": 0,
                            "preload": ["jupyter_mn.node.agent"],
                        },
                        pass_fds=shared,
                    )
            finally:  # the nodes hold theirs now: the template ends with the last node
                for end in ends:
                    end.close()
            _hand(scheduler, json.dumps(pems) + "\n")
            address = self._address(scheduler, deadline)
            for node in self._procs[1:]:
                _hand(node, json.dumps({"scheduler": address, **pems}))
            self._client = Client(
                address, security=security, set_as_default=False, direct_to_workers=True
            )
            self._wait_for_nodes(spec.nodes, deadline)
        except Exception as exc:
            self.release()
            raise SchedulingError(f"could not start {spec.nodes} local node(s): {exc}") from exc
        workers = self._client.scheduler_info(n_workers=-1)["workers"]
        order = sorted(workers, key=lambda a: int(workers[a]["name"]))
        return self._client, order

    def _start_template(self, job: str, nodes: int, env: dict[str, str]) -> list[socket.socket]:
        """Start the rank template all the nodes fork their ranks from (one import of torch for
        the gang, started before anything else: it takes longest); each node's end of its
        socket (none where the nodes start their ranks anew)."""
        if not template.enabled(env):
            return []
        self._template, ends = template.spawn(job, nodes, env)
        return ends

    def _spawn(
        self, env: dict[str, str], kind: str, opts: dict[str, Any], **io: Any
    ) -> subprocess.Popen[bytes]:
        """``dask spec`` building ``node.localnode.<kind>``, in a session of its own."""
        spec = {"cls": f"jupyter_mn.node.localnode.{kind}", "opts": opts}
        proc = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_spec", "--spec", json.dumps(spec)],
            stdin=subprocess.PIPE,
            env=env,
            start_new_session=True,
            **io,
        )
        self._procs.append(proc)
        return proc

    def _exited(self) -> None:
        """Fail as soon as a process has exited: waiting on would only wait out the timeout."""
        for i, proc in enumerate(self._procs):
            if proc.poll() is not None:
                what = "the scheduler's process" if i == 0 else f"node {i - 1}'s worker process"
                raise SchedulingError(
                    f"{what} exited with code {proc.returncode} while starting "
                    "(its error is above, on the kernel's stderr)"
                )

    def _address(self, scheduler: subprocess.Popen[bytes], deadline: float) -> str:
        """The address the scheduler says once it listens."""
        assert scheduler.stdout is not None
        while not select.select([scheduler.stdout], [], [], _EXIT_CHECK_S)[0]:
            self._exited()
            if time.monotonic() >= deadline:
                raise TimeoutError("the scheduler did not start in time")
        address = scheduler.stdout.readline().decode().strip()
        if not address:  # its stdout closed: it is exiting
            with contextlib.suppress(subprocess.TimeoutExpired):
                scheduler.wait(_EXIT_CHECK_S)
            self._exited()
            raise SchedulingError("the scheduler's process closed its output without an address")
        return address

    def _wait_for_nodes(self, n: int, deadline: float) -> None:
        """Wait for ``n`` workers, but fail as soon as a process has exited: dask's
        ``wait_for_workers`` alone would wait out the timeout for a node that can never come."""
        while True:
            try:
                self._client.wait_for_workers(n, timeout=_EXIT_CHECK_S)
                return
            except TimeoutError:
                self._exited()
                if time.monotonic() >= deadline:
                    raise

    def launch_options(self) -> dict[str, Any]:
        # The workers are this gang's alone: an agent whose kernel is gone ends its worker too.
        return {"cwd": os.getcwd(), "exit_when_orphaned": True}

    def release(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
        procs, self._procs, self._client = self._procs, [], None
        shared, self._template = self._template, None
        parents = procs if shared is None else [*procs, shared]
        children = [c for p in parents for c in _children(p.pid)]
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()  # dask spec closes its server: a worker's agent stops its ranks
        deadline = time.monotonic() + _CLOSE_S
        for proc in procs:
            try:
                proc.wait(max(deadline - time.monotonic(), 0))
            except subprocess.TimeoutExpired:
                children += _children(proc.pid)
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        if shared is not None:  # it exits once its nodes are gone
            try:
                shared.wait(max(deadline - time.monotonic(), 0))
            except subprocess.TimeoutExpired:
                shared.kill()
                shared.wait()
        for child in children:
            with contextlib.suppress(psutil.Error):
                child.kill()


def _node_gpus(spec: ClusterSpec) -> list[str] | None:
    """Each node's own GPUs (``CUDA_VISIBLE_DEVICES``), split from those the kernel sees; None
    on a machine without GPUs, or where the user's ``--env`` names the ranks' GPUs itself."""
    if any(key == VISIBLE for key, _ in spec.env):
        return None
    return local_split(os.environ, spec.nodes, spec.gpus)


def _hand(proc: subprocess.Popen[bytes], text: str) -> None:
    """Write ``text`` to ``proc``'s stdin and close it; a process already gone is named by the
    start-up's next check."""
    assert proc.stdin is not None
    with contextlib.suppress(BrokenPipeError), proc.stdin:
        proc.stdin.write(text.encode())


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
