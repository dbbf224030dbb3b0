"""avg_pool_linear's GPU kernels (global average pool and linear in one launch, the input gradient in another),
registered with frost.dispatch as its fast path. The reference math, and the op that asks for this, is
frost/ops/head.py."""
# (no "from __future__ import annotations": the kernels' annotations name the closure's element type T)
from frost import dispatch
from frost.kernel import (Array, bdx, bf16, bx, by, cdiv, f32, gdy, i32, kernel, lane, shared, shfl_xor, syncthreads,
                          tx, warp)
from frost.layout import empty_like_format, flat_view
from frost.tensor import Tensor

HEAD_THREADS = 128
HEAD_MAX_FEATURES = 1024   # the pooled features a block keeps in shared memory
HEAD_BACKWARD_CHUNK = 1024   # elements of dx per block of the backward


def _head_kernels(T):
    """The forward and the input gradient for x of element type T (float32 or bf16); weight and sums in float32."""

    @kernel.warm
    @kernel
    def avg_pool_linear_forward(x: Array[T], w: Array[f32], pooled: Array[f32], out: Array[f32], C: i32, HW: i32,
                                O: i32, channels_last: i32):
        """Block n: pooled[n, c] = the mean of x[n, c] over its HW pixels (threads over c), then out[n, o] =
        pooled[n] . w[o] (a warp per o, lanes over c)."""
        feats = shared(f32, HEAD_MAX_FEATURES)
        n = bx
        for c in range(tx, C, bdx):
            s = 0.0
            for i in range(HW):
                s += f32(x[(n * HW + i) * C + c] if channels_last != 0 else x[(n * C + c) * HW + i])
            mean = s / f32(HW)
            feats[c] = mean
            pooled[n * C + c] = mean
        syncthreads()
        for o in range(warp, O, bdx // 32):
            s = 0.0
            for c in range(lane, C, 32):
                s += feats[c] * w[o * C + c]
            s += shfl_xor(s, 16)
            s += shfl_xor(s, 8)
            s += shfl_xor(s, 4)
            s += shfl_xor(s, 2)
            s += shfl_xor(s, 1)
            if lane == 0:
                out[n * O + o] = s

    @kernel.warm
    @kernel
    def avg_pool_linear_backward_input(g: Array[f32], w: Array[f32], dx: Array[T], C: i32, HW: i32, O: i32,
                                       channels_last: i32):
        """Block (n, part): d[c] = (g[n] . w[:, c]) / HW, then dx[n, c, every pixel] = d[c] over part's share of
        image n's C * HW elements (in dx's memory order)."""
        d = shared(f32, HEAD_MAX_FEATURES)
        n = bx
        for c in range(tx, C, bdx):
            s = 0.0
            for o in range(O):
                s += g[n * O + o] * w[o * C + c]
            d[c] = s / f32(HW)
        syncthreads()
        for e in range(by * bdx + tx, C * HW, gdy * bdx):
            dx[n * C * HW + e] = d[e % C] if channels_last != 0 else d[e // HW]

    return avg_pool_linear_forward, avg_pool_linear_backward_input


KERNELS = {"float32": _head_kernels(f32), "bfloat16": _head_kernels(bf16)}


def _fits_kernels(x: Tensor, weight: Tensor) -> bool:
    """Whether the kernels above compute this call (dispatch checked the device, x's dtype and its layout: dense
    NCHW or channels-last): x not empty (a launch needs blocks), a float32 weight, at most HEAD_MAX_FEATURES
    channels (the shared buffer), i32 indices."""
    xa = x.data
    return (xa.size > 0 and str(weight.data.dtype) == "float32" and xa.shape[1] <= HEAD_MAX_FEATURES
            and xa.size < 2**31)


def _memory(a):
    """A dense array's memory as a 1-D view, and 1 when it is in channels-last order (else NCHW, C-contiguous)."""
    channels_last = int(not a.flags.c_contiguous)
    return flat_view(a, channels_last), channels_last


@dispatch.register("avg_pool_linear", device="cuda", dtypes=tuple(KERNELS), layouts=("contiguous", "channels_last"),
                   applies=_fits_kernels)
def avg_pool_linear_kernels(x: Tensor, weight: Tensor) -> tuple:
    """(pooled, logits, input_gradient) of x (N, C, H, W) and weight (out_features, C): the pooled features
    (N, C) and the logits (N, out_features), both float32, by one launch, and the function that makes x's gradient
    (in x's dtype and memory format) from the logits' float32 gradient by another. The op (frost/ops/head.py) adds
    the bias and makes the weight's and the bias's gradients."""
    xp, xa = x.xp, x.data
    n, c, h, wd = xa.shape
    w = xp.ascontiguousarray(weight.data)
    pooled, out = xp.empty((n, c), xp.float32), xp.empty((n, w.shape[0]), xp.float32)
    forward, backward_input = KERNELS[str(xa.dtype)]
    x_memory, channels_last = _memory(xa)
    forward[n, HEAD_THREADS](x_memory, w, pooled, out, c, h * wd, w.shape[0], channels_last)

    def input_gradient(g):
        dx = empty_like_format(xa.shape, xa)
        parts = cdiv(c * h * wd, HEAD_BACKWARD_CHUNK)
        dx_memory, channels_last = _memory(dx)
        backward_input[(n, parts), HEAD_THREADS](g, w, dx_memory, c, h * wd, w.shape[0], channels_last)
        return dx
    return pooled, out, input_gradient
