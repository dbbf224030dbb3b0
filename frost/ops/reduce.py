"""Reductions (sum, mean, max, var, logsumexp, ...) and softmax, forward and backward together."""
from __future__ import annotations

import builtins
import functools
import inspect
from collections import namedtuple

import numpy as np

from frost.dtype import accumulator, default_float_dtype, to_dtype, widened
from frost.ops.autocast_inputs import float32_inputs
from frost.ops.elementwise import abs as abs_, maximum, minimum
from frost.tensor import Tensor, from_op

values_indices = namedtuple("values_indices", ["values", "indices"])


def normalize_dims(dim, ndim: int, name: str) -> tuple:
    """Turn None, an int or a sequence of ints (negative allowed) into a sorted tuple of axes."""
    dims = None if dim is None else (dim,) if isinstance(dim, int) else tuple(dim)
    if not dims:  # None, or an empty sequence: every dimension, as PyTorch's dim=()
        return tuple(range(ndim))
    out = []
    for d in dims:
        if not -builtins.max(ndim, 1) <= d < builtins.max(ndim, 1):
            raise IndexError(f"{name}: dim {d} is out of range for a tensor with {ndim} dimensions")
        out.append(d % builtins.max(ndim, 1) if ndim else 0)
    if len(set(out)) != len(out):
        raise RuntimeError(f"{name}: dim {dim} names the same dimension more than once")
    return tuple(sorted(out))


def normalize_dim(dim, ndim: int, name: str) -> int:
    """One axis (negative allowed) as a non-negative int; ops like softmax take exactly one."""
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
        raise TypeError(f"{name}: dim must be a single int, got {dim!r}")
    return normalize_dims(int(dim), ndim, name)[0]


def _expand_back(g, axes: tuple, keepdim: bool, shape: tuple, xp):
    """Broadcast a reduced gradient back to the input's shape."""
    if not keepdim and shape:
        g = xp.expand_dims(g, axes) if axes else g
    return xp.broadcast_to(g, shape)


def _expand_back_tensor(g: Tensor, axes: tuple, keepdim: bool, shape: tuple) -> Tensor:
    """_expand_back on Tensors (Frost's ops, on the tape): a reduced gradient broadcast back to the input's shape."""
    if not keepdim:
        g = g.reshape(tuple(1 if i in axes else n for i, n in enumerate(shape)))
    return g.expand(shape)


def numpy_names(fn):
    """fn also taking NumPy's names axis= (for dim=) and keepdims= (for keepdim=), as PyTorch's reductions do."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, axis=None, keepdims=None, **kwargs):
        if axis is None and keepdims is None:  # the common call: no binding cost
            return fn(*args, **kwargs)
        bound = signature.bind_partial(*args, **kwargs)
        if axis is not None:
            if bound.arguments.get("dim") is not None:
                raise TypeError(f"{fn.__name__}: got both dim and axis; give one")
            bound.arguments["dim"] = axis
        if keepdims is not None:
            bound.arguments["keepdim"] = keepdims
        return fn(*bound.args, **bound.kwargs)
    return wrapper


@numpy_names
def sum(x: Tensor, dim=None, keepdim: bool = False, dtype=None) -> Tensor:
    xp = x.xp
    axes = normalize_dims(dim, x.ndim, "sum")
    a = x.data
    if dtype is not None:
        out_dtype = to_dtype(dtype).np
    elif a.dtype.kind in "biu":
        out_dtype = np.dtype(np.int64)  # integer sums are int64, as in PyTorch
    else:
        out_dtype = a.dtype
    acc = accumulator(out_dtype) or out_dtype
    out = a.sum(axis=axes, keepdims=keepdim, dtype=acc) if x.ndim else a.astype(acc)
    out = xp.asarray(out).astype(out_dtype, copy=False)
    shape, in_dtype = x.shape, x.data.dtype
    return from_op(out, (x,),
                   lambda g: (_expand_back(g, axes, keepdim, shape, xp).astype(in_dtype, copy=False),), "sum",
                   lambda g, o: (_expand_back_tensor(g, axes, keepdim, shape).to(x.dtype),))


@numpy_names
def mean(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    if not x.dtype.is_floating_point:
        raise TypeError(f"mean: needs a floating-point tensor, got {x.dtype!r}; cast it with .float()")
    xp = x.xp
    axes = normalize_dims(dim, x.ndim, "mean")
    count = int(np.prod([x.shape[a] for a in axes])) if x.ndim else 1
    acc = accumulator(x.data.dtype)
    out = x.data.mean(axis=axes, keepdims=keepdim, dtype=acc) if x.ndim else x.data.copy()
    shape, in_dtype = x.shape, x.data.dtype
    return from_op(xp.asarray(out).astype(in_dtype, copy=False), (x,),
                   lambda g: ((_expand_back(g, axes, keepdim, shape, xp) / count).astype(in_dtype, copy=False),),
                   "mean", lambda g, o: (_expand_back_tensor(g, axes, keepdim, shape) / count,))


def _extreme(x: Tensor, dim, keepdim: bool, name: str, largest: bool):
    xp = x.xp
    if isinstance(dim, Tensor):  # max(a, b): the elementwise maximum, as torch.max(input, other)
        return (maximum if largest else minimum)(x, dim)
    if x.numel() == 0 and (dim is None or x.shape[normalize_dim(dim, x.ndim, name)] == 0):
        raise RuntimeError(f"{name}: cannot reduce an empty tensor of shape {x.shape} over a dimension of size 0")
    if dim is None:
        out = x.data.max() if largest else x.data.min()
        out = xp.asarray(out)

        def backward(g):
            # ties share the gradient evenly, as PyTorch's full reduction does; a NaN result is the NaNs'
            mask = x.data == out
            if x.data.dtype.kind == "f":
                mask |= xp.isnan(x.data) & xp.isnan(out)
            return ((g * mask / g.dtype.type(mask.sum())).astype(x.data.dtype, copy=False),)
        return from_op(out, (x,), backward, name)
    if x.ndim == 0:
        normalize_dims(dim, 0, name)
        return values_indices(from_op(x.data.copy(), (x,), lambda g: (g,), name), Tensor(xp.zeros((), np.int64)))
    axis = normalize_dim(dim, x.ndim, name)
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


@numpy_names
def max(x: Tensor, dim=None, keepdim: bool = False):
    """max over all elements (a tensor), or over `dim` (a (values, indices) pair), as PyTorch."""
    return _extreme(x, dim, keepdim, "max", True)


@numpy_names
def min(x: Tensor, dim=None, keepdim: bool = False):
    return _extreme(x, dim, keepdim, "min", False)


def _amaxmin(x: Tensor, dim, keepdim: bool, name: str, largest: bool) -> Tensor:
    xp = x.xp
    axes = normalize_dims(dim, x.ndim, name)
    out = (x.data.max if largest else x.data.min)(axis=axes, keepdims=True)

    def backward(g):
        mask = x.data == out
        gk = g if keepdim else xp.expand_dims(g, axes)
        count = mask.sum(axis=axes, keepdims=True).astype(g.dtype)
        return ((gk * mask / count).astype(x.data.dtype, copy=False),)
    return from_op(out if keepdim else xp.squeeze(out, axes), (x,), backward, name)


@numpy_names
def amax(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    return _amaxmin(x, dim, keepdim, "amax", True)


@numpy_names
def amin(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    return _amaxmin(x, dim, keepdim, "amin", False)


@numpy_names
def argmax(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    return _arg_extreme(x, dim, keepdim, "argmax")


@numpy_names
def argmin(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    return _arg_extreme(x, dim, keepdim, "argmin")


def _arg_extreme(x: Tensor, dim, keepdim: bool, name: str) -> Tensor:
    """argmax or argmin (`name`, the array method's) as int64, over all values (dim None) or along dim."""
    if dim is None:
        out = x.xp.asarray(getattr(x.data, name)()).astype(np.int64)
        return Tensor(out.reshape((1,) * x.ndim) if keepdim else out)
    axis = normalize_dim(dim, x.ndim, name)
    out = getattr(x.data, name)(axis=axis)
    return Tensor((x.xp.expand_dims(out, axis) if keepdim else out).astype(np.int64))


@numpy_names
def var(x: Tensor, dim=None, keepdim: bool = False, unbiased: bool = True, correction=None) -> Tensor:
    if not x.dtype.is_floating_point:
        raise TypeError(f"var/std: needs a floating-point tensor, got {x.dtype!r}; cast it with .float()")
    xp = x.xp
    axes = normalize_dims(dim, x.ndim, "var")
    n = int(np.prod([x.shape[a] for a in axes]))
    corr = (1 if unbiased else 0) if correction is None else correction
    a = widened(x.data)
    mu = a.mean(axis=axes, keepdims=True)
    centered = a - mu
    denom = builtins.max(n - corr, 0)
    # n <= correction: PyTorch gives inf or nan (0 / 0), never an exception
    scale = 1.0 / denom if denom else float("inf")
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (centered * centered).sum(axis=axes, keepdims=keepdim) * scale if denom else \
            (centered * centered).sum(axis=axes, keepdims=keepdim) / a.dtype.type(0)

    def backward(g):
        gk = g if keepdim else xp.expand_dims(g, axes)
        with np.errstate(invalid="ignore"):
            return ((2.0 * scale) * gk * centered).astype(x.data.dtype, copy=False),
    return from_op(out.astype(x.data.dtype, copy=False), (x,), backward, "var")


@numpy_names
def std(x: Tensor, dim=None, keepdim: bool = False, unbiased: bool = True, correction=None) -> Tensor:
    v = var(x, dim, keepdim, unbiased, correction)
    xp = x.xp
    out = xp.sqrt(v.data)

    def backward(g):  # 0 where the std is 0 (a constant slice), as PyTorch, not 0 / 0
        with np.errstate(divide="ignore", invalid="ignore"):
            return (xp.where(out == 0, 0, g / (2 * out)).astype(out.dtype, copy=False),)
    return from_op(out, (v,), backward, "std")


@numpy_names
def logsumexp(x: Tensor, dim, keepdim: bool = False) -> Tensor:
    xp = x.xp
    axes = normalize_dims(dim, x.ndim, "logsumexp")
    # integers in the default float dtype, as PyTorch (in their own dtype, uint8 would wrap in x - max)
    a = x.data if x.dtype.is_floating_point else x.data.astype(default_float_dtype().np)
    # an empty slice's max is -inf, not an error (its logsumexp is -inf, as PyTorch's); CuPy's max has no initial=
    m = a.max(axis=axes, keepdims=True) if a.size else xp.full(
        [1 if i in axes else n for i, n in enumerate(a.shape)], -np.inf, dtype=a.dtype)
    m = xp.where(xp.isfinite(m), m, 0)
    e = xp.exp(a - m)
    s = e.sum(axis=axes, keepdims=True)
    with np.errstate(divide="ignore"):  # log(0) = -inf for rows of -inf, as in PyTorch
        out = xp.log(s) + m

    def backward(g):
        gk = g if keepdim else xp.expand_dims(g, axes)
        return ((gk * e / s).astype(x.data.dtype),)
    return from_op(out if keepdim else xp.squeeze(out, axes), (x,), backward, "logsumexp")


@numpy_names
def prod(x: Tensor, dim=None, keepdim: bool = False, dtype=None) -> Tensor:
    """The product over all elements or over one `dim`; its gradient is exact where x has zeros, as PyTorch's."""
    if dim is not None and not isinstance(dim, (int, np.integer)):
        raise TypeError(f"prod: dim must be a single int or None, got {dim!r}")
    xp = x.xp
    axes = normalize_dims(dim, x.ndim, "prod")
    a = x.data
    if dtype is not None:
        a = a.astype(to_dtype(dtype).np)
    elif a.dtype.kind in "biu":
        a = a.astype(np.int64)  # integer products are int64, as in PyTorch
    out = xp.asarray(a.prod(axis=axes, keepdims=True) if x.ndim else a.copy())

    def backward(g):
        gk = g if keepdim or not x.ndim else xp.expand_dims(g, axes)
        return ((gk * _prod_others(xp, a, out, axes)).astype(x.data.dtype, copy=False),)
    return from_op(out if keepdim or not x.ndim else xp.squeeze(out, axes), (x,), backward, "prod")


def _prod_others(xp, a, out, axes: tuple):
    """The product of the other elements of each one's slice: out / x without zeros; with one zero, the product of
    the rest at the zero and 0 elsewhere; with two or more, 0 everywhere."""
    if not a.ndim:
        return xp.ones_like(a)
    is_zero = a == 0
    zeros = is_zero.sum(axis=axes, keepdims=True)
    rest = xp.where(is_zero, 1, a).prod(axis=axes, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        no_zero = out / xp.where(is_zero, 1, a)
    return xp.where(zeros == 0, no_zero, xp.where((zeros == 1) & is_zero, rest, 0))


@numpy_names
def var_mean(x: Tensor, dim=None, keepdim: bool = False, unbiased: bool = True, correction=None) -> tuple:
    """(var, mean) over `dim`, as torch.var_mean."""
    return var(x, dim, keepdim, unbiased, correction), mean(x, dim, keepdim)


@numpy_names
def std_mean(x: Tensor, dim=None, keepdim: bool = False, unbiased: bool = True, correction=None) -> tuple:
    """(std, mean) over `dim`, as torch.std_mean."""
    return std(x, dim, keepdim, unbiased, correction), mean(x, dim, keepdim)


def _check_floating(x: Tensor, name: str) -> None:
    if not x.dtype.is_floating_point:  # NumPy would answer float64 (PyTorch refuses)
        raise TypeError(f"{name}: needs a floating-point tensor, got {x.dtype!r} of shape {x.shape}; cast it with "
                        f".float()")


def softmax(x: Tensor, dim: int) -> Tensor:
    (x,) = float32_inputs(x)  # under autocast in float32, as PyTorch's
    _check_floating(x, "softmax")
    xp = x.xp
    axis = normalize_dim(dim, x.ndim, "softmax")
    if x.numel() == 0:  # nothing to normalize (an empty dim has no max): an empty result, as PyTorch
        return from_op(x.data.copy(), (x,), lambda g: (g,), "softmax", lambda g, o: (g,))
    e = xp.exp(x.data - x.data.max(axis=axis, keepdims=True))
    out = e / e.sum(axis=axis, keepdims=True)

    def backward(g):
        return (out * (g - (g * out).sum(axis=axis, keepdims=True)),)
    return from_op(out, (x,), backward, "softmax", lambda g, o: (o * (g - (g * o).sum(axis, keepdim=True)),))


def log_softmax(x: Tensor, dim: int) -> Tensor:
    (x,) = float32_inputs(x)  # under autocast in float32, as PyTorch's
    _check_floating(x, "log_softmax")
    xp = x.xp
    axis = normalize_dim(dim, x.ndim, "log_softmax")
    if x.numel() == 0:
        return from_op(x.data.copy(), (x,), lambda g: (g,), "log_softmax", lambda g, o: (g,))
    shifted = x.data - x.data.max(axis=axis, keepdims=True)
    out = shifted - xp.log(xp.exp(shifted).sum(axis=axis, keepdims=True))

    def backward(g):
        return (g - xp.exp(out) * g.sum(axis=axis, keepdims=True),)
    return from_op(out, (x,), backward, "log_softmax", lambda g, o: (g - o.exp() * g.sum(axis, keepdim=True),))


@numpy_names
def norm(x: Tensor, p=2, dim=None, keepdim: bool = False) -> Tensor:
    """The vector p-norm over `dim` (all elements when None); its gradient at 0 is 0, as in PyTorch."""
    if not x.dtype.is_floating_point:  # every p, as torch (p = 1 and inf used to answer integers)
        raise TypeError(f"norm: needs a floating-point tensor, got {x.dtype!r}")
    if p == "fro":
        p = 2
    if p == 1:
        return sum(abs_(x), dim, keepdim)
    if p == float("inf"):
        return amax(abs_(x), dim, keepdim)
    if p == float("-inf"):
        return amin(abs_(x), dim, keepdim)
    xp = x.xp
    axes = normalize_dims(dim, x.ndim, "norm")
    if p == 0:  # the count of non-zeros, as torch.linalg.vector_norm's ord=0; its gradient is 0
        count = (x.data != 0).sum(axis=axes, keepdims=keepdim).astype(x.data.dtype)
        return from_op(count, (x,), lambda g: (xp.zeros(x.shape, dtype=x.data.dtype),), "norm")
    a, dtype = widened(x.data), x.data.dtype  # float16 and bfloat16 in float32: their squares overflow (100^2 ...)
    absa = xp.abs(a)
    powered = a * a if p == 2 else absa ** p
    out_k = powered.sum(axis=axes, keepdims=True) ** (1.0 / p)

    def backward(g):
        gk = (g if keepdim else xp.expand_dims(g, axes)).astype(a.dtype, copy=False)
        with np.errstate(divide="ignore", invalid="ignore"):
            if p == 2:
                scale = xp.where(out_k == 0, 0, gk / out_k)
                return ((scale * a).astype(dtype, copy=False),)
            ratio = xp.where(out_k == 0, 0, absa / out_k)
            # at a zero element the gradient is 0 (ratio ** (p - 1) is inf there for p < 1), as torch's
            grad = xp.where(absa == 0, 0, gk * xp.sign(a) * ratio ** (p - 1))
            return (grad.astype(dtype, copy=False),)
    out = out_k if keepdim else xp.squeeze(out_k, axes) if x.ndim else out_k
    return from_op(out.astype(dtype, copy=False), (x,), backward, "norm")


@numpy_names
def all(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    axes = normalize_dims(dim, x.ndim, "all")
    return Tensor(_logical_result(x, x.data.all(axis=axes, keepdims=keepdim)))


@numpy_names
def any(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    axes = normalize_dims(dim, x.ndim, "any")
    return Tensor(_logical_result(x, x.data.any(axis=axes, keepdims=keepdim)))


def _logical_result(x: Tensor, out):
    """all/any's answer: bool, or uint8 for a uint8 input (PyTorch keeps uint8 there)."""
    out = x.xp.asarray(out)
    return out.astype(np.uint8) if x.data.dtype == np.uint8 else out



def reverse_cumsum(xp, a, axis: int):
    """Sums from each position to the end along axis: a running sum's gradient (each input adds into every later
    output)."""
    return xp.flip(xp.cumsum(xp.flip(a, axis), axis=axis), axis)


def cumsum(x: Tensor, dim: int) -> Tensor:
    xp = x.xp
    axis = normalize_dim(dim, x.ndim, "cumsum")
    a = x.data.astype(np.int64) if x.data.dtype.kind in "biu" else x.data
    out = xp.cumsum(a, axis=axis) if x.ndim else a.copy()

    def backward(g):
        return (reverse_cumsum(xp, g, axis) if x.ndim else g,)
    return from_op(out, (x,), backward, "cumsum")


def sort(x: Tensor, dim: int = -1, descending: bool = False):
    """(values, indices) sorted along `dim`; stable, so ties keep their order."""
    xp = x.xp
    axis = normalize_dim(dim, x.ndim, "sort")
    if x.ndim == 0:
        return values_indices(from_op(x.data.copy(), (x,), lambda g: (g,), "sort"), Tensor(xp.zeros((), np.int64)))
    if descending:  # a stable ascending sort of the reversed values, reversed: ties keep their order, NaN first
        n = x.shape[axis]
        idx = (n - 1) - xp.flip(xp.argsort(xp.flip(x.data, axis), axis=axis, kind="stable"), axis)
    else:
        idx = xp.argsort(x.data, axis=axis, kind="stable")
    return values_indices(_take(x, idx, axis, "sort"), Tensor(idx.astype(np.int64)))


def argsort(x: Tensor, dim: int = -1, descending: bool = False) -> Tensor:
    return sort(x, dim, descending).indices


def topk(x: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
    """The k largest (or smallest) values along `dim` and their indices, largest first."""
    axis = normalize_dim(dim, x.ndim, "topk")
    n = x.shape[axis] if x.ndim else 1
    if not 0 <= k <= n:
        raise RuntimeError(f"topk: k={k} is out of range for dim {dim} of size {n} (shape {x.shape})")
    _, idx = sort(x, dim, descending=largest)
    idx = idx.data[(slice(None),) * axis + (slice(0, k),)] if x.ndim else idx.data
    return values_indices(_take(x, idx, axis, "topk"), Tensor(idx))


def _take(x: Tensor, idx, axis: int, name: str) -> Tensor:
    """x's values at `idx` along `axis` (idx shaped like x except along axis), with a scatter-add backward."""
    xp = x.xp
    out = xp.take_along_axis(x.data, idx, axis=axis)

    def backward(g):
        gx = xp.zeros(x.shape, dtype=g.dtype)
        xp.put_along_axis(gx, idx, g, axis=axis)  # indices along axis are distinct here
        return (gx,)
    return from_op(out, (x,), backward, name)
