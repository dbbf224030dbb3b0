"""avg_pool_linear: a classifier head (global average pool, flatten, linear) as one op, with its GPU kernels."""
# (no "from __future__ import annotations": the kernels' annotations name the closure's element type T)

import numpy as np

from frost.autograd import grad_destination, gradient_branch
from frost.kernel import (Array, bdx, bf16, bx, by, cdiv, f32, gdy, i32, kernel, lane, shared, shfl_xor, syncthreads,
                          tx, warp)
from frost.layout import empty_like_format, flat_view, is_channels_last
from frost.ops.matmul import matmul_arrays
from frost.tensor import Tensor, from_op

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


def _check(x: Tensor, weight: Tensor, bias: Tensor | None) -> None:
    if not isinstance(x, Tensor) or x.ndim != 4:
        raise RuntimeError(f"avg_pool_linear: input must be a 4-D tensor (N, C, H, W), got shape "
                           f"{getattr(x, 'shape', type(x).__name__)}")
    if not isinstance(weight, Tensor) or weight.ndim != 2 or weight.shape[1] != x.shape[1]:
        raise RuntimeError(f"avg_pool_linear: weight of shape {getattr(weight, 'shape', None)} does not fit input of "
                           f"shape {x.shape} (expects (out_features, {x.shape[1]}))")
    if bias is not None and (not isinstance(bias, Tensor) or bias.shape != (weight.shape[0],)):
        raise RuntimeError(f"avg_pool_linear: bias of shape {getattr(bias, 'shape', None)} does not fit weight of "
                           f"shape {weight.shape}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.device != x.device:
            raise RuntimeError(f"avg_pool_linear: input is on {x.device} but {name} on {t.device}")
    if not (x.dtype.is_floating_point and weight.dtype.is_floating_point):
        raise RuntimeError(f"avg_pool_linear: input and weight must be floating point, got {x.dtype} and "
                           f"{weight.dtype}")


def _gpu_kernels(x, w) -> bool:
    """Whether the kernels above compute this call: CuPy arrays, x float32 or bf16 (dense NCHW or channels-last, not
    empty: a launch needs blocks), a float32 weight, at most HEAD_MAX_FEATURES channels."""
    return (not isinstance(x, np.ndarray) and x.size > 0 and str(x.dtype) in KERNELS and str(w.dtype) == "float32"
            and x.shape[1] <= HEAD_MAX_FEATURES and x.size < 2**31 and (x.flags.c_contiguous or is_channels_last(x)))


def _memory(a):
    """A dense array's memory as a 1-D view, and 1 when it is in channels-last order (else NCHW, C-contiguous)."""
    channels_last = int(not a.flags.c_contiguous)
    return flat_view(a, channels_last), channels_last


def avg_pool_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """linear(flatten(adaptive_avg_pool2d(x, 1)), weight, bias) in one op: x (N, C, H, W) -> (N, out_features).

    The pooled features and the product are summed in float32 (float64 for float64 inputs) and the result has
    that dtype, also under autocast: a head's few logits feed a loss that wants float32. On the GPU one kernel
    makes the logits and one the input gradient (in x's dtype and memory format); the weight's gradient, a
    (out_features x N) by (N x C) product, runs on a captured step's gradient branch."""
    _check(x, weight, bias)
    xp, xa, w = x.xp, x.data, weight.data
    n, c, h, wd = xa.shape
    dtype = np.result_type(np.float32, xa.dtype, w.dtype)
    on_gpu = _gpu_kernels(xa, w)
    if on_gpu:
        pooled, out = xp.empty((n, c), xp.float32), xp.empty((n, w.shape[0]), xp.float32)
        w = xp.ascontiguousarray(w)
        forward, backward_input = KERNELS[str(xa.dtype)]
        x_memory, channels_last = _memory(xa)
        forward[n, HEAD_THREADS](x_memory, w, pooled, out, c, h * wd, w.shape[0], channels_last)
    else:
        pooled = xa.astype(dtype, copy=False).mean(axis=(2, 3))
        out = matmul_arrays(xp, pooled, w.astype(dtype, copy=False).T)
    if bias is not None:
        out = out + bias.data.astype(dtype, copy=False)

    def backward(g):
        g = xp.ascontiguousarray(g, dtype=dtype)
        # straight into the weight's zeroed .grad buffer when it has the product's dtype (see linear)
        dest = grad_destination(weight) if w.dtype == dtype else None
        with gradient_branch(g, pooled, when=dest is not None):
            gw = matmul_arrays(xp, g.T, pooled, out=dest)
        dx = empty_like_format(xa.shape, xa)
        if on_gpu:
            parts = cdiv(c * h * wd, HEAD_BACKWARD_CHUNK)
            dx_memory, channels_last = _memory(dx)
            backward_input[(n, parts), HEAD_THREADS](g, w, dx_memory, c, h * wd, w.shape[0], channels_last)
        else:
            dx[...] = (matmul_arrays(xp, g, w.astype(dtype, copy=False)) / (h * wd))[:, :, None, None]
        grads = [dx, gw.astype(w.dtype, copy=False)]
        if bias is not None:
            grads.append(g.sum(axis=0).astype(bias.data.dtype, copy=False))
        return grads
    parents = (x, weight) if bias is None else (x, weight, bias)
    return from_op(out, parents, backward, "avg_pool_linear")
