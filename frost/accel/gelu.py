"""GELU (exact erf and tanh approximation) on the GPU: one element-wise launch each way, registered with
frost.dispatch as gelu's fast path. The reference math, and the op that asks for this, is frost/ops/elementwise.py."""
import math

from frost import dispatch
from frost.accel import epilogue
from frost.accel.bias import SUM_ROWS_THREADS, linear_bias_of, row_chunks
from frost.layout import data_ptr
from frost.kernel import Array, Const, bdx, bf16, by, bx, cdiv, device, erf, exp, f16, f32, i32, kernel, load4, \
    load8_into, load8_of, local, static_range, store4, store8_f32_from, store8_from, store8_of, tanh, tx
from frost.ops.matmul import keep_column_sums
from frost.tensor import Tensor, from_op

# The reference path makes half a dozen full-size temporaries per direction (and widens bf16 to float32 in memory);
# here each element is read once, computed in float32 in registers and rounded once into the input's dtype.
# Aligned arrays move 16 bytes per access: 4 float32 values a thread (load4/store4) or 8 bf16/fp16 (load8/store8);
# the one-value-per-thread kernels take the rest. The backward recomputes the inner tanh/erf from x instead of
# keeping it.

GELU_THREADS = 256
SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
SQRT_2 = math.sqrt(2.0)
INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)
TANH_COEF = 0.044715
TANH_COEF_3 = 3 * 0.044715


@device
def _gelu(a, TANH: Const[bool]):
    """0.5 * a * (1 + tanh(sqrt(2/pi) * (a + 0.044715 a^3))) or 0.5 * a * (1 + erf(a / sqrt(2))), a in f32."""
    t = 0.0
    if TANH:
        t = tanh(SQRT_2_OVER_PI * (a + TANH_COEF * (a * a * a)))
    else:
        t = erf(a / SQRT_2)
    return 0.5 * a * (1.0 + t)


@device
def _gelu_slope(a, TANH: Const[bool]):
    """d gelu / da at a (f32), in the reference path's order of operations."""
    slope = 0.0
    if TANH:
        t = tanh(SQRT_2_OVER_PI * (a + TANH_COEF * (a * a * a)))
        slope = 0.5 * (1.0 + t) + 0.5 * a * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + TANH_COEF_3 * a * a)
    else:
        slope = 0.5 * (1.0 + erf(a / SQRT_2)) + a * exp(-0.5 * a * a) * INV_SQRT_2PI
    return slope


def _kernels(T):
    @kernel
    def gelu_forward(x: Array[T], y: Array[T], n: i32, TANH: Const[bool]):
        """y[i] = gelu(x[i]), one value per thread."""
        i = bx * bdx + tx
        if i < n:
            y[i] = _gelu(f32(x[i]), TANH)

    @kernel
    def gelu_backward(g: Array[T], x: Array[T], dx: Array[T], n: i32, TANH: Const[bool]):
        """dx[i] = g[i] * gelu'(x[i]), one value per thread."""
        i = bx * bdx + tx
        if i < n:
            dx[i] = f32(g[i]) * _gelu_slope(f32(x[i]), TANH)
    return gelu_forward, gelu_backward


@kernel
def gelu_forward_vec4(x: Array[f32], y: Array[f32], n: i32, TANH: Const[bool]):
    """gelu_forward of 16-byte aligned float32 arrays, 4 values per thread (the last n % 4 one by one)."""
    i = (bx * bdx + tx) * 4
    if i + 4 <= n:
        x0, x1, x2, x3 = load4(x, i)
        store4(y, i, _gelu(x0, TANH), _gelu(x1, TANH), _gelu(x2, TANH), _gelu(x3, TANH))
    elif i < n:
        for k in range(i, n):
            y[k] = _gelu(x[k], TANH)


@kernel
def gelu_backward_vec4(g: Array[f32], x: Array[f32], dx: Array[f32], n: i32, TANH: Const[bool]):
    """gelu_backward of 16-byte aligned float32 arrays, 4 values per thread (the last n % 4 one by one)."""
    i = (bx * bdx + tx) * 4
    if i + 4 <= n:
        x0, x1, x2, x3 = load4(x, i)
        g0, g1, g2, g3 = load4(g, i)
        store4(dx, i, g0 * _gelu_slope(x0, TANH), g1 * _gelu_slope(x1, TANH), g2 * _gelu_slope(x2, TANH),
               g3 * _gelu_slope(x3, TANH))
    elif i < n:
        for k in range(i, n):
            dx[k] = g[k] * _gelu_slope(x[k], TANH)


def _kernels_vec8(T):
    @kernel
    def gelu_forward_vec8(x: Array[T], y: Array[T], n: i32, TANH: Const[bool]):
        """gelu_forward of 16-byte aligned bf16/fp16 arrays, 8 values per thread (the last n % 8 one by one)."""
        i = (bx * bdx + tx) * 8
        if i + 8 <= n:
            v = local(f32, 8)
            load8_into(v, x, i)
            for k in static_range(8):
                v[k] = _gelu(v[k], TANH)
            store8_from(y, i, v)
        elif i < n:
            for k in range(i, n):
                y[k] = _gelu(f32(x[k]), TANH)

    @kernel
    def gelu_backward_vec8(g: Array[T], x: Array[T], dx: Array[T], n: i32, TANH: Const[bool]):
        """gelu_backward of 16-byte aligned bf16/fp16 arrays, 8 values per thread (the last n % 8 one by one)."""
        i = (bx * bdx + tx) * 8
        if i + 8 <= n:
            v = local(f32, 8)
            d = local(f32, 8)
            load8_into(v, x, i)
            load8_into(d, g, i)
            for k in static_range(8):
                d[k] = d[k] * _gelu_slope(v[k], TANH)
            store8_from(dx, i, d)
        elif i < n:
            for k in range(i, n):
                dx[k] = f32(g[k]) * _gelu_slope(f32(x[k]), TANH)
    return gelu_forward_vec8, gelu_backward_vec8


def _backward_sum_rows_kernel(T):
    load8, store8 = load8_of(T), store8_of(T)

    @kernel
    def gelu_backward_sum_rows(g: Array[T], x: Array[T], dx: Array[T], part: Array[f32], rows: i32, cols: i32,
                               chunk: i32, TANH: Const[bool]):
        """gelu_backward of (rows, cols) arrays, 8 columns of the rows of chunk `by` a thread (sum_rows_partial's
        grid), and part[by, c:c + 8] the float32 sums of those columns of dx as stored: the bias gradient's
        partial sums of the linear layer that made x, as sum_rows_partial would read them from dx."""
        c = (bx * bdx + tx) * 8
        if c < cols:
            acc = local(f32, 8)
            v = local(f32, 8)
            d = local(f32, 8)
            for e in static_range(8):
                acc[e] = 0.0
            first = by * chunk
            for r in range(first, min(first + chunk, rows)):
                load8(v, x, r * cols + c)
                load8(d, g, r * cols + c)
                for e in static_range(8):
                    d[e] = d[e] * _gelu_slope(v[e], TANH)
                store8(dx, r * cols + c, d)
                for e in static_range(8):
                    acc[e] += f32(T(d[e]))
            store8_f32_from(part, by * cols + c, acc)
    return gelu_backward_sum_rows


GELU_KERNELS = {name: _kernels(T) for name, T in (("float32", f32), ("bfloat16", bf16), ("float16", f16))}
GELU_SUM_ROWS_KERNELS = {name: _backward_sum_rows_kernel(T) for name, T in (("float32", f32), ("bfloat16", bf16),
                                                                           ("float16", f16))}
gelu_forward, gelu_backward = GELU_KERNELS["float32"]
# the 16-byte kernels per dtype: (values a thread, forward, backward)
GELU_VECTOR_KERNELS = {"float32": (4, gelu_forward_vec4, gelu_backward_vec4),
                       "bfloat16": (8, *_kernels_vec8(bf16)), "float16": (8, *_kernels_vec8(f16))}


def _launch(scalar, vector, per_thread: int, *arrays, n: int, tanh_form: bool) -> None:
    """The 16-byte kernel (per_thread values a thread) when every array is 16-byte aligned, else the
    one-value-per-thread kernel."""
    if all(data_ptr(a) % 16 == 0 for a in arrays):
        vector[cdiv(n, per_thread * GELU_THREADS), GELU_THREADS](*arrays, n, TANH=tanh_form)
    else:
        scalar[cdiv(n, GELU_THREADS), GELU_THREADS](*arrays, n, TANH=tanh_form)


def _fits_kernels(x: Tensor, *, approximate: str) -> bool:
    # i32 indices, with room for the last block's overrun
    return 0 < x.numel() < 2**31 - 4 * GELU_THREADS


@dispatch.register("gelu", device="cuda", dtypes=("float32", "bfloat16", "float16"), layouts=("contiguous",),
                   applies=_fits_kernels)
def gelu_kernels(x: Tensor, approximate: str) -> Tensor:
    """gelu of a contiguous float32/bf16/fp16 x (approximate "none" or "tanh", checked by the op) by the kernels
    above."""
    xp = x.xp
    forward, backward_kernel = GELU_KERNELS[x.dtype.name]
    per_thread, forward_vector, backward_vector = GELU_VECTOR_KERNELS[x.dtype.name]
    xa = x.data.reshape(-1)
    n = xa.size
    tanh_form = approximate == "tanh"
    y = epilogue.take(x, "gelu_tanh" if tanh_form else "gelu")   # computed by the linear layer's product
    if y is None:
        y = xp.empty_like(xa)
        _launch(forward, forward_vector, per_thread, xa, y, n=n, tanh_form=tanh_form)

    def backward(g):
        g = xp.ascontiguousarray(g, dtype=xa.dtype).reshape(-1)
        dx = xp.empty_like(xa)
        bias = linear_bias_of(x, g, xa, dx)
        if bias is None:
            _launch(backward_kernel, backward_vector, per_thread, g, xa, dx, n=n, tanh_form=tanh_form)
            return (dx.reshape(x.shape),)
        rows, cols = n // x.shape[-1], x.shape[-1]
        chunk, parts = row_chunks(rows)
        part = xp.empty(parts * cols, xp.float32)
        GELU_SUM_ROWS_KERNELS[x.dtype.name][(cdiv(cols // 8, SUM_ROWS_THREADS), parts), SUM_ROWS_THREADS](
            g, xa, dx, part, rows, cols, chunk, TANH=tanh_form)
        dx = dx.reshape(x.shape)
        keep_column_sums(bias, dx, part.reshape(parts, cols))   # the layer's bias gradient without reading dx again
        return (dx,)

    return from_op(y.reshape(x.shape), (x,), backward, "gelu")
