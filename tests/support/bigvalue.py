"""A big value whose bytes are checked end to end: hashed on rank 0, hashed again in the kernel.

Every backend's tests run ``check_big_value`` on a gang they already have, so the value path
(pickle, out-of-band buffers, each hop, the kernel's rebuild) is checked without a cluster start
of its own.
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
