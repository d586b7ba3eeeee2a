"""GPU utilization on a node through NVML (nvidia-ml-py), mapped to the ranks that use each GPU.

No shelling out to nvidia-smi. A node without NVML (no driver, a CPU machine, a container
without the library) gets a ``note`` such as "no GPU (NVML Shared Library Not Found)" and is
never an error.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from ..wire.events import GpuStat
from .visible import nvml_text

_MIB = 1024 * 1024


@dataclass(frozen=True)
class RankProcess:
    rank: int
    local_rank: int
    pid: int
    #: the rank's CUDA_VISIBLE_DEVICES ("" when unset)
    visible: str = ""


def visible_gpu(local_rank: int, visible: str, uuids: list[str]) -> int | None:
    """The NVML index of the GPU ``cuda:<local_rank>`` is, given ``CUDA_VISIBLE_DEVICES``.

    Entries are indexes or ``GPU-<uuid>`` prefixes; MIG slices have no whole-GPU index (None).
    """
    entries = [e.strip() for e in visible.split(",") if e.strip()] if visible else None
    if entries is None:
        return local_rank if local_rank < len(uuids) else None
    if local_rank >= len(entries):
        return None
    entry = entries[local_rank]
    if entry.isdigit():
        return int(entry) if int(entry) < len(uuids) else None
    if entry.startswith("GPU-"):
        return next((i for i, u in enumerate(uuids) if u.startswith(entry)), None)
    return None


class GpuSampler:
    """Opens NVML once; ``sample()`` reads every GPU a rank of this node uses."""

    def __init__(self) -> None:
        self.note = ""
        self._nvml: Any = None
        self._handles: list[Any] = []
        self._uuids: list[str] = []
        try:
            import pynvml

            pynvml.nvmlInit()
        except ImportError:
            self.note = "no GPU (nvidia-ml-py is not installed)"
            return
        except Exception as exc:  # pynvml.NVMLError and its many per-code subclasses
            self.note = f"no GPU ({exc})"
            return
        self._nvml = pynvml
        count = pynvml.nvmlDeviceGetCount()
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self._uuids = [nvml_text(pynvml.nvmlDeviceGetUUID(h)) for h in self._handles]
        if not count:
            self.note = "no GPU (NVML sees none)"

    def sample(self, ranks: list[RankProcess]) -> tuple[GpuStat, ...]:
        """Per GPU used by ``ranks`` (all GPUs when none can be mapped): util, memory, power."""
        if self._nvml is None or not self._handles:
            return ()
        owners = self._owners(ranks)
        indexes = sorted(owners) or range(len(self._handles))
        return tuple(self._stat(i, tuple(sorted(owners.get(i, ())))) for i in indexes)

    def _owners(self, ranks: list[RankProcess]) -> dict[int, set[int]]:
        """GPU index → ranks: by the processes NVML lists, else by CUDA_VISIBLE_DEVICES."""
        by_pid = {r.pid: r.rank for r in ranks}
        owners: dict[int, set[int]] = {}
        placed: set[int] = set()
        for i, handle in enumerate(self._handles):
            for proc in self._processes(handle):
                if proc.pid in by_pid:
                    owners.setdefault(i, set()).add(by_pid[proc.pid])
                    placed.add(by_pid[proc.pid])
        for r in ranks:
            if r.rank not in placed:
                index = visible_gpu(r.local_rank, r.visible, self._uuids)
                if index is not None:
                    owners.setdefault(index, set()).add(r.rank)
        return owners

    def _processes(self, handle: Any) -> list[Any]:
        try:
            return list(self._nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        except self._nvml.NVMLError:  # not supported (some vGPUs): fall back to the env mapping
            return []

    def _stat(self, index: int, ranks: tuple[int, ...]) -> GpuStat:
        nvml, handle = self._nvml, self._handles[index]
        mem = nvml.nvmlDeviceGetMemoryInfo(handle)
        power = temp = None
        with contextlib.suppress(nvml.NVMLError):
            power = round(nvml.nvmlDeviceGetPowerUsage(handle) / 1000, 1)
        with contextlib.suppress(nvml.NVMLError):
            temp = int(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
        return GpuStat(
            index=index,
            name=nvml_text(nvml.nvmlDeviceGetName(handle)),
            util=int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
            mem_used=mem.used // _MIB,
            mem_total=mem.total // _MIB,
            power_w=power,
            temp_c=temp,
            ranks=ranks,
        )

    def close(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            self._nvml = None
