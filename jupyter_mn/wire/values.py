"""A rank's value as it travels to the kernel: a pickle and its buffers, and tensors as arrays.

Torch pickles a tensor through ``torch.save`` into a buffer (about two copies each way, and the
whole storage for a view); NumPy's pickle at protocol 5 hands the array's memory over as a
buffer. A rank pickles its values with ``reduce`` for tensors, keeping the buffers out of the
pickle (``Pickled``); they cross each hop out of band (``frames.py``), and the kernel's
``loads`` rebuilds arrays on the memory they arrived in. ``rebuild`` needs torch there, as the
tensor it makes does anyway.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Pickled:
    """A value pickled at protocol 5 with its buffers apart."""

    data: bytes
    buffers: tuple[pickle.PickleBuffer, ...] = ()

    @property
    def nbytes(self) -> int:
        return len(self.data) + sum(b.raw().nbytes for b in self.buffers)

    def loads(self) -> Any:
        import cloudpickle  # what pickled it: a notebook function's value needs it

        return cloudpickle.loads(self.data, buffers=self.buffers)


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
