"""The ``%%cluster`` / ``%cluster`` line through IPython's own magic machinery: any line is a
spec, a short ``UsageError`` or a short ``SpecError``, never a traceback. Nothing is launched:
cell lines carry ``--dry-run --k8s-version``, and verb lines use verbs that start no gang."""

from __future__ import annotations

import contextlib
import io
import shlex

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError

from jupyter_mn.errors import SpecError
from jupyter_mn.kernel import cluster
from jupyter_mn.kernel.magics import _words
from jupyter_mn.model.flags import cell_parser
from jupyter_mn.model.spec import MAX_SECONDS, SEED_LIMIT

DRY = "--dry-run --k8s-version 1.30 "
FLAGS = [
    "--nodes", "--gpus", "--backend", "--scheduler", "--env", "--name", "--timeout",
    "--retries", "--seed", "--idle-timeout", "--start-timeout", "--max-runtime",
    "--grace", "--memory-limit", "--rdma", "--require-rdma", "--debug", "--view", "--same-host",
    "--preflight", "--no-preflight", "--check-path", "--min-shm-gb", "--min-disk-gb",
    "--image", "--namespace", "--gang", "--queue", "--node-selector", "--toleration",
    "--volume", "--cpu", "--memory", "--shm-size", "--schedule-timeout", "--lifetime",
    "--dask-port", "--all", "--pull", "--push", "--rdma-networks", "--gpu-resource",
    "--partition", "--account", "--qos", "--time", "--constraint", "--exclusive",
    "--sbatch-arg", "--gpu-gres", "--orphan-timeout", "--workdir", "--no-workdir",
    "--workdir-exclude", "--workdir-limit", "--local-limit", "--insecure",
]  # fmt: skip
VALUES = [
    "2", "0", "-1", "1e400", "nan", "inf", "-inf", "NaN", "1.5", "99999999999999999999",
    "kubernetes", "local", "dask", "slurm", "--mem=1G", "4:00:00", "img:1", "tcp://h:1",
    "tcp://h:1\n", "a\n", "x=1", "A=1\n", "8GB", "1e400GB", "'", '"', "\\", "a b", "--", "-",
    "=", "/data", "", "4294967296", "3e6", "1e10", "5000", "65536",
]  # fmt: skip
TOKEN = st.one_of(st.sampled_from(FLAGS), st.sampled_from(VALUES), st.text(max_size=12))
LINE = st.one_of(
    st.lists(TOKEN, max_size=8).map(" ".join),
    st.text(max_size=60),
)
FUZZ = settings(
    max_examples=150,
    deadline=2000,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _short(exc: BaseException) -> None:
    """What the notebook shows for a usage or spec error: a short message, no traceback (the
    user's own text may hold a line break)."""
    assert isinstance(exc, (UsageError, SpecError)), f"{type(exc).__name__}: {exc}"
    assert len(str(exc)) < 400, str(exc)


@pytest.mark.parametrize(
    ("line", "cell"),
    [
        ('--name "train', "1"),
        ("--env 'A=1", "1"),
        ("--name x\\", "1"),
        ('status "', None),
        ('up --name "train', None),
        ('exec --node "1 -- ls', None),
    ],
)
def test_an_unbalanced_quote_is_a_usage_error(shell, line, cell):
    with pytest.raises(UsageError, match=r"No closing quotation|No escaped character") as info:
        if cell is None:
            shell.run_line_magic("cluster", line)
        else:
            shell.run_cell_magic("cluster", line, cell)
    _short(info.value)
    assert cluster.current() is None  # nothing was started


def test_quoted_values_lose_their_quotes_as_in_a_shell(shell):
    magics = shell.magics_manager.registry["ClusterMagics"]
    spec = magics.spec_from(cell_parser().parse_args(_words("--env 'A=x y' --env \"B=it's\"")))
    assert spec.env == (("A", "x y"), ("B", "it's"))


def test_the_environments_rank_env_is_a_cells_default(shell, monkeypatch):
    """``c.ClusterMagics.default_env`` unset reads ``{}``: it must not hide JUPYTER_MN_ENV."""
    monkeypatch.setenv("JUPYTER_MN_ENV", "A=1,B=2")
    magics = shell.magics_manager.registry["ClusterMagics"]
    assert magics.spec_from(cell_parser().parse_args([])).env == (("A", "1"), ("B", "2"))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ("--memory-limit 1e400", "memory_limit '1e400' is not a size"),
        ("--timeout nan", "timeout must be a positive number"),
        ("--hang-timeout -5", "hang_timeout must be 0 \\(off\\) or a positive number"),
        ("--max-runtime inf", "max_runtime must be a positive number"),
        ("--grace inf", "grace must be a positive number"),
        ("--min-shm-gb nan", "min_shm_gb must be a number of GiB"),
        ("--schedule-timeout inf", "--schedule-timeout must be positive"),
        ("--name 'train\n'", "name 'train\\\\n' contains control characters"),
        ("--env 'A\n=1'", "not a valid environment variable name"),
        ("--start-timeout 3e6", r"start_timeout 3e\+06 s is more than 1.2096e\+06 s"),
        ("--idle-timeout 1e10", "idle_timeout 1e\\+10 s is more than"),
        ("--max-runtime 1e10", "max_runtime 1e\\+10 s is more than"),
        ("--seed 4294967296", r"seed 4294967296: .*\(at most 4294967295 for 1 ranks\)"),
        ("--nodes 5000", "a local 5000×1 gang runs 5000 rank processes on this machine"),
    ],
)
def test_overflow_nan_infinity_and_a_trailing_newline_are_spec_errors(shell, flags, message):
    with pytest.raises(SpecError, match=message) as info:
        shell.run_cell_magic("cluster", DRY + flags, "1")
    _short(info.value)


#: The flags that carry a number with a bound, and numbers around those bounds.
BOUNDED = [
    "--nodes", "--gpus", "--local-limit", "--seed", "--retries", "--timeout", "--idle-timeout",
    "--start-timeout", "--max-runtime",
]  # fmt: skip
NUMBER = st.one_of(
    st.integers(-2, 2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["4294967295", "4294967296", "3e6", "1e10", "5000", "512", "513"]),
)


@FUZZ
@given(flags=st.lists(st.tuples(st.sampled_from(BOUNDED), NUMBER), max_size=4))
def test_every_number_on_the_line_is_within_its_bound_or_a_short_error(shell, flags):
    line = " ".join(f"{flag} {value}" for flag, value in flags)
    magics = shell.magics_manager.registry["ClusterMagics"]
    try:
        spec = magics.spec_from(cell_parser().parse_args(shlex.split(line)))
    except (UsageError, SpecError) as exc:
        _short(exc)
        return
    assert spec.world_size <= spec.local_limit
    assert spec.seed is None or spec.seed + spec.world_size <= SEED_LIMIT
    for name in ("timeout", "idle_timeout", "start_timeout", "max_runtime"):
        assert (getattr(spec, name) or 0) <= MAX_SECONDS


@FUZZ
@given(line=LINE)
def test_any_cell_line_is_a_spec_or_a_short_error(shell, line):
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            shell.run_cell_magic("cluster", DRY + line, "1")
        except Exception as exc:
            _short(exc)
    assert cluster.current() is None


@FUZZ
@given(verb=st.sampled_from(["status", "config", "stacks", "auto", "down", "nope", ""]), line=LINE)
def test_any_verb_line_is_done_or_a_short_error(shell, verb, line):
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            shell.run_line_magic("cluster", f"{verb} {line}")
        except Exception as exc:
            _short(exc)
    assert cluster.current() is None
