"""a + b of two same-shape float32/bf16/f16 arrays on the GPU in one pass, 16-byte accesses: registered with
frost.dispatch as `add`'s fast path (frost/ops/elementwise.py asks for same-shape tensors; the autograd's sum of a
tensor's gradient contributions asks too). A float32 residual stream plus a bf16 branch (autocast's linear) is read
as it is: CuPy's add would first cast the branch to a float32 copy (a pass of its own) and move one value a
thread. Each thread adds eight values in float32 and rounds once into the output's dtype.

Also `sum_in_dtypes`'s fast path: that add's backward, given its output's two gradient contributions unsummed (a
residual stream's), writes their sum for the float32 operand and its 16-bit rounding for the branch in one pass,
where a sum and then a cast would read the sum again."""
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


@functools.cache
def sum_in_two_dtypes_kernel(dtype: str, narrow: str):
    """The kernel of like arrays of `dtype` summed into that dtype and into `narrow` (a 16-bit type), made on first
    use."""
    T, TN = TYPES[dtype], TYPES[narrow]
    load, store, store_narrow = load8_of(T), store8_of(T), store8_of(TN)

    @kernel
    def add_in_two_dtypes_vec8(a: Array[T], b: Array[T], out: Array[T], out_narrow: Array[TN], n: i32):
        """out = a + b and out_narrow = a + b, each the float32 sum rounded once into its dtype; 8 values a thread
        (the last n % 8 one by one)."""
        i = (bx * bdx + tx) * 8
        if i + 8 <= n:
            va = local(f32, 8)
            vb = local(f32, 8)
            load(va, a, i)
            load(vb, b, i)
            for e in static_range(8):
                va[e] = va[e] + vb[e]
            store(out, i, va)
            store_narrow(out_narrow, i, va)
        elif i < n:
            for k in range(i, n):
                total = f32(a[k]) + f32(b[k])
                out[k] = total
                out_narrow[k] = total
    return add_in_two_dtypes_vec8


def sums_in_two_dtypes(a, b, *, dtypes) -> bool:
    """Like arrays (as `add` takes them, of one dtype) wanted in their own dtype and one other float type."""
    names = {str(np.dtype(d)) for d in dtypes}
    return a.dtype == b.dtype and applies(a, b, dtype=a.dtype) and str(a.dtype) in names and len(names) == 2


@dispatch.register("sum_in_dtypes", device="cuda", dtypes=tuple(TYPES), layouts=("contiguous",),
                   applies=sums_in_two_dtypes)
def sum_in_two_dtypes(a, b, dtypes) -> list:
    """a + b (CuPy arrays of one shape and dtype) in each of `dtypes` (a's and one other) by one launch."""
    narrow = next(np.dtype(d) for d in dtypes if np.dtype(d) != a.dtype)
    out, out_narrow = type(a)(a.shape, dtype=a.dtype), type(a)(a.shape, dtype=narrow)
    n = a.size
    sum_in_two_dtypes_kernel(str(a.dtype), str(narrow))[cdiv(n, 8 * ADD_THREADS), ADD_THREADS](
        a.reshape(-1), b.reshape(-1), out.reshape(-1), out_narrow.reshape(-1), n)
    return [out if np.dtype(d) == a.dtype else out_narrow for d in dtypes]
