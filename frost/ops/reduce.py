"""Reductions (sum, mean, max, var, logsumexp, ...) and softmax, forward and backward together."""
from __future__ import annotations

import builtins
from collections import namedtuple

import numpy as np

from frost.dtype import default_float, to_dtype
from frost.tensor import Tensor, from_op

values_indices = namedtuple("values_indices", ["values", "indices"])


def normalize_dims(dim, ndim: int, name: str) -> tuple:
    """Turn None, an int or a sequence of ints (negative allowed) into a sorted tuple of axes."""
    if dim is None:
        return tuple(range(ndim))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    out = []
    for d in dims:
        if not -builtins.max(ndim, 1) <= d < builtins.max(ndim, 1):
            raise IndexError(f"{name}: dim {d} is out of range for a tensor with {ndim} dimensions")
        out.append(d % builtins.max(ndim, 1) if ndim else 0)
    return tuple(sorted(set(out)))


def _expand_back(g, axes: tuple, keepdim: bool, shape: tuple, xp):
    """Broadcast a reduced gradient back to the input's shape."""
    if not keepdim and shape:
        g = xp.expand_dims(g, axes) if axes else g
    return xp.broadcast_to(g, shape)


def sum(x: Tensor, dim=None, keepdim: bool = False, dtype=None) -> Tensor:
    xp = x.xp
    axes = normalize_dims(dim, x.ndim, "sum")
    a = x.data
    if dtype is not None:
        a = a.astype(to_dtype(dtype).np)
    elif a.dtype.kind in "biu":
        a = a.astype(np.int64)
    out = a.sum(axis=axes, keepdims=keepdim) if x.ndim else a.copy()
    shape = x.shape
    return from_op(xp.asarray(out), (x,),
                   lambda g: (_expand_back(g, axes, keepdim, shape, xp).astype(x.data.dtype),), "sum")


def mean(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    if not x.dtype.is_floating_point:
        raise TypeError(f"mean: needs a floating-point tensor, got {x.dtype!r}; cast it with .float()")
    xp = x.xp
    axes = normalize_dims(dim, x.ndim, "mean")
    count = int(np.prod([x.shape[a] for a in axes])) if x.ndim else 1
    out = x.data.mean(axis=axes, keepdims=keepdim) if x.ndim else x.data.copy()
    shape = x.shape
    return from_op(xp.asarray(out, dtype=x.data.dtype), (x,),
                   lambda g: ((_expand_back(g, axes, keepdim, shape, xp) / count).astype(x.data.dtype),), "mean")


def _extreme(x: Tensor, dim, keepdim: bool, name: str, largest: bool):
    xp = x.xp
    if dim is None:
        out = x.data.max() if largest else x.data.min()
        out = xp.asarray(out)

        def backward(g):
            mask = x.data == out
            return ((g * mask / mask.sum()).astype(x.data.dtype),)
        return from_op(out, (x,), backward, name)
    (axis,) = normalize_dims(dim, x.ndim, name)
    idx = (x.data.argmax if largest else x.data.argmin)(axis=axis)
    idx_k = xp.expand_dims(idx, axis)
    values = xp.take_along_axis(x.data, idx_k, axis=axis)
    shape = x.shape

    def backward(g):
        gx = xp.zeros(shape, dtype=x.data.dtype)
        gk = g if keepdim else xp.expand_dims(g, axis)
        xp.put_along_axis(gx, idx_k, gk, axis=axis)
        return (gx,)
    v = from_op(values if keepdim else xp.squeeze(values, axis), (x,), backward, name)
    return values_indices(v, Tensor((idx_k if keepdim else idx).astype(np.int64)))


def max(x: Tensor, dim=None, keepdim: bool = False):
    """max over all elements (a tensor), or over `dim` (a (values, indices) pair), as PyTorch."""
    return _extreme(x, dim, keepdim, "max", True)


def min(x: Tensor, dim=None, keepdim: bool = False):
    return _extreme(x, dim, keepdim, "min", False)


def _amaxmin(x: Tensor, dim, keepdim: bool, name: str, largest: bool) -> Tensor:
    xp = x.xp
    axes = normalize_dims(dim, x.ndim, name)
    out = (x.data.max if largest else x.data.min)(axis=axes, keepdims=True)
    shape = x.shape

    def backward(g):
        mask = x.data == out
        gk = g if keepdim else xp.expand_dims(g, axes)
        return ((gk * mask / mask.sum(axis=axes, keepdims=True)).astype(x.data.dtype),)
    return from_op(out if keepdim else xp.squeeze(out, axes), (x,), backward, name)


def amax(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    return _amaxmin(x, dim, keepdim, "amax", True)


def amin(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    return _amaxmin(x, dim, keepdim, "amin", False)


def argmax(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    if dim is None:
        return Tensor(x.xp.asarray(x.data.argmax()).astype(np.int64))
    (axis,) = normalize_dims(dim, x.ndim, "argmax")
    out = x.data.argmax(axis=axis)
    return Tensor((x.xp.expand_dims(out, axis) if keepdim else out).astype(np.int64))


def argmin(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    if dim is None:
        return Tensor(x.xp.asarray(x.data.argmin()).astype(np.int64))
    (axis,) = normalize_dims(dim, x.ndim, "argmin")
    out = x.data.argmin(axis=axis)
    return Tensor((x.xp.expand_dims(out, axis) if keepdim else out).astype(np.int64))


def var(x: Tensor, dim=None, keepdim: bool = False, unbiased: bool = True, correction=None) -> Tensor:
    xp = x.xp
    axes = normalize_dims(dim, x.ndim, "var")
    n = int(np.prod([x.shape[a] for a in axes]))
    corr = (1 if unbiased else 0) if correction is None else correction
    mu = x.data.mean(axis=axes, keepdims=True)
    centered = x.data - mu
    denom = builtins.max(n - corr, 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (centered * centered).sum(axis=axes, keepdims=keepdim) / denom
    shape = x.shape

    def backward(g):
        gk = g if keepdim else xp.expand_dims(g, axes)
        return ((2.0 / denom) * gk * centered).astype(x.data.dtype),
    return from_op(out.astype(x.data.dtype), (x,), backward, "var")


def std(x: Tensor, dim=None, keepdim: bool = False, unbiased: bool = True, correction=None) -> Tensor:
    from frost.ops.elementwise import sqrt
    return sqrt(var(x, dim, keepdim, unbiased, correction))


def logsumexp(x: Tensor, dim, keepdim: bool = False) -> Tensor:
    xp = x.xp
    axes = normalize_dims(dim, x.ndim, "logsumexp")
    m = x.data.max(axis=axes, keepdims=True)
    m = xp.where(xp.isfinite(m), m, 0)
    e = xp.exp(x.data - m)
    s = e.sum(axis=axes, keepdims=True)
    out = xp.log(s) + m

    def backward(g):
        gk = g if keepdim else xp.expand_dims(g, axes)
        return ((gk * e / s).astype(x.data.dtype),)
    return from_op(out if keepdim else xp.squeeze(out, axes), (x,), backward, "logsumexp")


def softmax(x: Tensor, dim: int) -> Tensor:
    xp = x.xp
    (axis,) = normalize_dims(dim, x.ndim, "softmax")
    e = xp.exp(x.data - x.data.max(axis=axis, keepdims=True))
    out = e / e.sum(axis=axis, keepdims=True)

    def backward(g):
        return (out * (g - (g * out).sum(axis=axis, keepdims=True)),)
    return from_op(out, (x,), backward, "softmax")


def log_softmax(x: Tensor, dim: int) -> Tensor:
    xp = x.xp
    (axis,) = normalize_dims(dim, x.ndim, "log_softmax")
    shifted = x.data - x.data.max(axis=axis, keepdims=True)
    out = shifted - xp.log(xp.exp(shifted).sum(axis=axis, keepdims=True))

    def backward(g):
        return (g - xp.exp(out) * g.sum(axis=axis, keepdims=True),)
    return from_op(out, (x,), backward, "log_softmax")


def norm(x: Tensor, p=2, dim=None, keepdim: bool = False) -> Tensor:
    from frost.ops.elementwise import abs as abs_, pow as pow_, sqrt
    if p == 2:
        return sqrt(sum(x * x, dim, keepdim))
    if p == 1:
        return sum(abs_(x), dim, keepdim)
    if p == float("inf"):
        return amax(abs_(x), dim, keepdim)
    return pow_(sum(pow_(abs_(x), p), dim, keepdim), 1.0 / p)


def all(x: Tensor) -> Tensor:
    return Tensor(x.xp.asarray(x.data.all()))


def any(x: Tensor) -> Tensor:
    return Tensor(x.xp.asarray(x.data.any()))

