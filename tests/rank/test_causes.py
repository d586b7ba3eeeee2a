"""Which errors of a rank are consequences of another rank's failure (``rank/causes.py``)."""

from __future__ import annotations

import pytest

from jupyter_mn.rank.causes import is_secondary


def interrupt(struck_in: str, while_handling: BaseException | None = None) -> KeyboardInterrupt:
    """A KeyboardInterrupt as the rank's SIGINT handler raises it, maybe during another error."""
    try:
        try:
            if while_handling is not None:
                raise while_handling
        finally:
            exc = KeyboardInterrupt()
            exc.struck_in = struck_in  # type: ignore[attr-defined]
            raise exc
    except KeyboardInterrupt as caught:
        return caught


CELL = "<ipython-input-3>"
TORCH = "/site-packages/torch/distributed/distributed_c10d.py"


@pytest.mark.parametrize(
    ("exc", "secondary"),
    [
        (RuntimeError("[gloo] Connection closed by peer [127.0.0.1]:1234"), True),
        (ValueError("bad batch"), False),
        (interrupt(TORCH), True),  # waiting in a collective: another rank kept it waiting
        (interrupt(CELL), False),  # busy in its own code: it kept the others waiting
        # the wait failed (the interrupt closed its connections) and the interrupt struck in
        # the cell while that consequence was on its way out
        (interrupt(CELL, RuntimeError("Connection closed by peer")), True),
        (interrupt(CELL, ValueError("bad batch")), False),
    ],
)
def test_a_consequence_of_a_peers_failure_is_secondary(exc, secondary):
    assert is_secondary(exc) is secondary
