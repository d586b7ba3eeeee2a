"""``breakpoint()`` in a ``%cluster run`` script: nothing can answer a prompt there (the script's
stdin is ``/dev/null``, where pdb would read end-of-input and raise ``BdbQuit``), so the rank goes
on, as with ``PYTHONBREAKPOINT=0``, and says once per place that it skipped one. Script ranks get
``PYTHONBREAKPOINT=jupyter_mn.rank.nobreak.skip`` unless the user set the variable."""

from __future__ import annotations

import os
import sys
from typing import Any

HOOK = f"{__name__}.skip"
_skipped: set[tuple[str, int]] = set()


def skip(*args: Any, **kwargs: Any) -> None:
    """``sys.breakpointhook`` of a script rank: one line on stderr per place, then go on."""
    caller = sys._getframe(1)
    where = (caller.f_code.co_filename, caller.f_lineno)
    if where in _skipped:
        return
    _skipped.add(where)
    print(
        f"jupyter_mn: rank {os.environ.get('RANK', '?')} skipped breakpoint() at {where[0]}, "
        f"line {where[1]}: a %cluster run script cannot prompt (debug the code in a %%cluster "
        "cell instead)",
        file=sys.stderr,
        flush=True,
    )
