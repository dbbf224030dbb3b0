"""Matrix multiplication (batched, broadcasting) and the linear layer's op, forward and backward together."""
from __future__ import annotations

import math

import numpy as np

from frost import dispatch
from frost.ops.autocast_inputs import cast_inputs, cast_source, gradient_out
from frost.autograd import grad_destination, gradient_branch, unbroadcast
from frost.ops.elementwise import sum_to
from frost.tensor import Tensor, from_op


def _check(a: Tensor, b: Tensor, name: str, b_shape: tuple | None = None) -> None:
    """Devices, dtypes and shapes of a @ b; `b_shape` stands in for b's shape (linear passes weight.T's)."""
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise TypeError(f"{name}: both operands must be tensors, got {type(a).__name__} and {type(b).__name__}")
    if a.device != b.device:
        raise RuntimeError(f"{name}: operands are on different devices: {a.shape} on {a.device} "
                           f"and {b.shape} on {b.device}")
    if a.dtype != b.dtype:
        raise RuntimeError(f"{name}: operands have different dtypes: {a.shape} {a.dtype!r} and {b.shape} {b.dtype!r}")
    if a.ndim == 0 or b.ndim == 0:
        raise RuntimeError(f"{name}: both operands need at least one dimension, got shapes {a.shape} and {b.shape}")
    sa, sb = a.shape, (b.shape if b_shape is None else b_shape)
    ka = sa[-1]
    kb = sb[0] if len(sb) == 1 else sb[-2]
    if ka != kb:
        raise RuntimeError(f"{name}: shapes {sa} and {sb} cannot be multiplied ({ka} != {kb})")
    try:
        np.broadcast_shapes(sa[:-2], sb[:-2])
    except ValueError:
        raise RuntimeError(f"{name}: batch dimensions of shapes {sa} and {sb} cannot be broadcast together") from None


def _same_dtype(array, dtype):
    # NumPy's bfloat16 matmul (ml_dtypes) answers in float32: cast back, as a bfloat16 GEMM would
    return array if array.dtype == dtype else array.astype(dtype)


def fold_batch_dims(xp, a, b):
    """(a3, b3, batch): a (..., m, k) and b (..., k, n) as 3-D stacks of matrices over their broadcast batch dims
    `batch` (copies only where a batch dim broadcasts or the array is not contiguous)."""
    batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    a3 = xp.broadcast_to(a, batch + a.shape[-2:]).reshape((-1,) + a.shape[-2:])
    b3 = xp.broadcast_to(b, batch + b.shape[-2:]).reshape((-1,) + b.shape[-2:])
    return a3, b3, batch


def matmul_arrays(xp, a, b, out=None):
    """a @ b on raw arrays: a fast path where the acceleration layer registers one ("matmul_arrays": cuDNN for CUDA
    matrices, capturable), else xp.matmul, in float32 BLAS for half types.

    Array code that may run inside a captured step (optimizers) multiplies through this, not xp.matmul:
    CuPy refuses cuBLAS calls during stream capture. `out` (C-contiguous, the result's shape, a's dtype or float32
    for 16-bit operands) receives the product and is returned when given."""
    fast = dispatch.lookup("matmul_arrays", a, b)
    if fast is not None:
        return fast(xp, a, b, out)
    if a.dtype.itemsize == 2 and a.dtype.kind not in "iu":
        # NumPy's half types multiply in Python loops and CuPy has no bfloat16 product: float32 BLAS, rounded by
        # the caller
        product = xp.matmul(a.astype(np.float32), b.astype(np.float32))
        if out is None:
            return product
        out[...] = product
        return out
    return xp.matmul(a, b, out=out)


def add_bias(product, bias) -> None:
    """product (rows, n) += bias (n,) over every row, in place."""
    fast = dispatch.lookup("add_bias", product, bias)
    if fast is not None:
        return fast(product, bias)
    product += bias


def matmul_bias(xp, a, b, bias):
    """a (m, k) @ b (k, n) + bias (n,) over every row (None: no bias): a fast path where one registers ("matmul_bias":
    the bias added in the product's epilogue), else matmul_arrays, then add_bias."""
    fast = dispatch.lookup("matmul_bias", a, b, bias=bias) if bias is not None else None
    if fast is not None:
        return fast(xp, a, b, bias)
    product = matmul_arrays(xp, a, b)
    if bias is not None:
        add_bias(product, bias)
    return product


def sum_rows(a, dtype, out=None, partials=None):
    """a (rows, n).sum(axis=0) in dtype, written into `out` when given: a bias's gradient. `partials`: float32 sums
    of groups of its rows, made by the fast path that wrote `a` (keep_column_sums), which a fast path may finish."""
    fast = dispatch.lookup("sum_rows", a, dtype=dtype, out=out)
    return fast(a, dtype, out, partials) if fast is not None else a.sum(axis=0, dtype=dtype, out=out)


def keep_column_sums(bias: Tensor, g, partials) -> None:
    """Leave on a linear layer's `bias` partial column sums of its output's gradient g, which a backward after the
    layer (GELU's, LayerNorm's) made while writing g; the layer's backward then sums no rows of its own."""
    bias.__dict__["_column_sums"] = (g, partials)


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """a @ b with NumPy's rules: 1-D operands are promoted and squeezed, batch dims broadcast."""
    a = Tensor(a) if isinstance(a, np.ndarray) else a
    b = Tensor(b) if isinstance(b, np.ndarray) else b
    a, b = cast_inputs(a, b)
    _check(a, b, "matmul")
    xp = a.xp
    xa, xb = a.data, b.data
    out = _same_dtype(matmul_arrays(xp, xa, xb), xa.dtype)

    def backward(g):
        if xa.ndim == 2 and xb.ndim == 2:
            # plain matrices: a leaf's gradient may go straight into its zeroed .grad buffer
            ga = matmul_arrays(xp, g, xb.T, out=grad_destination(a))
            gb = matmul_arrays(xp, xa.T, g, out=grad_destination(b))
            return _same_dtype(ga, xa.dtype), _same_dtype(gb, xb.dtype)
        # promote 1-D operands to matrices so that one formula serves every case
        A = xa[None, :] if xa.ndim == 1 else xa
        B = xb[:, None] if xb.ndim == 1 else xb
        if xa.ndim == 1 and xb.ndim == 1:
            G = g.reshape(1, 1)
        elif xa.ndim == 1:
            G = xp.expand_dims(g, -2)
        elif xb.ndim == 1:
            G = xp.expand_dims(g, -1)
        else:
            G = g
        ga = matmul_arrays(xp, G, xp.swapaxes(B, -1, -2))
        gb = matmul_arrays(xp, xp.swapaxes(A, -1, -2), G)
        ga = _same_dtype(unbroadcast(ga, A.shape).reshape(xa.shape), xa.dtype)
        gb = _same_dtype(unbroadcast(gb, B.shape).reshape(xb.shape), xb.dtype)
        return ga, gb
    return from_op(out, (a, b), backward, "matmul", lambda g, o: _matmul_derivative(g, a, b))


def _matmul_derivative(g: Tensor, a: Tensor, b: Tensor) -> tuple:
    """matmul's backward on Tensors (matmuls, on the tape): 1-D operands promoted to matrices, batch dims summed."""
    A = a.reshape((1,) + a.shape) if a.ndim == 1 else a
    B = b.reshape(b.shape + (1,)) if b.ndim == 1 else b
    G = g.reshape(np.broadcast_shapes(A.shape[:-2], B.shape[:-2]) + (A.shape[-2], B.shape[-1]))
    ga = sum_to(G @ B.mT, A.shape).reshape(a.shape) if a.requires_grad else None
    gb = sum_to(A.mT @ G, B.shape).reshape(b.shape) if b.requires_grad else None
    return ga, gb


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x @ weight.T + bias in one op (one BLAS call each way, no transposed copy)."""
    if not isinstance(weight, Tensor) or weight.ndim != 2:
        raise RuntimeError(f"linear: weight must be a 2-D tensor (out_features, in_features), "
                           f"got {getattr(weight, 'shape', type(weight).__name__)}")
    if not isinstance(x, Tensor) or x.ndim == 0 or x.shape[-1] != weight.shape[1]:
        raise RuntimeError(f"linear: input of shape {getattr(x, 'shape', None)} does not fit weight of shape "
                           f"{weight.shape} (expects {weight.shape[1]} input features)")
    x, weight, bias = cast_inputs(x, weight, bias)
    _check(x, weight, "linear", b_shape=weight.shape[::-1])
    xp = x.xp
    xa, w = x.data, weight.data
    # one 2-D product, whatever the leading dims; their product spelled out, since -1 cannot be inferred when
    # in_features is 0 (PyTorch then answers the bias, broadcast)
    rows = math.prod(xa.shape[:-1])
    x2 = xa.reshape(rows, xa.shape[-1])
    if bias is not None and bias.shape != (w.shape[0],):
        raise RuntimeError(f"linear: bias of shape {bias.shape} does not fit weight of shape {weight.shape}")
    product = _same_dtype(matmul_bias(xp, x2, w.T, None if bias is None else bias.data), xa.dtype)
    out = product.reshape(xa.shape[:-1] + (w.shape[0],))
    parents = (x, weight) if bias is None else (x, weight, bias)

    def backward(g):
        g2 = g.reshape(rows, g.shape[-1])  # not -1: out_features may be 0
        # the weight's (and bias's) gradient straight into its zeroed .grad buffer when there is one, under autocast
        # the float32 master's (read only after backward()'s completions: a captured step computes it on a side
        # branch, beside the input gradient)
        gw_out, claimed = gradient_out(weight, xp)
        with gradient_branch(g2, x2, when=claimed is not None):
            gw = matmul_arrays(xp, g2.T, x2, out=gw_out)
        gx_out = gradient_out(x, xp)[0]  # under autocast, an activation's float32 gradient as the product gives it
        gx = matmul_arrays(xp, g2, w, out=None if gx_out is None else gx_out.reshape(rows, w.shape[1]))
        gx = (gx if gx_out is not None else _same_dtype(gx, xa.dtype)).reshape(xa.shape)
        grads = [gx, gw if gw_out is not None else _same_dtype(gw, w.dtype)]
        if bias is not None:
            sum_dtype = np.float32 if g2.dtype.itemsize == 2 else g2.dtype   # half precision sums in float32
            # into .grad (or, under autocast, the float32 master's) only where the sum's dtype is the gradient's
            writable = bias.data.dtype == sum_dtype or cast_source(bias) is not None
            gb_out = gradient_out(bias, xp)[0] if writable else None
            gb_out = gb_out if gb_out is not None and gb_out.dtype == sum_dtype else None
            kept = bias.__dict__.pop("_column_sums", None)
            gb = sum_rows(g2, sum_dtype, out=gb_out, partials=kept[1] if kept is not None and kept[0] is g else None)
            grads.append(gb if gb_out is not None else _same_dtype(gb, bias.data.dtype))
        return grads
    return from_op(out, parents, backward, "linear", lambda g, o: _linear_derivative(g, x, weight, bias, rows))


def _linear_derivative(g: Tensor, x: Tensor, weight: Tensor, bias: Tensor | None, rows: int) -> tuple:
    """linear's backward on Tensors: g @ W, g^T x and g summed over the rows (matmuls and a sum, on the tape)."""
    g2 = g.reshape((rows, weight.shape[0]))
    gx = (g2 @ weight).reshape(x.shape) if x.requires_grad else None
    gw = g2.mT @ x.reshape((rows, weight.shape[1])) if weight.requires_grad else None
    return (gx, gw) if bias is None else (gx, gw, g2.sum(0) if bias.requires_grad else None)
