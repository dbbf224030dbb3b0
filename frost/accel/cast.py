"""Casts between float32 and the 16-bit floats on the GPU, 16 bytes an access: registered with frost.dispatch as the
fast path of `cast` (frost/ops/elementwise.py), which autocast runs for every weight and activation it converts and
whose backward converts every gradient back. CuPy's astype moves one value a thread (a 2-byte store each way);
these kernels move eight, so a cast runs near the memory's bandwidth."""
import numpy as np

from frost import dispatch
from frost.kernel import (Array, bdx, bf16, bx, cdiv, f16, f32, i32, kernel, load8_f32_into, load8_into, local,
                          store8_f32_from, store8_from, tx)
from frost.layout import data_ptr

CAST_THREADS = 256
SIXTEEN_BIT = {"bfloat16": bf16, "float16": f16}


def _kernels(T):
    @kernel
    def cast_from_f32(x: Array[f32], y: Array[T], n: i32):
        """y = x rounded to the 16-bit type (to nearest even), 8 values a thread (the last n % 8 one by one)."""
        i = (bx * bdx + tx) * 8
        if i + 8 <= n:
            v = local(f32, 8)
            load8_f32_into(v, x, i)
            store8_from(y, i, v)
        elif i < n:
            for k in range(i, n):
                y[k] = x[k]

    @kernel
    def cast_to_f32(x: Array[T], y: Array[f32], n: i32):
        """y = x widened to float32 (exact), 8 values a thread (the last n % 8 one by one)."""
        i = (bx * bdx + tx) * 8
        if i + 8 <= n:
            v = local(f32, 8)
            load8_into(v, x, i)
            store8_f32_from(y, i, v)
        elif i < n:
            for k in range(i, n):
                y[k] = f32(x[k])
    return cast_from_f32, cast_to_f32


CAST_KERNELS = {name: _kernels(T) for name, T in SIXTEEN_BIT.items()}


def _pair(source: str, target: str) -> tuple | None:
    """(kernel index, 16-bit name) for a float32 <-> 16-bit cast, else None."""
    if source == "float32" and target in SIXTEEN_BIT:
        return 0, target
    if target == "float32" and source in SIXTEEN_BIT:
        return 1, source
    return None


def applies(a, *, dtype) -> bool:
    """A C-order, 16-byte aligned array cast between float32 and bf16/f16, with i32 indices."""
    return (_pair(str(a.dtype), str(np.dtype(dtype))) is not None and 0 < a.size < 2**31 - 8 * CAST_THREADS
            and data_ptr(a) % 16 == 0)


@dispatch.register("cast", device="cuda", dtypes=("float32", "bfloat16", "float16"), layouts=("contiguous",),
                   applies=applies)
def cast_kernels(a, dtype):
    """a (a CuPy array) in dtype, by the kernels above."""
    which, name = _pair(str(a.dtype), str(np.dtype(dtype)))
    flat = a.reshape(-1)
    out = type(a)(a.shape, dtype=dtype)   # CuPy's ndarray: a new C-order array of a's shape
    n = flat.size
    CAST_KERNELS[name][which][cdiv(n, 8 * CAST_THREADS), CAST_THREADS](flat, out.reshape(-1), n)
    return out
