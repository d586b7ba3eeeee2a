"""Where each rank is when a cell seems to hang: typed records that every side shares.

A rank builds its ``RankWhere`` on its stacks thread (``rank/runtime.py``) from torch's flight
recorder (``rank/flight.py``) and its main thread's stack; its node agent asks for it over the
rank's stacks socket (``WhereRequest``) and fills in what only it knows when the rank does not
answer (``node/process.py``); the kernel turns every rank's record into one verdict
(``verdict.py``). A leaf: it imports nothing of the package, so all three sides may import it.
"""

from __future__ import annotations

from dataclasses import dataclass

#: torch's ScalarType names, as the flight recorder writes them, in torch's own spelling.
_DTYPES = {
    "Float": "float32",
    "Double": "float64",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Long": "int64",
    "Int": "int32",
    "Short": "int16",
    "Char": "int8",
    "Byte": "uint8",
    "Bool": "bool",
    "ComplexFloat": "complex64",
    "ComplexDouble": "complex128",
}


#: A collective entered less than this long before its rank answered is in progress, not a
#: wait: ranks answer milliseconds apart (a rank in a busy loop may be one collective ahead of
#: the others' answers), and gloo counts a completion just after ``wait()`` returns.
MIN_WAIT_NS = 500_000_000


def dtype_name(scalar_type: str) -> str:
    """``"Float"`` → ``"float32"``; a name torch adds later stays as it is."""
    return _DTYPES.get(scalar_type, scalar_type.lower())


@dataclass(frozen=True)
class Collective:
    """A rank's latest collective in one process group, as torch's flight recorder has it.

    ``seq`` counts the group's collectives: every member issues #1, #2, … in the same order, so
    ranks at different numbers, or at one number with different ops, explain a hang.
    """

    pg: str
    #: the group's description (``default_pg``, or ``new_group(group_desc=...)``)
    pg_desc: str
    seq: int
    op: str
    sizes: tuple[tuple[int, ...], ...] = ()
    dtypes: tuple[str, ...] = ()
    #: wall-clock time the rank issued it (``time.time_ns()``)
    entered_ns: int = 0
    completed: bool = False
    #: the group's global ranks (every rank creates every group, member or not); () not known
    members: tuple[int, ...] = ()

    @property
    def args(self) -> str:
        """``float32[1024]``: its inputs' dtypes and sizes ("" for a barrier)."""
        return ", ".join(
            f"{dtype}[{'x'.join(map(str, size))}]"
            for dtype, size in zip(self.dtypes, self.sizes, strict=False)
        )

    @property
    def signature(self) -> str:
        """``all_reduce(float32[1024])``: what must match across the ranks."""
        return f"{self.op}({self.args})" if self.args else self.op

    @property
    def group(self) -> str:
        """``pg 0``, or ``pg 2 (experts)`` for a group the user described."""
        plain = self.pg_desc in ("", "default_pg", "undefined") or self.pg_desc.startswith("ptd:")
        return f"pg {self.pg}" if plain else f"pg {self.pg} ({self.pg_desc})"


@dataclass(frozen=True)
class WhereRequest:
    """The agent asks a rank where it is, on the rank's stacks socket (answered by a thread
    while the main thread is busy or blocked). ``stack``: False for the hang watchdog's poll,
    which needs the collectives alone (formatting a stack reads source files)."""

    stack: bool = True


@dataclass(frozen=True)
class AbortRequest:
    """Close this rank's connections of group ``generation`` from its stacks thread: a main
    thread blocked in a collective does not see SIGINT, but fails at once when they close."""

    generation: int


@dataclass(frozen=True)
class RankWhere:
    """Where one rank is: running a cell or not, its stack (the cell's own line numbers,
    innermost last) and its latest collective in each process group."""

    node: int
    rank: int
    busy: bool
    stack: tuple[str, ...] = ()
    collectives: tuple[Collective, ...] = ()
    #: the rank answered; else ``note`` says what the agent knows (exited, stopped, …)
    answered: bool = True
    note: str = ""
    #: when the rank answered (``time.time_ns()``)
    taken_ns: int = 0

    @property
    def label(self) -> str:
        return f"rank {self.rank} (node {self.node})"

    def waiting(self) -> Collective | None:
        """The collective this rank waits in (issued, not completed, for ``MIN_WAIT_NS`` at
        least when it answered), the oldest first."""
        inside = [
            c
            for c in self.collectives
            if not c.completed and self.taken_ns - c.entered_ns >= MIN_WAIT_NS
        ]
        return min(inside, key=lambda c: c.entered_ns) if inside else None

    def cell_line(self) -> str:
        """The innermost cell line of its stack with its code (``Cell In[7], line 14:
        load_batch()``), or "" when its stack has none."""
        cells = [i for i, line in enumerate(self.stack) if line.startswith("Cell ")]
        if not cells:
            return ""
        at = self.stack[cells[-1] : cells[-1] + 2]
        code = f": {at[1].strip()}" if len(at) > 1 and at[1].startswith("    ") else ""
        return f"{at[0]}{code}"

    def progress(self) -> tuple[object, ...]:
        """Changes whenever the rank enters or completes a collective, or ends its cell."""
        return (self.busy, *((c.pg, c.seq, c.completed) for c in self.collectives))
