"""jupyter_mn: run a notebook cell on a gang of torch.distributed ranks across nodes.

``%load_ext jupyter_mn`` (or the "Python 3 (jupyter_mn)" kernel) adds ``%%cluster``; the same
machinery is the Python API ``jupyter_mn.Cluster``. Importing this package is cheap: dask and
torch load only when a gang starts.
"""

from __future__ import annotations

from typing import Any

from .wire.version import __version__ as __version__

_LAZY = {
    "Cluster": ("kernel.cluster", "Cluster"),
    "ClusterSpec": ("model.spec", "ClusterSpec"),
    "CellResult": ("model.result", "CellResult"),
    "cluster_info": ("rank.info", "cluster_info"),
    "ClusterInfo": ("rank.info", "ClusterInfo"),
}

__all__ = [
    "CellResult",
    "Cluster",
    "ClusterInfo",
    "ClusterSpec",
    "cluster_info",
    "load_ipython_extension",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    raise AttributeError(f"module 'jupyter_mn' has no attribute {name!r}")


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """The prebuilt Lab extension (the Multi-node jobs panel) shipped inside this package."""
    return [{"src": "labextension", "dest": "jupyter-mn"}]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    """The REST API the panel reads (``jupyter_mn/server``)."""
    return [{"module": "jupyter_mn.server"}]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext jupyter_mn``: register ``%%cluster`` and ``%cluster``."""
    from .kernel.magics import load_ipython_extension as load

    load(ipython)
