"""Run an existing function on every rank: ``Cluster.launch(fn, *args)`` and ``%cluster launch``.

What accelerate's ``notebook_launcher`` and Spark's ``TorchDistributor.run`` offer, built on the
cell path rather than beside it: the function and its arguments become notebook names of a
one-line cell that calls it, so they travel by cloudpickle like any name a cell reads (a
function defined in the notebook included), and the call gets a cell's streaming, fail-fast
and stopping.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import SpecError

if TYPE_CHECKING:
    from ..model.result import CellResult
    from ..model.spec import ClusterSpec

_FN, _ARGS, _KWARGS = "_jupyter_mn_fn", "_jupyter_mn_args", "_jupyter_mn_kwargs"
#: The cell every rank runs: its value (rank 0's) is the function's return value.
CALL_CELL = f"{_FN}(*{_ARGS}, **{_KWARGS})"


def call_names(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict:
    """The names ``CALL_CELL`` reads; raise before anything starts if ``fn`` cannot be called."""
    if not callable(fn):
        raise SpecError(f"launch needs a function to run on the ranks, not {type(fn).__name__}")
    return {_FN: fn, _ARGS: tuple(args), _KWARGS: dict(kwargs)}


def launch(
    spec: ClusterSpec,
    run: Callable[..., CellResult],
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
) -> Any:
    """``Cluster.launch``: ``CALL_CELL`` on the ranks (``run``: the cluster's ``run``), shown as
    a cell's output is."""
    from ..views import make_view

    names = call_names(fn, args, kwargs)
    view = make_view(spec, title=f"launch {getattr(fn, '__name__', 'function')}")
    try:
        result = run(CALL_CELL, namespace=names, push=names, on_event=view)
    finally:
        view.close()
    return result.unwrap(verdict_shown=view.verdict_shown)


def parse_call(text: str, namespace: dict[str, Any]) -> tuple[Any, tuple, dict[str, Any]]:
    """``train`` or ``train(cfg, lr=0.1)`` → the function and its arguments, evaluated in the
    notebook's ``namespace`` (so they may name notebook variables)."""
    text = text.strip()
    if not text:
        raise SpecError("%cluster launch needs a function: %cluster launch train(cfg, lr=0.1)")
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError as exc:
        raise SpecError(
            f"%cluster launch {text}: not a function call ({exc.msg}); flags go before ' -- ': "
            "%cluster launch --nodes 2 -- train(cfg)"
        ) from None
    call = node if isinstance(node, ast.Call) else ast.Call(node, [], [])
    if any(isinstance(a, ast.Starred) for a in call.args) or any(
        k.arg is None for k in call.keywords
    ):
        raise SpecError("%cluster launch: *args and **kwargs are not supported; name each one")

    def value(expr: ast.expr) -> Any:
        code = compile(ast.Expression(expr), "<%cluster launch>", "eval")
        return eval(code, namespace)  # the user's own expression, in the user's own kernel

    fn = value(call.func)
    return fn, tuple(value(a) for a in call.args), {k.arg: value(k.value) for k in call.keywords}
