"""A rank's value as it travels to the kernel: a pickle and its buffers, and tensors as arrays.

Torch pickles a tensor through ``torch.save`` into a buffer (about two copies each way, and the
whole storage for a view); NumPy's pickle at protocol 5 hands the array's memory over as a
buffer. A rank pickles its values, and the kernel a cell's names, with ``CpuPickler``: ``reduce``
for tensors, keeping the buffers out of the
pickle (``Pickled``); they cross each hop out of band (``frames.py``), and the kernel's
``loads`` rebuilds arrays on the memory they arrived in. ``rebuild`` needs torch there, as the
tensor it makes does anyway.

Large ``bytes`` and ``bytearray`` travel out of band too: the C pickler writes them into the
pickle without asking ``reducer_override``, so ``CpuPickler`` names them with ``persistent_id``
(``OutOfBand``), and ``loads`` makes them again from their buffer (one copy, where inside the
pickle they cost a copy per hop and per framing): a value's, and a notebook name's, which the
ranks of a host then share as an array's (``sharednames.py``).

A value over ``CellPayload.max_value`` (``--max-value``) is refused on the rank by ``check_size``,
before its read-only buffers are copied or anything is sent.
"""

from __future__ import annotations

import io
import pickle
import sys
from dataclasses import dataclass
from typing import Any

import cloudpickle

from .payload import InFile
from .sizes import size_text

#: ``bytes`` this long or longer travel out of band; shorter ones cost less inside the pickle.
OUT_OF_BAND_BYTES = 64 << 10


class CpuPickler(cloudpickle.Pickler):
    """cloudpickle with tensors as CPU bytes: a plain tensor as its memory (``reduce``), other
    kinds (parameters, sparse, quantized) as torch pickles them, from the CPU. A process that
    has not imported torch holds no tensor, and does not import torch for one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.persistent_id = OutOfBand()  # large bytes out of band too

    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor):
            if type(obj) is torch.Tensor and obj.layout == torch.strided and not obj.is_quantized:
                return reduce(obj)
            if obj.device.type != "cpu":
                return obj.detach().cpu().__reduce_ex__(pickle.HIGHEST_PROTOCOL)
        return super().reducer_override(obj)


class ValueTooLarge(Exception):
    """A value larger than ``--max-value``: the rank refuses to send it."""


@dataclass(frozen=True)
class Pickled:
    """A value pickled at protocol 5 with its buffers apart: in memory, or in a file on its way
    to a kernel on this host (``valuefiles.py``)."""

    data: bytes
    buffers: tuple[pickle.PickleBuffer, ...] = ()
    file: InFile | None = None

    @property
    def nbytes(self) -> int:
        in_file = sum(n for _, n in self.file.parts) if self.file is not None else 0
        return len(self.data) + sum(b.raw().nbytes for b in self.buffers) + in_file

    def loads(self) -> Any:
        return loads(self.data, self.buffers)


def loads(data: bytes, buffers: Any) -> Any:
    """What ``CpuPickler`` pickled as ``data`` and ``buffers``."""
    return _Unpickler(io.BytesIO(data), buffers=buffers).load()


class _OutOfBand:
    """What ``persistent_id`` gives for a large ``bytes``/``bytearray``: pickled as its type and
    a ``PickleBuffer``, so the pickler hands its memory to ``buffer_callback``."""

    __slots__ = ("data", "mutable")

    def __init__(self, data: Any, mutable: bool) -> None:
        self.data = data
        self.mutable = mutable

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, tuple[Any, ...]]:
        return _OutOfBand, (pickle.PickleBuffer(self.data), self.mutable)


class OutOfBand:
    """A pickler's ``persistent_id``: a large ``bytes`` or ``bytearray`` goes out of band, once
    however often the value holds it (the pickler memoizes the one ``_OutOfBand`` it is given)."""

    def __init__(self) -> None:
        self._seen: dict[int, _OutOfBand] = {}  # each holds its object, so its id stays its own

    def __call__(self, obj: Any) -> _OutOfBand | None:
        if type(obj) not in (bytes, bytearray) or len(obj) < OUT_OF_BAND_BYTES:
            return None
        if id(obj) not in self._seen:
            self._seen[id(obj)] = _OutOfBand(obj, type(obj) is bytearray)
        return self._seen[id(obj)]


class _Unpickler(pickle.Unpickler):
    """Makes the rank's ``bytes``/``bytearray`` again from the buffer each arrived in: one
    object for one ``_OutOfBand``, as the rank's value held one."""

    def __init__(self, file: Any, buffers: Any) -> None:
        super().__init__(file, buffers=buffers)
        self._made: dict[int, tuple[_OutOfBand, bytes | bytearray]] = {}

    def persistent_load(self, pid: Any) -> Any:
        if id(pid) not in self._made:
            self._made[id(pid)] = (pid, (bytearray if pid.mutable else bytes)(pid.data))
        return self._made[id(pid)][1]


def check_size(what: str, buffers: list[pickle.PickleBuffer], data: bytes, limit: int) -> None:
    """Raise ``ValueTooLarge`` naming ``what`` if ``data`` and ``buffers`` exceed ``limit``."""
    size = len(data) + sum(b.raw().nbytes for b in buffers)
    if size > limit:
        raise ValueTooLarge(
            f"{what} is {size_text(size)} pickled, over --max-value {size_text(limit)}: "
            "nothing was sent. Return less (or save it to a file the notebook reads), or raise "
            "--max-value"
        )


def reduce(tensor: Any) -> tuple[Any, tuple[Any, ...]]:
    """What pickles ``tensor`` (a plain strided tensor, on any device) as its CPU bytes."""
    import torch

    cpu = tensor.detach().cpu().contiguous()
    try:
        array = cpu.numpy()
    except TypeError:  # a dtype NumPy lacks (bfloat16, float8): its bytes
        array = cpu.reshape(-1).view(torch.uint8).numpy()
    dtype = str(tensor.dtype).removeprefix("torch.")
    return rebuild, (array, dtype, tuple(tensor.shape), tensor.requires_grad)


def rebuild(array: Any, dtype: str, shape: tuple[int, ...], requires_grad: bool) -> Any:
    import torch

    tensor = torch.from_numpy(array)
    want = getattr(torch, dtype)
    if tensor.dtype != want:
        tensor = tensor.view(want)
    return tensor.reshape(shape).requires_grad_(requires_grad)
