"""``%cluster status`` for a person: the cluster's state as a few lines, the data kept.

``Cluster.status()`` returns a dict for programs; the magic wraps it in ``StatusReport``, a dict
that IPython shows as text (as pandas' objects show a table and stay data), so
``s = %cluster status; s["state"]`` still works.
"""

from __future__ import annotations

from typing import Any

from ..model import usage


class StatusReport(dict):
    """A ``Cluster.status()`` dict that IPython displays as ``text()``."""

    def text(self) -> str:
        """``gang jmn-1a2b3c4d READY · 2×1 local · cpu (gloo)`` and the cells, idle time and
        usage below it; a cluster with no gang says why (``RELEASED: idle 1800 s``)."""
        s = self
        if s["id"] is None:
            return f"no gang ({s['state']}{': ' + s['detail'] if s['detail'] else ''})"
        device = f" · {s['device']}" if s["device"] and s["device"] != "unknown" else ""
        lines = [f"gang {s['id']} {s['state']} · {s['shape']} {s['backend']}{device}"]
        timeout = s["idle_timeout_s"]
        idle = f"idle {s['idle_s']:.0f} s" + (f" (released at {timeout:.0f} s)" if timeout else "")
        lines.append(f"  {s['cells']} cell{'' if s['cells'] == 1 else 's'} · {idle}")
        if s["unit"]:
            lines.append(f"  {usage.text(s['gpu_hours'], s['unit'])} so far")
        if s["detail"] and s["detail"] != s["device"]:
            lines.append(f"  {s['detail']}")
        return "\n".join(lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.text())
