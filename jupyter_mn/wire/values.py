"""A tensor as it travels in a cell's value: its bytes as a NumPy array, rebuilt by the kernel.

Torch pickles a tensor through ``torch.save`` into a buffer (about two copies each way, and the
whole storage for a view); NumPy's pickle at protocol 5 writes the array's memory as it is. A
rank pickles its values with ``reduce``; unpickling in the kernel calls ``rebuild``, which needs
torch there, as the tensor it makes does anyway.
"""

from __future__ import annotations

from typing import Any


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
