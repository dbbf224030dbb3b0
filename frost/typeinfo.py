"""frost.finfo, frost.iinfo and frost.is_tensor, as PyTorch's: the limits of a dtype, and the tensor test."""
from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np

from frost.dtype import DType, default_float_dtype, to_dtype
from frost.tensor import Tensor

__all__ = ["finfo", "iinfo", "is_tensor"]


class finfo:  # noqa: N801 - PyTorch's spelling
    """The machine limits of a floating-point dtype (frost.finfo(frost.float16).max, .eps, .tiny ...); with no
    argument, of the default float dtype."""

    def __init__(self, type: DType | Any = None) -> None:  # noqa: A002 - PyTorch's argument name
        dtype = default_float_dtype() if type is None else to_dtype(type)
        if not dtype.is_floating_point:
            raise TypeError(f"frost.finfo() requires a floating point input type, got {dtype!r}; use frost.iinfo "
                            f"for integer types")
        info = ml_dtypes.finfo(dtype.np) if dtype.name == "bfloat16" else np.finfo(dtype.np)
        self.bits = int(info.bits)
        self.eps = float(info.eps)
        self.max = float(info.max)
        self.min = float(info.min)
        self.tiny = float(info.tiny)
        self.smallest_normal = self.tiny
        # PyTorch's: 10 ** -(the decimal digits eps resolves), 0.01 for bfloat16 (NumPy-style finfo gives 0.01001)
        self.resolution = float(f"1e-{math.floor(-math.log10(self.eps))}")
        self.dtype = dtype.name

    def __repr__(self) -> str:
        return (f"finfo(resolution={self.resolution:g}, min={self.min:g}, max={self.max:g}, eps={self.eps:g}, "
                f"smallest_normal={self.smallest_normal:g}, tiny={self.tiny:g}, dtype={self.dtype})")


class iinfo:  # noqa: N801 - PyTorch's spelling
    """The limits of an integer dtype: frost.iinfo(frost.int8).min, .max, .bits."""

    def __init__(self, type: DType | Any) -> None:  # noqa: A002 - PyTorch's argument name
        dtype = to_dtype(type)
        if dtype.is_floating_point or dtype.name == "bool":
            raise TypeError(f"frost.iinfo() requires an integer input type, got {dtype!r}; use frost.finfo for "
                            f"floating-point types")
        info = np.iinfo(dtype.np)
        self.bits, self.max, self.min, self.dtype = int(info.bits), int(info.max), int(info.min), dtype.name

    def __repr__(self) -> str:
        return f"iinfo(min={self.min}, max={self.max}, dtype={self.dtype})"


def is_tensor(obj: Any) -> bool:
    """Whether obj is a frost.Tensor (a Parameter too)."""
    return isinstance(obj, Tensor)
