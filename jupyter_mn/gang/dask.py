"""Dask backend: claim nodes on an existing dask cluster (dask-jobqueue, dask-kubernetes, CLI).

The cluster belongs to the user and to whoever else uses it, so this backend only claims: one
worker per host (or per worker with ``same_host``), each under a ``distributed.Lock`` so two
notebooks never share a node. It never restarts, retires or reconfigures a worker and never closes
the cluster: releasing gives the locks back and closes only its own client. TLS settings come
from dask's own configuration (``distributed.comm.tls.*``), as for any other dask client.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import ipaddress
import logging
import re
import time
from dataclasses import dataclass
from typing import Any

from ..errors import SchedulingError, SpecError
from ..model.spec import ClusterSpec
from ..node.workerfuncs import identity, ignore_sigint, worker_facts
from ..wire.events import Note, OnEvent
from ..wire.version import __version__
from .hub import topics

log = logging.getLogger(__name__)
_POLL_S = 1.0
_CONNECT_TIMEOUT_S = 30.0
_AGENT_KEY = re.compile(r"^jupyter-mn-agent-(.+)-\d+$")
#: A worker whose last heartbeat to the scheduler trails the freshest one by this much (and by
#: three of its heartbeat periods) is cut off or frozen: asked anything, it would hold the claim
#: up until a connection times out (30 s). Wrongly left out, it costs one more poll.
_SILENT_S = 5.0


def security_for(address: str) -> Any:
    """The user's dask ``Security`` (from dask config); a clear error when TLS lacks its files."""
    from distributed.security import Security

    security = Security()
    if address.startswith("tls://") and not (
        security.tls_ca_file and security.tls_client_cert and security.tls_client_key
    ):
        raise SpecError(
            f"{address} needs TLS files in dask's config: distributed.comm.tls.ca-file, "
            "distributed.comm.tls.client.cert and .client.key (or the environment variables "
            "DASK_DISTRIBUTED__COMM__TLS__CA_FILE, …__CLIENT__CERT, …__CLIENT__KEY)"
        )
    return security


@dataclass(frozen=True)
class Candidate:
    """A worker of the user's cluster, as a possible node."""

    address: str
    host: str
    name: str
    #: why it cannot be a node ("lacks torch"); empty when it can
    problem: str = ""
    #: how its versions differ from the kernel's (usable; the preflight doctor will say so)
    mismatch: str = ""
    busy: int = 0
    in_kernel_group: bool = False
    #: seconds it has not reached the scheduler (cut off or frozen); 0 when it has
    silent: float = 0.0

    def unit(self, same_host: bool) -> str:
        return self.address if same_host else self.host

    def label(self) -> str:
        return f"worker {self.name} ({self.address})"


def _natural(text: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


def node_order(c: Candidate) -> tuple[Any, ...]:
    """Stable node order: sorted host, then worker name.

    See docs/architecture.md, "Rank environment".
    """
    try:
        host: tuple[Any, ...] = (0, int(ipaddress.ip_address(c.host)))
    except ValueError:
        host = (1, _natural(c.host))
    return (host, _natural(c.name))


def silent_workers(workers: dict[str, dict[str, Any]]) -> dict[str, float]:
    """``{address: seconds}`` of the workers that have not reached the scheduler lately.

    Counted from the freshest worker's ``last_seen``, so only the scheduler's clock matters (the
    kernel's may differ); when every worker is silent, none can be told apart.
    """
    from distributed.scheduler import heartbeat_interval

    seen = {a: i["last_seen"] for a, i in workers.items() if i.get("last_seen") is not None}
    if not seen:
        return {}
    newest = max(seen.values())
    window = max(_SILENT_S, 3 * heartbeat_interval(len(workers)))
    return {a: newest - t for a, t in seen.items() if newest - t > window}


def candidates(
    workers: dict[str, dict[str, Any]],
    facts: dict[str, Any],
    processing: dict[str, Any],
    kernel: dict[str, str | None],
    silent: dict[str, float] | None = None,
) -> list[Candidate]:
    """Every worker with what speaks for or against it (``silent``: see ``silent_workers``)."""
    found = []
    silent = silent or {}
    for address, info in workers.items():
        fact = facts.get(address)
        problem = mismatch = ""
        if address in silent:
            problem = (
                f"has not reached the scheduler for {silent[address]:.0f} s (cut off or frozen)"
            )
            fact = {}
        elif isinstance(fact, BaseException) or fact is None:
            # dask wraps the worker's error: Exception('ModuleNotFoundError("No module …")')
            missing = "No module named 'jupyter_mn" in str(fact)
            problem = "lacks jupyter_mn" if missing else f"cannot be inspected ({fact!r})"
            fact = {}
        elif fact.get("torch") is None:
            problem = f"lacks torch {_base(kernel['torch'])}".rstrip()
        else:
            diffs = [
                f"{pkg} {fact.get(pkg)} (kernel {kernel[pkg]})"
                for pkg in ("jupyter_mn", "torch")
                if kernel.get(pkg) and _base(fact.get(pkg)) != _base(kernel[pkg])
            ]
            mismatch = ", ".join(diffs)
        found.append(
            Candidate(
                address=address,
                host=info.get("host") or address,
                name=str(info.get("name", address)),
                problem=problem,
                mismatch=mismatch,
                busy=len(processing.get(address) or ()),
                in_kernel_group=bool(fact.get("in_kernel_group")),
                silent=silent.get(address, 0.0),
            )
        )
    return found


def _base(version: str | None) -> str:
    return (version or "").split("+")[0]


def preference(c: Candidate) -> tuple[Any, ...]:
    """Matching versions first, then idle workers, then node order."""
    return (bool(c.mismatch), c.busy, node_order(c))


def shortage(
    spec: ClusterSpec, chosen: list[Candidate], found: list[Candidate], claimed: dict[str, str]
) -> str:
    """Why fewer nodes than requested: counts, then each unusable host or worker and why."""
    unit = "worker" if spec.same_host else "host"
    lines = [f"{len(chosen)} {unit}(s) available, {spec.nodes} requested"]
    used = {c.unit(spec.same_host) for c in chosen}
    for c in sorted(found, key=node_order):
        if c.unit(spec.same_host) in used:
            continue
        why = c.problem or claimed.get(c.address)
        if why:
            lines.append(f"{unit} {c.host}: {c.label()} {why}")
    hosts = {c.host for c in found}
    if not spec.same_host and len(found) >= spec.nodes > len(hosts):
        lines.append(
            f"the cluster has {len(found)} workers on {len(hosts)} host(s); "
            "--same-host makes each worker a node"
        )
    return "; ".join(lines)


def could_change(spec: ClusterSpec, found: list[Candidate], claimed: dict[str, str]) -> bool:
    """Worth waiting: another gang may release its claim, the cluster may still scale up, or a
    silent worker come back (or be dropped, and replaced)."""
    units = {c.unit(spec.same_host) for c in found}
    return bool(claimed) or len(units) < spec.nodes or any(c.silent for c in found)


class DaskProvisioner:
    backend = "dask"

    def __init__(self) -> None:
        self._client: Any = None
        self._locks: list[Any] = []
        self._topics: tuple[str, ...] = ()
        self.notify: OnEvent = lambda event: None

    def provision(self, spec: ClusterSpec, gang_id: str) -> tuple[Any, list[str]]:
        assert spec.scheduler is not None  # ClusterSpec requires it for this backend
        self._topics = topics(gang_id)
        self._client = self._connect(spec.scheduler, gang_id, spec.start_timeout)
        kernel = {
            "jupyter_mn": __version__,
            "torch": _installed("torch"),
        }
        deadline = time.monotonic() + spec.start_timeout
        told = ""
        while True:
            chosen, found, claimed = self._claim(spec, kernel)
            if len(chosen) == spec.nodes:
                break
            self._unlock()
            why = shortage(spec, chosen, found, claimed)
            if not could_change(spec, found, claimed) or time.monotonic() >= deadline:
                raise SchedulingError(
                    f"cannot claim {spec.nodes} node(s) at {spec.scheduler}: {why}"
                )
            if why != told:
                self.notify(
                    Note(f"waiting for dask workers (up to {spec.start_timeout:g} s): {why}")
                )
                told = why
            time.sleep(_POLL_S)  # polling the scheduler for workers to join or be released
        self._shield([c for c in chosen if c.in_kernel_group])
        return self._client, [c.address for c in sorted(chosen, key=node_order)]

    def _connect(self, address: str, gang_id: str, timeout: float) -> Any:
        from distributed import Client

        security = security_for(address)
        try:
            return Client(
                address,
                security=security,
                set_as_default=False,
                timeout=min(timeout, _CONNECT_TIMEOUT_S),
                name=f"jupyter_mn {gang_id}",
            )
        except Exception as exc:
            raise SchedulingError(
                f"cannot connect to the dask scheduler at {address}: {type(exc).__name__}: {exc}"
            ) from exc

    def _claim(
        self, spec: ClusterSpec, kernel: dict[str, str | None]
    ) -> tuple[list[Candidate], list[Candidate], dict[str, str]]:
        """Lock the best worker of each host (or each worker) until ``spec.nodes`` are held."""
        from distributed import Lock

        client = self._client
        workers = client.scheduler_info(n_workers=-1)["workers"]
        silent = silent_workers(workers)
        heard = [a for a in workers if a not in silent]
        facts = (
            client.run(worker_facts, identity(), workers=heard, on_error="return") if heard else {}
        )
        found = candidates(workers, facts, client.processing(), kernel, silent)
        holders = _claim_holders(client.has_what())
        chosen: list[Candidate] = []
        claimed: dict[str, str] = {}
        units: set[str] = set()
        for c in sorted((c for c in found if not c.problem), key=preference):
            if len(chosen) == spec.nodes or c.unit(spec.same_host) in units:
                continue
            lock = Lock(f"jupyter-mn-claim-{c.address}", client.scheduler, client.loop)
            if lock.acquire(blocking=False):
                self._locks.append(lock)
                chosen.append(c)
                units.add(c.unit(spec.same_host))
            else:
                claimed[c.address] = "is claimed by " + holders.get(c.address, "another gang")
        return chosen, found, claimed

    def _shield(self, exposed: list[Candidate]) -> None:
        """Workers started from this kernel share its process group, so Jupyter's interrupt
        (SIGINT to the group) would kill them; make them and their nannies ignore SIGINT."""
        if not exposed:
            return
        addresses = [c.address for c in exposed]
        self._client.run(ignore_sigint, workers=addresses, on_error="ignore")
        self._client.run(ignore_sigint, workers=addresses, nanny=True, on_error="ignore")
        names = ", ".join(c.name for c in exposed)
        self.notify(
            Note(
                f"worker(s) {names} share this kernel's process group: they now ignore SIGINT, "
                "so interrupting a cell does not stop them"
            )
        )

    def launch_options(self) -> dict[str, Any]:
        return {}  # ranks start in the worker's working directory

    def _unlock(self) -> None:
        for lock in self._locks:
            with contextlib.suppress(Exception):
                lock.release()
            with contextlib.suppress(Exception):
                lock.close()
        self._locks = []

    def release(self) -> None:
        """Give the claims back and close this client; the cluster and its workers stay."""
        client, self._client = self._client, None
        if client is None:
            return
        self._unlock()
        with contextlib.suppress(Exception):
            # The scheduler keeps each topic's events until it restarts: drop the gang's.
            client.run_on_scheduler(_drop_topics, topics=list(self._topics))
        with contextlib.suppress(Exception):
            client.close()


def _drop_topics(dask_scheduler: Any, topics: list[str]) -> None:
    for topic in topics:
        dask_scheduler._broker._topics.pop(topic, None)


def _claim_holders(has_what: dict[str, Any]) -> dict[str, str]:
    """Which gang's agent lives on each worker (for "claimed by gang jmn-…")."""
    holders = {}
    for address, keys in has_what.items():
        for key in keys:
            found = _AGENT_KEY.match(str(key))
            if found:
                holders[address] = f"gang {found.group(1)}"
    return holders


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
