"""The 2-D or 3-D operands of a library's batched matrix product as 3-D ones, and the output array it writes."""
from __future__ import annotations

from typing import NamedTuple


class Product(NamedTuple):
    """a @ b as (batch, m, k) x (batch or 1, k, n) -> out (batch, m, n); `result` is what the caller returns once
    out is written: out itself, its 2-D view for two matrices, or the caller's own `out`."""
    a: object
    b: object
    out: object
    result: object


def out_dtypes(dtype) -> tuple:
    """The dtypes a product of `dtype` operands may be written in: its own, and float32 for the 16-bit types."""
    name = str(dtype)
    return (name, "float32") if name in ("bfloat16", "float16") else (name,)


def batched_product(cp, a, b, out=None) -> Product:
    """The operands of a @ b as 3-D arrays (a matrix gets a batch dim of 1; batch dims must be equal or 1) and a
    C-contiguous (batch, m, n) output: a new one of a's dtype, or `out` (the result's shape, C-contiguous, a's dtype
    or float32 for 16-bit operands: the libraries accumulate in float32 and may write it unrounded) seen as 3-D."""
    squeeze = a.ndim == 2 and b.ndim == 2
    a3 = a[None] if a.ndim == 2 else a
    b3 = b[None] if b.ndim == 2 else b
    if a3.shape[0] != b3.shape[0] and 1 not in (a3.shape[0], b3.shape[0]):
        raise ValueError(f"matmul: batch dims {a3.shape[0]} and {b3.shape[0]} do not broadcast")
    if a3.shape[2] != b3.shape[1]:
        raise ValueError(f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} do not multiply")
    shape3 = (max(a3.shape[0], b3.shape[0]), a3.shape[1], b3.shape[2])
    if out is None:
        out3 = cp.empty(shape3, dtype=a.dtype)
        return Product(a3, b3, out3, out3[0] if squeeze else out3)
    expected = shape3[1:] if squeeze else shape3
    if tuple(out.shape) != expected or str(out.dtype) not in out_dtypes(a.dtype) or not out.flags.c_contiguous:
        raise ValueError(f"matmul: out must be a C-contiguous {' or '.join(out_dtypes(a.dtype))} array of shape "
                         f"{expected}, got {out.dtype} {tuple(out.shape)}")
    return Product(a3, b3, out.reshape(shape3), out)
