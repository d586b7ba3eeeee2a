"""Big values both ways, their bytes checked end to end: rank 0's value hashed on the rank and
again in the kernel; a notebook array hashed in the kernel and again on every rank.

Every backend's tests run ``check_big_value`` and ``check_big_push`` on a gang they already have,
so both paths (pickle, out-of-band buffers, each hop, the rebuild; a node's one shared copy of a
pushed array) are checked without a cluster start of their own.
"""

from __future__ import annotations

import hashlib
from typing import Any

#: A random tensor and random ``bytes`` (both out of band), their digests taken on the rank.
_CELL = """
import hashlib, os, torch
_g = torch.Generator().manual_seed(7)
big = {{"tensor": torch.rand({floats}, generator=_g), "bytes": os.urandom({nbytes}), "n": 3}}
digests = [hashlib.sha256(big["tensor"].numpy().tobytes()).hexdigest(),
           hashlib.sha256(big["bytes"]).hexdigest()]
big
"""


def check_big_value(cluster: Any, mib: int) -> None:
    """Rank 0 returns a ``mib`` MiB tensor and ``mib // 4`` MiB of bytes, and ``--pull``s their
    digests; the kernel's digests of what arrived must match."""
    code = _CELL.format(floats=mib << 18, nbytes=mib << 18)
    result = cluster.run(code, pull=["digests"])
    value = result.unwrap()
    got = [
        hashlib.sha256(value["tensor"].numpy().tobytes()).hexdigest(),
        hashlib.sha256(value["bytes"]).hexdigest(),
    ]
    assert type(value["bytes"]) is bytes and value["n"] == 3
    assert value["tensor"].nbytes == mib << 20
    assert got == result.pulled["digests"]


#: A cell that defines ``_mapped(address)``: the file the rank's memory at ``address`` is a
#: mapping of (``/proc/self/maps``: device, inode, path).
MAPPED = """
def _mapped(address):
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                return fields[3], fields[4], " ".join(fields[5:])
"""
#: Each rank's digest of the array it got, and the file its memory is a mapping of; the type
#: and digest of the ``bytes`` it got.
_READ = f"""import hashlib, os
{MAPPED}
(int(os.environ["NODE_RANK"]), hashlib.sha256(pushed).hexdigest(), _mapped(pushed.ctypes.data),
 type(blob).__name__, hashlib.sha256(blob).hexdigest())
"""


def check_big_push(cluster: Any, mib: int) -> None:
    """A ``mib`` MiB notebook array and ``mib // 4`` MiB of ``bytes`` reach every rank intact
    (checksummed there), and the ranks of a node read one copy of the array: it lies in one
    and the same memfd for each of them."""
    import numpy as np

    pushed = np.random.default_rng(11).integers(0, 2**31, mib << 18, dtype=np.int32)
    blob = np.random.default_rng(12).bytes(mib << 18)
    rows = cluster.run(_READ, namespace={"pushed": pushed, "blob": blob}, return_all=True)
    rows = rows.unwrap()
    assert {digest for _, digest, *_ in rows} == {hashlib.sha256(pushed).hexdigest()}
    assert {tuple(row[3:]) for row in rows} == {("bytes", hashlib.sha256(blob).hexdigest())}
    files: dict[int, set[Any]] = {}
    for node, _, mapped, *_ in rows:
        files.setdefault(node, set()).add(mapped)
    assert all(len(mapping) == 1 for mapping in files.values()), files
    assert all(path.startswith("/memfd:jupyter-mn-pushed") for ((_, _, path),) in files.values())
