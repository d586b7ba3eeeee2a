"""Shared fixtures: real gangs (real processes), and a check that nothing is left running.

Every process this test session starts (kernels, dask workers, ranks) inherits
``JUPYTER_MN_TEST_TOKEN``, so leftovers are found by that mark even after they were re-parented,
and never confused with processes of anyone else on the machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator

import dask
import pytest
from IPython.core.interactiveshell import InteractiveShell

from jupyter_mn import Cluster
from jupyter_mn.jobs.registry import Registry
from jupyter_mn.kernel import cluster
from tests.support.daskcli import DaskCLI, tls_config
from tests.support.hosts import HostNet, missing
from tests.support.procs import ours, started_now, wait_gone
from tests.support.slurm import SlurmCluster
from tests.support.slurm import missing as slurm_missing

#: A suite started in the background by a shell without job control (``cmd &``) inherits SIGINT
#: ignored, and so would every process it starts; the Ctrl-C tests need it as a terminal gives it.
signal.signal(signal.SIGINT, signal.default_int_handler)

#: Kernels, Jupyter servers, papermill runs and the job registry of this test session share one
#: private runtime dir: the user's own registry is never touched, nor another session's.
RUNTIME_DIR = os.environ["JUPYTER_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="jmn-test-runtime-")


def pytest_sessionfinish(session: pytest.Session) -> None:
    shutil.rmtree(RUNTIME_DIR, ignore_errors=True)


@pytest.fixture
def no_leftovers() -> Iterator[float]:
    """Fail the test if processes it started are still running (after a grace period)."""
    started = started_now()
    yield started
    left = wait_gone(ours(started))
    assert not left, "processes left running:\n" + "\n".join(left)


@pytest.fixture(scope="module")
def gang_2x2() -> Iterator[Cluster]:
    """One warm 2×2 gang shared by a module's tests (cold starts cost seconds)."""
    started = started_now()
    cluster = Cluster(nodes=2, gpus=2)
    cluster.up()
    yield cluster
    cluster.close()
    left = wait_gone(ours(started))
    assert not left, "gang processes survived close():\n" + "\n".join(left)


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    """An IPython shell with the magics loaded, as a notebook has; its cluster shut down after."""
    ip = InteractiveShell.instance()
    ip.extension_manager.load_extension("jupyter_mn")
    yield ip
    cluster.shutdown()
    InteractiveShell.clear_instance()


@pytest.fixture(scope="module")
def registry() -> Iterator[Registry]:
    """The test session's job registry (its private runtime dir), as the kernel side writes it."""
    reg = Registry()
    yield reg
    reg.close()


@pytest.fixture(scope="session")
def dask_cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaskCLI]:
    """A user's dask cluster, started from the CLI with TLS: a scheduler and two workers on two
    loopback "hosts" (127.0.0.1 and 127.0.0.2). Tests that add workers remove them again."""
    cli = DaskCLI.start(tmp_path_factory.mktemp("dask-cli"), {"w0": "127.0.0.1", "w1": "127.0.0.2"})
    yield cli
    cli.stop()


@pytest.fixture
def dask_tls(dask_cli: DaskCLI) -> Iterator[str]:
    """This process's dask config carries the cluster's TLS files; yields the scheduler address."""
    with dask.config.set(tls_config(dask_cli.certs)):
        yield dask_cli.address


@pytest.fixture(scope="module")
def host_net(request: pytest.FixtureRequest) -> Iterator[HostNet]:
    """Test hosts with their own address and hostname (``hosts.py``), as many as the module's
    ``HOSTS`` (default 2); removed, with what runs on them, when the module is done."""
    reason = missing()
    if reason is not None:
        pytest.skip(reason)
    with HostNet.create(getattr(request.module, "HOSTS", 2)) as net:
        yield net


@pytest.fixture(scope="module")
def slurm(host_net: HostNet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A real Slurm with one slurmd per test host (``slurm.py``), shared by a module's tests;
    this process (and the kernels it starts) reach it through ``SLURM_CONF``."""
    reason = slurm_missing()
    if reason is not None:
        pytest.skip(reason)
    with (
        pytest.MonkeyPatch.context() as env,
        SlurmCluster.start(host_net, tmp_path_factory.mktemp("slurm")) as cluster,
    ):
        for key, value in cluster.env.items():
            env.setenv(key, value)
        env.delenv("SLURM_JOB_ID", raising=False)  # a test run inside an allocation submits too
        yield cluster
