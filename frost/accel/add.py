"""a + b of two same-shape float32/bf16/f16 arrays on the GPU in one pass, 16-byte accesses: registered with
frost.dispatch as `add`'s fast path (frost/ops/elementwise.py asks for same-shape tensors; the autograd's sum of a
tensor's gradient contributions asks too). A float32 residual stream plus a bf16 branch (autocast's linear) is read
as it is: CuPy's add would first cast the branch to a float32 copy (a pass of its own) and move one value a
thread. Each thread adds eight values in float32 and rounds once into the output's dtype."""
import functools

import numpy as np

from frost import dispatch
from frost.kernel import (Array, bdx, bf16, bx, cdiv, f16, f32, i32, kernel, load8_of, local, static_range,
                          store8_of, tx)
from frost.layout import data_ptr

ADD_THREADS = 256
TYPES = {"float32": f32, "bfloat16": bf16, "float16": f16}


@functools.cache
def add_kernel(a_dtype: str, b_dtype: str, out_dtype: str):
    """The kernel of one (a, b, out) dtype triple, made on first use (27 triples; a program meets one or two)."""
    TA, TB, TO = TYPES[a_dtype], TYPES[b_dtype], TYPES[out_dtype]
    load_a, load_b, store = load8_of(TA), load8_of(TB), store8_of(TO)

    @kernel
    def add_vec8(a: Array[TA], b: Array[TB], out: Array[TO], n: i32):
        """out = a + b in float32, rounded once into out's dtype; 8 values a thread (the last n % 8 one by one)."""
        i = (bx * bdx + tx) * 8
        if i + 8 <= n:
            va = local(f32, 8)
            vb = local(f32, 8)
            load_a(va, a, i)
            load_b(vb, b, i)
            for e in static_range(8):
                va[e] = va[e] + vb[e]
            store(out, i, va)
        elif i < n:
            for k in range(i, n):
                out[k] = f32(a[k]) + f32(b[k])
    return add_vec8


def applies(a, b, *, dtype) -> bool:
    """Two C-order, 16-byte aligned arrays of one shape on the same device, each and the result float32, bf16 or
    f16, with i32 indices."""
    return (type(a) is type(b) and a.shape == b.shape and b.flags.c_contiguous and str(b.dtype) in TYPES
            and str(np.dtype(dtype)) in TYPES and 0 < a.size < 2**31 - 8 * ADD_THREADS
            and data_ptr(a) % 16 == 0 and data_ptr(b) % 16 == 0)


@dispatch.register("add", device="cuda", dtypes=tuple(TYPES), layouts=("contiguous",), applies=applies)
def add_kernels(a, b, dtype):
    """a + b (CuPy arrays of one shape) as a new C-order array of dtype, by the kernels above."""
    out = type(a)(a.shape, dtype=dtype)
    n = a.size
    add_kernel(str(a.dtype), str(b.dtype), str(np.dtype(dtype)))[cdiv(n, 8 * ADD_THREADS), ADD_THREADS](
        a.reshape(-1), b.reshape(-1), out.reshape(-1), n)
    return out
