"""Shared fixtures: real gangs (real processes), and a check that nothing is left running.

Every process this test session starts (kernels, dask workers, ranks) inherits
``JUPYTER_MN_TEST_TOKEN``, so leftovers are found by that mark even after they were re-parented,
and never confused with processes of anyone else on the machine.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from procs import ours, wait_gone

from jupyter_mn import Cluster


@pytest.fixture
def no_leftovers() -> Iterator[float]:
    """Fail the test if processes it started are still running (after a grace period)."""
    started = time.time() - 0.5
    yield started
    left = wait_gone(ours(started))
    assert not left, "processes left running:\n" + "\n".join(left)


@pytest.fixture(scope="module")
def gang_2x2() -> Iterator[Cluster]:
    """One warm 2×2 gang shared by a module's tests (cold starts cost seconds)."""
    started = time.time() - 0.5
    cluster = Cluster(nodes=2, gpus=2)
    cluster.up()
    yield cluster
    cluster.close()
    left = wait_gone(ours(started))
    assert not left, "gang processes survived close():\n" + "\n".join(left)
