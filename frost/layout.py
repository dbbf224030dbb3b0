"""Memory formats of 4-D (N, C, H, W) arrays: the default NCHW and channels-last (NHWC memory, NCHW shape)."""
from __future__ import annotations

from frost.backend import cuda


class MemoryFormat:
    """A memory format, passed as `memory_format=` (frost.contiguous_format, frost.channels_last)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"frost.{self.name}"


contiguous_format = MemoryFormat("contiguous_format")
channels_last = MemoryFormat("channels_last")


def is_channels_last(a) -> bool:
    """Whether a 4-D array is laid out as a C-contiguous (N, H, W, C) array seen through an NCHW transpose.

    An array whose memory is also NCHW-contiguous (C == 1, or H == W == 1) counts as NCHW."""
    return a.ndim == 4 and not a.flags.c_contiguous and a.transpose(0, 2, 3, 1).flags.c_contiguous


def as_channels_last(a):
    """a (4-D, NCHW shape) with channels-last memory: itself when it already is, else a copy."""
    if a.ndim != 4:
        raise ValueError(f"channels_last: expected a 4-D (N, C, H, W) array, got shape {tuple(a.shape)}")
    if is_channels_last(a):
        return a
    xp = array_module(a)
    return xp.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


def dense_like(a, like):
    """a made dense in the memory format of `like` (channels-last or C-contiguous): no copy when it already is."""
    return in_format(a, channels_last if is_channels_last(like) else contiguous_format)


def empty_like_format(shape: tuple, like, dtype=None):
    """An uninitialised array of `shape` in the memory format of `like`."""
    xp, dtype = array_module(like), like.dtype if dtype is None else dtype
    if len(shape) == 4 and is_channels_last(like):
        n, c, h, w = shape
        return xp.empty((n, h, w, c), dtype=dtype).transpose(0, 3, 1, 2)
    return xp.empty(shape, dtype=dtype)


def in_format(a, memory_format: MemoryFormat):
    """a (any layout) as a dense array in `memory_format`; no copy when it already is."""
    if memory_format is channels_last:
        return as_channels_last(a)
    if memory_format is contiguous_format:
        return a if a.flags.c_contiguous else array_module(a).ascontiguousarray(a)
    raise TypeError(f"memory_format must be frost.contiguous_format or frost.channels_last, got {memory_format!r}")


def array_module(a):
    """NumPy or CuPy, whichever holds a."""
    import numpy as np
    if isinstance(a, np.ndarray):
        return np
    return cuda.cupy()


def flat_view(a, channels_last: bool):
    """The 1-D view of a dense array's memory (no copy: a copy of `out` would lose the result)."""
    view = a.transpose(0, 2, 3, 1).reshape(-1) if channels_last else a.reshape(-1)
    assert data_ptr(view) == data_ptr(a), "flat_view: a flat view of an array copied it"
    return view


def data_ptr(a) -> int:
    """The address of an array's first element (NumPy or CuPy)."""
    return a.__array_interface__["data"][0] if array_module(a).__name__ == "numpy" else a.data.ptr


def allocation(a):
    """The object that owns a's memory: the ndarray at the root of a NumPy view chain, CuPy's Memory."""
    if array_module(a).__name__ != "numpy":
        return a.data.mem
    while getattr(a, "base", None) is not None:
        a = a.base
    return a


def joined_view(pieces: list, axis: int):
    """The array that `pieces` make when joined along `axis`, as a view of their memory, where they lie side by
    side there (one allocation, one layout, each starting where the one before ends along `axis`): the gradients
    of q, k and v written into one block join into the gradient of the projection they were split from without
    a copy. None where they do not."""
    first = pieces[0]
    if any(p.ndim != first.ndim or p.strides != first.strides or p.dtype != first.dtype
           or p.shape[:axis] + p.shape[axis + 1:] != first.shape[:axis] + first.shape[axis + 1:] for p in pieces):
        return None
    owner, start, offset = allocation(first), data_ptr(first), 0
    for p in pieces:
        if allocation(p) is not owner or data_ptr(p) != start + offset * first.strides[axis]:
            return None
        offset += p.shape[axis]
    shape = first.shape[:axis] + (offset,) + first.shape[axis + 1:]
    return array_module(first).lib.stride_tricks.as_strided(first, shape, first.strides)
