"""``python -m jupyter_mn.nccl LOG [LOG…]``: what transport NCCL used, as JSON, from any log.

Works on logs from any job (``NCCL_DEBUG=INFO``, ideally ``NCCL_DEBUG_SUBSYS=INIT,NET``), not
only jupyter_mn's: pass one file per rank or one combined log; ``-`` reads standard input.
Exit status: 0 with a report, 1 when the input holds no NCCL lines, 2 when a file can't be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from .node.nccllog import NcclLog


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jupyter_mn.nccl", description=__doc__)
    parser.add_argument("logs", nargs="+", metavar="LOG", help="NCCL log file, or - for stdin")
    args = parser.parse_args(argv)
    log = NcclLog()
    for name in args.logs:
        try:
            if name == "-":
                log.feed_all(sys.stdin)
                continue
            with open(name, encoding="utf-8", errors="replace") as f:
                log.feed_all(f)
        except OSError as exc:
            print(f"jupyter_mn.nccl: cannot read {name}: {exc.strerror}", file=sys.stderr)
            return 2
    print(json.dumps(log.report().to_json(), indent=2))
    if not log.lines:
        print(
            "jupyter_mn.nccl: no NCCL lines found; run the job with NCCL_DEBUG=INFO "
            "NCCL_DEBUG_SUBSYS=INIT,NET",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
