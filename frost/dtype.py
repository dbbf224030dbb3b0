"""Frost's data types and the promotion rules between them."""
from __future__ import annotations

import ml_dtypes
import numpy as np


class DType:
    """A tensor element type: a name and the NumPy dtype that stores it."""

    __slots__ = ("name", "np", "is_floating_point", "itemsize")

    def __init__(self, name: str, np_dtype) -> None:
        self.name = name
        self.np = np.dtype(np_dtype)
        self.is_floating_point = name in ("float16", "bfloat16", "float32", "float64")
        self.itemsize = self.np.itemsize

    def __repr__(self) -> str:
        return f"frost.{self.name}"

    def __eq__(self, other) -> bool:
        if isinstance(other, DType):
            return self.name == other.name
        try:
            return to_dtype(other).name == self.name
        except TypeError:
            return NotImplemented

    def __hash__(self) -> int:
        return hash(self.name)

    def __reduce__(self):
        return (to_dtype, (self.name,))  # unpickles to the same singleton


float16 = DType("float16", np.float16)
bfloat16 = DType("bfloat16", ml_dtypes.bfloat16)
float32 = DType("float32", np.float32)
float64 = DType("float64", np.float64)
int8 = DType("int8", np.int8)
int16 = DType("int16", np.int16)
int32 = DType("int32", np.int32)
int64 = DType("int64", np.int64)
uint8 = DType("uint8", np.uint8)
bool_ = DType("bool", np.bool_)

ALL = (float16, bfloat16, float32, float64, int8, int16, int32, int64, uint8, bool_)
_BY_NAME = {d.name: d for d in ALL}
_BY_NP = {d.np: d for d in ALL}
_ALIASES = {"float": float32, "double": float64, "half": float16, "long": int64, "int": int32}

default_float = float32  # frost.set_default_dtype changes it; read it through default_float_dtype()


def default_float_dtype() -> DType:
    """The dtype of Python floats and of float factories without dtype= (float32 unless set_default_dtype)."""
    return default_float


def set_default_float_dtype(d: DType) -> None:
    global default_float
    default_float = d


def to_dtype(x) -> DType:
    """Turn a DType, NumPy dtype, name or Python type into a Frost DType."""
    if isinstance(x, DType):
        return x
    if isinstance(x, np.dtype) and x in _BY_NP:  # the hot path: Tensor.dtype
        return _BY_NP[x]
    if isinstance(x, str):
        if x in _BY_NAME:
            return _BY_NAME[x]
        if x in _ALIASES:
            return _ALIASES[x]
        raise TypeError(f"unknown dtype name {x!r}; known: {sorted(_BY_NAME)}")
    if x is float:
        return default_float
    if x is int:
        return int64
    if x is bool:
        return bool_
    try:
        d = np.dtype(x)
    except TypeError:
        raise TypeError(f"cannot interpret {x!r} as a frost dtype") from None
    if d not in _BY_NP:
        raise TypeError(f"unsupported dtype {d}; frost supports {[n for n in _BY_NAME]}")
    return _BY_NP[d]


def promote(a: DType, b: DType) -> DType:
    """Result type of an operation between two tensors (PyTorch's rules for these types)."""
    if a == b:
        return a
    if a.is_floating_point and b.is_floating_point:
        if {a.name, b.name} == {"float16", "bfloat16"}:
            return float32
        return a if a.itemsize >= b.itemsize else b
    if a.is_floating_point:
        return a
    if b.is_floating_point:
        return b
    return to_dtype(np.promote_types(a.np, b.np))


def _category(d: DType) -> int:
    return 2 if d.is_floating_point else 0 if d.name == "bool" else 1


def result_type(a: DType, a_ndim: int, b: DType, b_ndim: int) -> DType:
    """Result type of a tensor-tensor op with PyTorch's rule for 0-d tensors.

    A 0-d tensor only decides the type when it is of a higher category (bool < integer < floating)
    than the other, dimensioned tensor: float32 (3,) + float64 () stays float32, int32 (3,) + float64 ()
    becomes float64.
    """
    if (a_ndim == 0) == (b_ndim == 0):
        return promote(a, b)
    dimmed, scalar = (a, b) if b_ndim == 0 else (b, a)
    if _category(scalar) > _category(dimmed):
        return scalar
    return dimmed


def scalar_result(t: DType, scalar) -> DType:
    """Result type of tensor (op) Python scalar: the scalar never widens a tensor's float type."""
    if isinstance(scalar, bool):
        return t
    if isinstance(scalar, float) and not t.is_floating_point:
        return default_float
    if isinstance(scalar, int) and t == bool_:
        return int64
    return t


def accumulator(dtype):
    """The type to add up in: float16 and bfloat16 sums accumulate in float32, as PyTorch's do (None: dtype itself)."""
    return np.float32 if dtype.itemsize == 2 and dtype.kind not in "iu" else None


def compute_dtype(array):
    """The dtype an op computes `array` in: float32 for float16 and bfloat16 (range and precision), else its own."""
    return accumulator(array.dtype) or array.dtype


def widened(a):
    """Array a in the type its sums accumulate in (accumulator): float16 and bfloat16 as float32, else a itself."""
    return a if accumulator(a.dtype) is None else a.astype(np.float32)
