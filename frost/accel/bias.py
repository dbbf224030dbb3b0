"""A linear layer's bias on the GPU, registered with frost.dispatch for frost/ops/matmul.py's linear: `add_bias`
adds it to every row of the product in place, `sum_rows` takes its gradient (the column sums of the output's
gradient) in float32, row chunks first, then the chunks' partial sums in a fixed order (deterministic). Eight
values a thread, 16-byte accesses. CuPy's broadcast add and axis-0 sum took 136 and 386 us a call at GPT-2's
16k x 768-3072 bf16 products (H100, commit 04de1a4: 25 ms of a 65 ms step), about 3x and 10x what moving
their bytes takes."""
import functools

import numpy as np

from frost import dispatch
from frost.kernel import (Array, bdx, bf16, bx, by, cdiv, f16, f32, i32, kernel, lane, load8_of, local, static_range,
                          store8_f32_from, store8_of, tx, warp_sum)
from frost.layout import data_ptr

BIAS_THREADS = 256
SUM_ROWS_THREADS = 128
SUM_ROWS_CHUNK = 64        # rows one thread adds up (its eight columns) before it writes a partial sum
MAX_CHUNKS = 65535         # partial sums at most (the grid's y dim): longer inputs take longer chunks
TYPES = {"float32": f32, "bfloat16": bf16, "float16": f16}


@functools.cache
def add_bias_kernel(out_dtype: str, bias_dtype: str):
    """out[r, c] += bias[c] for (out, bias) dtypes, made on first use."""
    TO, TB = TYPES[out_dtype], TYPES[bias_dtype]
    load_out, load_bias, store = load8_of(TO), load8_of(TB), store8_of(TO)

    @kernel
    def add_bias_vec8(out: Array[TO], bias: Array[TB], n: i32, cols: i32):
        """Eight values of one row a thread (cols % 8 == 0), added in float32 and rounded once into out's dtype."""
        i = (bx * bdx + tx) * 8
        if i < n:
            v = local(f32, 8)
            b = local(f32, 8)
            load_out(v, out, i)
            load_bias(b, bias, i % cols)
            for e in static_range(8):
                v[e] = v[e] + b[e]
            store(out, i, v)
    return add_bias_vec8


@functools.cache
def sum_rows_kernels(in_dtype: str, out_dtype: str):
    """(partial, finalize): the column sums of a (rows, cols) array into out, via float32 partial sums per chunk."""
    TI, TO = TYPES[in_dtype], TYPES[out_dtype]
    load = load8_of(TI)

    @kernel
    def sum_rows_partial(a: Array[TI], part: Array[f32], rows: i32, cols: i32, chunk: i32):
        """part[by, c:c + 8] = the sums of a[r, c:c + 8] over the rows r of chunk by, in float32."""
        c = (bx * bdx + tx) * 8
        if c < cols:
            acc = local(f32, 8)
            v = local(f32, 8)
            for e in static_range(8):
                acc[e] = 0.0
            first = by * chunk
            for r in range(first, min(first + chunk, rows)):
                load(v, a, r * cols + c)
                for e in static_range(8):
                    acc[e] += v[e]
            store8_f32_from(part, by * cols + c, acc)

    @kernel
    def sum_rows_finalize(part: Array[f32], out: Array[TO], parts: i32, cols: i32):
        """out[c] = the chunks' partial sums of column c, rounded once into out's dtype: a warp a column, lane l adds
        chunks l, l + 32, ... in order, then the warp's fixed butterfly (a thread a column left GPT-2's 768 columns
        to six blocks, 11 us a call on an H100)."""
        c = (bx * bdx + tx) // 32
        if c < cols:
            s = 0.0
            for p in range(lane, parts, 32):
                s += part[p * cols + c]
            s = warp_sum(s)
            if lane == 0:
                out[c] = s
    return sum_rows_partial, sum_rows_finalize


def _rows_of_eight(a) -> bool:
    """A C-order 2-D float32/bf16/f16 array of 16-byte aligned rows a multiple of 8 wide, with i32 indices."""
    return (a.ndim == 2 and a.flags.c_contiguous and str(a.dtype) in TYPES and a.shape[1] % 8 == 0
            and 0 < a.size < 2**31 - 8 * BIAS_THREADS and data_ptr(a) % 16 == 0)


def adds_bias(out, bias) -> bool:
    """out (rows, cols) as _rows_of_eight, and bias a dense (cols,) float array on the same device."""
    return (_rows_of_eight(out) and type(bias) is type(out) and bias.shape == (out.shape[1],)
            and bias.flags.c_contiguous and str(bias.dtype) in TYPES and data_ptr(bias) % 16 == 0)


def sums_rows(a, *, dtype, out=None) -> bool:
    """a as _rows_of_eight (its columns' warps indexable in i32), a float result dtype, and `out` None or a dense
    (cols,) array of that dtype."""
    return (_rows_of_eight(a) and 32 * a.shape[1] < 2**31 and str(np.dtype(dtype)) in TYPES
            and (out is None or (out.shape == (a.shape[1],) and out.dtype == np.dtype(dtype)
                                 and out.flags.c_contiguous)))


@dispatch.register("add_bias", device="cuda", dtypes=tuple(TYPES), layouts=("contiguous",), applies=adds_bias)
def add_bias_kernels(out, bias):
    """out += bias (broadcast over out's rows), in place, by add_bias_vec8; returns out."""
    n = out.size
    add_bias_kernel(str(out.dtype), str(bias.dtype))[cdiv(n, 8 * BIAS_THREADS), BIAS_THREADS](
        out.reshape(-1), bias, n, out.shape[1])
    return out


def linear_bias_of(t, *arrays):
    """The bias of the linear layer whose output t is, where t's gradient's column sums can be made beside it (a
    kernel writing that gradient adds them up as it goes): rows a multiple of 8 wide, `arrays` 16-byte aligned, the
    bias needing a gradient; else None."""
    node = t._ctx
    if node is None or node.name != "linear" or len(node.parents) != 3 or t.ndim < 2:
        return None
    fits = t.shape[-1] % 8 == 0 and all(data_ptr(a) % 16 == 0 for a in arrays) and 32 * t.shape[-1] < 2**31
    return node.parents[2] if fits and node.parents[2].requires_grad else None


def row_chunks(rows: int) -> tuple[int, int]:
    """(rows a chunk, chunks) of the column sums of `rows` rows: SUM_ROWS_CHUNK, longer where the grid would not fit."""
    chunk = max(SUM_ROWS_CHUNK, cdiv(rows, MAX_CHUNKS))
    return chunk, cdiv(rows, chunk)


@dispatch.register("sum_rows", device="cuda", dtypes=tuple(TYPES), layouts=("contiguous",), applies=sums_rows)
def sum_rows_kernels_call(a, dtype, out=None, partials=None):
    """a.sum(axis=0) in dtype (into `out` when given) by sum_rows_partial and sum_rows_finalize; given `partials`
    ((parts, cols) float32 sums of groups of a's rows, made by the kernel that wrote a), the finalize only."""
    rows, cols = a.shape
    out = type(a)(cols, dtype=dtype) if out is None else out
    partial, finalize = sum_rows_kernels(str(a.dtype), str(np.dtype(dtype)))
    if partials is None or partials.ndim != 2 or partials.shape[1] != cols:
        chunk, parts = row_chunks(rows)
        partials = type(a)((parts, cols), dtype=np.float32)
        partial[(cdiv(cols // 8, SUM_ROWS_THREADS), parts), SUM_ROWS_THREADS](a.reshape(-1), partials.reshape(-1),
                                                                              rows, cols, chunk)
    finalize[cdiv(32 * cols, SUM_ROWS_THREADS), SUM_ROWS_THREADS](partials.reshape(-1), out, partials.shape[0], cols)
    return out
