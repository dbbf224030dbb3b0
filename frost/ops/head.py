"""avg_pool_linear: a classifier head (global average pool, flatten, linear) as one op. Its GPU kernels are the
acceleration layer's (frost/accel/head.py), found through frost.dispatch."""
from __future__ import annotations

import numpy as np

from frost import dispatch
from frost.autograd import grad_destination, gradient_branch
from frost.layout import empty_like_format
from frost.ops.matmul import matmul_arrays
from frost.tensor import Tensor, from_op


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


def avg_pool_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """linear(flatten(adaptive_avg_pool2d(x, 1)), weight, bias) in one op: x (N, C, H, W) -> (N, out_features).

    The pooled features and the product are summed in float32 (float64 for float64 inputs) and the result has
    that dtype, also under autocast: a head's few logits feed a loss that wants float32. On the GPU one kernel
    (frost/accel/head.py) makes the logits and one the input gradient (in x's dtype and memory format); the weight's
    gradient, a (out_features x N) by (N x C) product, runs on a captured step's gradient branch."""
    _check(x, weight, bias)
    xp, xa, w = x.xp, x.data, weight.data
    n, c, h, wd = xa.shape
    dtype = np.result_type(np.float32, xa.dtype, w.dtype)
    fast = dispatch.lookup("avg_pool_linear", x, weight)
    input_gradient = None
    if fast is not None:  # float32 pooled features and logits (dtype is float32 wherever the kernels take a call)
        pooled, out, input_gradient = fast(x, weight)
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
        if input_gradient is not None:
            dx = input_gradient(g)
        else:
            dx = empty_like_format(xa.shape, xa)
            dx[...] = (matmul_arrays(xp, g, w.astype(dtype, copy=False)) / (h * wd))[:, :, None, None]
        grads = [dx, gw.astype(w.dtype, copy=False)]
        if bias is not None:
            grads.append(g.sum(axis=0).astype(bias.data.dtype, copy=False))
        return grads
    parents = (x, weight) if bias is None else (x, weight, bias)
    return from_op(out, parents, backward, "avg_pool_linear")
