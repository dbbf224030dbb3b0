"""Cumulative ops along one dimension (cumprod, cummax, cummin, logcumsumexp), forward and backward together;
cumsum lives in reduce.py."""
from __future__ import annotations

import numpy as np

from frost.dtype import default_float_dtype, to_dtype
from frost.ops.reduce import normalize_dim, reverse_cumsum, values_indices
from frost.ops.shape import _scatter_add_along_axis
from frost.tensor import Tensor, from_op


def _as_1d(x: Tensor, dim, name: str):
    """x's array and the axis to scan; a 0-d tensor scans as one element (PyTorch accepts dim 0 or -1 there)."""
    axis = normalize_dim(dim, x.ndim, name)
    return (x.data.reshape(1), 0) if x.ndim == 0 else (x.data, axis)


def _inclusive_scan(xp, a, axis: int, op, fill):
    """op accumulated along axis (op associative: maximum, minimum, logaddexp): NumPy's one pass, or on the GPU
    log2(n) whole-array steps (Hillis-Steele), since CuPy's ufuncs may lack .accumulate; `fill` is op's identity."""
    if xp is np:
        return op.accumulate(a, axis=axis)
    n = a.shape[axis]
    out, shift = a, 1
    while shift < n:
        pad_shape = list(a.shape)
        pad_shape[axis] = shift
        earlier = xp.concatenate([xp.full(pad_shape, fill, dtype=a.dtype),
                                  xp.take(out, xp.arange(n - shift), axis=axis)], axis=axis)
        out = op(out, earlier)
        shift *= 2
    return out.copy() if out is a else out


def _lowest(dtype, largest: bool):
    """The identity of a running max (largest) or min of `dtype`: -inf / +inf, or the integer bounds."""
    if dtype.kind == "f":
        return -np.inf if largest else np.inf
    if dtype.kind == "b":
        return not largest
    info = np.iinfo(dtype)
    return info.min if largest else info.max


def cumprod(x: Tensor, dim: int, dtype=None) -> Tensor:
    """The running product along `dim`; integers and bools multiply in int64, as PyTorch."""
    xp = x.xp
    a, axis = _as_1d(x, dim, "cumprod")
    if dtype is not None:
        a = a.astype(to_dtype(dtype).np)
    elif a.dtype.kind in "biu":
        a = a.astype(np.int64)
    out = xp.cumprod(a, axis=axis)

    def backward(g):
        g = g.reshape(a.shape)
        return (_cumprod_grad(xp, a, out, g, axis).reshape(x.shape).astype(x.data.dtype, copy=False),)
    return from_op(out.reshape(x.shape), (x,), backward, "cumprod")


def _cumprod_grad(xp, a, out, g, axis: int):
    """d/dx_k of sum_j g_j * prod_{i<=j} x_i, exact when x has zeros (dividing out by x would give 0 / 0 there):
    before a slice's first zero it is revcumsum(g * out) / x_k; at the first zero, the products that skip it; after
    it, 0."""
    is_zero = a == 0
    zeros_so_far = xp.cumsum(is_zero, axis=axis)
    before_zero = zeros_so_far == 0
    first_zero = is_zero & (zeros_so_far == 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        grad = xp.where(before_zero, reverse_cumsum(xp, g * out, axis) / xp.where(before_zero, a, 1), 0)
    skipping_zero = xp.cumprod(xp.where(first_zero, 1, a), axis=axis)
    return grad + xp.where(first_zero, reverse_cumsum(xp, g * skipping_zero, axis), 0)


def _running_extreme(x: Tensor, dim: int, name: str, largest: bool):
    xp = x.xp
    a, axis = _as_1d(x, dim, name)
    out = _inclusive_scan(xp, a, axis, xp.maximum if largest else xp.minimum, _lowest(a.dtype, largest))
    # the index moves to each element that reaches the running extreme (ties: the latest), or is NaN, as PyTorch
    reaches = (a == out) | (xp.isnan(a) if a.dtype.kind == "f" else False)
    positions = xp.arange(a.shape[axis]).reshape([-1 if i == axis else 1 for i in range(a.ndim)])
    idx = _inclusive_scan(xp, xp.where(reaches, positions, 0).astype(np.int64), axis, xp.maximum, 0)

    def backward(g):
        gx = xp.zeros(a.shape, dtype=g.dtype)
        _scatter_add_along_axis(xp, gx, idx, g.reshape(a.shape), axis)
        return (gx.reshape(x.shape),)
    values = from_op(out.reshape(x.shape), (x,), backward, name)
    return values_indices(values, Tensor(idx.reshape(x.shape)))


def cummax(x: Tensor, dim: int):
    """(values, indices) of the running maximum along `dim`."""
    return _running_extreme(x, dim, "cummax", True)


def cummin(x: Tensor, dim: int):
    """(values, indices) of the running minimum along `dim`."""
    return _running_extreme(x, dim, "cummin", False)


def _logcumsumexp_array(xp, a, axis: int):
    with np.errstate(invalid="ignore"):  # -inf - -inf inside logaddexp: the result is still -inf
        return _inclusive_scan(xp, a, axis, xp.logaddexp, -np.inf)


def logcumsumexp(x: Tensor, dim: int) -> Tensor:
    """log(cumsum(exp(x))) along `dim`, without overflow; integers in the default float dtype, as PyTorch."""
    xp = x.xp
    a, axis = _as_1d(x, dim, "logcumsumexp")
    if not x.dtype.is_floating_point:
        a = a.astype(default_float_dtype().np)
    out = _logcumsumexp_array(xp, a, axis)

    def backward(g):
        # grad_k = sum_{j>=k} g_j exp(x_k - out_j), summed in log space for g > 0 and g < 0 apart so that no
        # exp(-out_j) overflows
        g = g.reshape(a.shape)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            parts = []
            for signed in (g, -g):
                terms = xp.where(signed > 0, xp.log(xp.where(signed > 0, signed, 1)) - out, -np.inf)
                summed = xp.flip(_logcumsumexp_array(xp, xp.flip(terms, axis), axis), axis)
                parts.append(xp.exp(a + summed))
            grad = parts[0] - parts[1]
        return (grad.reshape(x.shape).astype(x.data.dtype, copy=False),)
    return from_op(out.reshape(x.shape), (x,), backward, "logcumsumexp")
