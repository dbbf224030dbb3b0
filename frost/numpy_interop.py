"""NumPy functions called on tensors (`Tensor.__array_ufunc__`, `Tensor.__array_function__`), as PyTorch answers them.

- A NumPy function that Frost has as an op (np.exp(t), np.add(t, 1), ndarray + t, np.sum(t, axis=0), np.concatenate,
  ...) runs Frost's op, with its arguments read as NumPy's: the result is a Tensor on the tensor's device and keeps
  the graph (PyTorch's dtype promotion, as any Frost op).
- Any other function (np.median, np.arctan2, a ufunc's reduce or out=, np.exp(t, out=...)) reads the tensors as
  NumPy arrays, as PyTorch's __array__ does, which a tensor that requires grad refuses (TypeError: its graph would be
  lost) and a CUDA tensor refuses (no implicit copy to the host, as PyTorch). A ufunc's array result comes back as a
  Tensor (PyTorch's __array_wrap__), any other function's as NumPy gives it.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from frost.ops import elementwise, matmul, reduce, scan, shape as shape_ops
from frost.tensor import GRAD_MESSAGE, Tensor



class _Unmapped(Exception):
    """The call uses an argument Frost's op has no counterpart for (out=, where=, order='F', ...)."""


def _plain(**arguments: Any) -> None:
    """Refuse the mapping when an argument NumPy offers is given a value other than its neutral one (None)."""
    for name, value in arguments.items():
        if value is not None:
            raise _Unmapped(name)


def _tensor(a: Any) -> Tensor:
    return a if isinstance(a, Tensor) else Tensor(np.asarray(a))


def _operand(a: Any) -> Any:
    """An array as a tensor; a tensor or a number as it is (Frost's ops take numbers)."""
    return Tensor(a) if isinstance(a, np.ndarray) else a


# ---------------------------------------------------------------- ufuncs with a Frost op
UFUNCS: dict[np.ufunc, Callable[..., Tensor]] = {
    np.add: elementwise.add, np.subtract: elementwise.sub, np.multiply: elementwise.mul,
    np.true_divide: elementwise.div, np.power: elementwise.pow, np.floor_divide: elementwise.floor_divide,
    np.remainder: elementwise.remainder, np.maximum: elementwise.maximum, np.minimum: elementwise.minimum,
    np.equal: elementwise.eq, np.not_equal: elementwise.ne, np.less: elementwise.lt, np.less_equal: elementwise.le,
    np.greater: elementwise.gt, np.greater_equal: elementwise.ge, np.logical_and: elementwise.logical_and,
    np.logical_or: elementwise.logical_or, np.bitwise_and: elementwise.bitwise_and,
    np.bitwise_or: elementwise.bitwise_or, np.bitwise_xor: elementwise.bitwise_xor, np.matmul: matmul.matmul,
    np.negative: lambda x: elementwise.neg(_tensor(x)), np.positive: _tensor,
    np.absolute: lambda x: elementwise.abs(_tensor(x)), np.exp: lambda x: elementwise.exp(_tensor(x)),
    np.log: lambda x: elementwise.log(_tensor(x)), np.sqrt: lambda x: elementwise.sqrt(_tensor(x)),
    np.sin: lambda x: elementwise.sin(_tensor(x)), np.cos: lambda x: elementwise.cos(_tensor(x)),
    np.tanh: lambda x: elementwise.tanh(_tensor(x)), np.sign: lambda x: elementwise.sign(_tensor(x)),
    np.log1p: lambda x: elementwise.log1p(_tensor(x)), np.expm1: lambda x: elementwise.expm1(_tensor(x)),
    np.reciprocal: lambda x: elementwise.reciprocal(_tensor(x)), np.floor: lambda x: elementwise.floor(_tensor(x)),
    np.ceil: lambda x: elementwise.ceil(_tensor(x)), np.rint: lambda x: elementwise.round(_tensor(x)),
    np.square: lambda x: elementwise.mul(_tensor(x), x), np.invert: lambda x: elementwise.bitwise_not(_tensor(x)),
    np.logical_not: lambda x: elementwise.logical_not(_tensor(x)), np.isnan: lambda x: elementwise.isnan(_tensor(x)),
    np.isfinite: lambda x: elementwise.isfinite(_tensor(x)),
}


# ---------------------------------------------------------------- other NumPy functions with a Frost op
# Each takes NumPy's parameters (names and defaults) and raises _Unmapped for a value Frost's op cannot honour.

def _sum(a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=None):
    _plain(out=out, initial=initial, where=where)
    return reduce.sum(_tensor(a), axis, bool(keepdims), dtype=dtype)


def _mean(a, axis=None, dtype=None, out=None, keepdims=False, *, where=None):
    _plain(dtype=dtype, out=out, where=where)
    return reduce.mean(_tensor(a), axis, bool(keepdims))


def _extreme(op: Callable) -> Callable:
    def mapped(a, axis=None, out=None, keepdims=False, initial=None, where=None):
        _plain(out=out, initial=initial, where=where)
        return op(_tensor(a), axis, bool(keepdims))
    return mapped


def _arg_extreme(op: Callable) -> Callable:
    def mapped(a, axis=None, out=None, *, keepdims=False):
        _plain(out=out)
        return op(_tensor(a), axis, bool(keepdims))
    return mapped


def _spread(op: Callable) -> Callable:
    def mapped(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, where=None, mean=None,
               correction=None):
        _plain(dtype=dtype, out=out, where=where, mean=mean)
        return op(_tensor(a), axis, bool(keepdims), correction=ddof if correction is None else correction)
    return mapped


def _all_any(op: Callable) -> Callable:
    def mapped(a, axis=None, out=None, keepdims=False, *, where=None):
        _plain(out=out, where=where)
        return op(_tensor(a), axis, bool(keepdims))
    return mapped


def _cumulative(op: Callable) -> Callable:
    def mapped(a, axis=None, dtype=None, out=None):
        _plain(dtype=dtype, out=out)
        a = _tensor(a)
        return op(a.reshape(-1), 0) if axis is None else op(a, axis)
    return mapped


def _prod(a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=None):
    _plain(dtype=dtype, out=out, initial=initial, where=where)
    if axis is not None and not isinstance(axis, int):  # Frost's prod reduces one dim or all
        raise _Unmapped("axis")
    return reduce.prod(_tensor(a), axis, bool(keepdims))


def _reshape(a, /, shape_=None, order="C", *, newshape=None, shape=None, copy=None):
    _plain(copy=copy)
    if order != "C":
        raise _Unmapped("order")
    new = next(s for s in (shape_, shape, newshape) if s is not None)
    return shape_ops.reshape(_tensor(a), (new,) if isinstance(new, int) else tuple(new))


def _transpose(a, axes=None):
    a = _tensor(a)
    return shape_ops.permute(a, tuple(range(a.ndim - 1, -1, -1)) if axes is None else tuple(axes))


def _concatenate(arrays, axis=0, out=None, *, dtype=None, casting=None):
    _plain(out=out, dtype=dtype, casting=casting)
    if axis is None:
        return shape_ops.cat([_tensor(a).reshape(-1) for a in arrays], 0)
    return shape_ops.cat([_tensor(a) for a in arrays], axis)


def _stack(arrays, axis=0, out=None, *, dtype=None, casting=None):
    _plain(out=out, dtype=dtype, casting=casting)
    return shape_ops.stack([_tensor(a) for a in arrays], axis)


def _squeeze(a, axis=None):
    return shape_ops.squeeze(_tensor(a), axis)


def _expand_dims(a, axis):
    if not isinstance(axis, int):
        raise _Unmapped("axis")
    return shape_ops.unsqueeze(_tensor(a), axis)


def _where(condition, *xy):
    if len(xy) != 2:  # where(condition) alone is nonzero(): indices, which Frost has no op for
        raise _Unmapped("x, y")
    return elementwise.where(_tensor(condition), *(_operand(v) for v in xy))


def _clip(a, a_min=None, a_max=None, out=None, *, min=None, max=None, **kwargs):
    _plain(out=out, **kwargs)
    return elementwise.clamp(_tensor(a), a_min if min is None else min, a_max if max is None else max)


def _round(a, decimals=0, out=None):
    _plain(out=out)
    if decimals != 0:
        raise _Unmapped("decimals")
    return elementwise.round(_tensor(a))


def _flip(m, axis=None):
    m = _tensor(m)
    dims = tuple(range(m.ndim)) if axis is None else (axis,) if isinstance(axis, int) else tuple(axis)
    return shape_ops.flip(m, dims)


def _dot(a, b, out=None):
    _plain(out=out)
    a, b = _tensor(a), _tensor(b)
    if a.ndim not in (1, 2) or b.ndim not in (1, 2):  # np.dot is matmul only for vectors and matrices
        raise _Unmapped("ndim")
    return matmul.matmul(a, b)


def _size(a, axis=None):
    return a.numel() if axis is None else a.shape[axis]


FUNCTIONS: dict[Callable, Callable[..., Any]] = {
    np.sum: _sum, np.mean: _mean, np.max: _extreme(reduce.amax), np.amax: _extreme(reduce.amax),
    np.min: _extreme(reduce.amin), np.amin: _extreme(reduce.amin), np.argmax: _arg_extreme(reduce.argmax),
    np.argmin: _arg_extreme(reduce.argmin), np.var: _spread(reduce.var), np.std: _spread(reduce.std),
    np.all: _all_any(reduce.all), np.any: _all_any(reduce.any), np.reshape: _reshape, np.prod: _prod,
    np.cumsum: _cumulative(reduce.cumsum), np.cumprod: _cumulative(scan.cumprod),
    np.transpose: _transpose, np.concatenate: _concatenate, np.stack: _stack, np.squeeze: _squeeze,
    np.expand_dims: _expand_dims, np.where: _where, np.clip: _clip, np.round: _round, np.around: _round,
    np.flip: _flip, np.tril: lambda m, k=0: shape_ops.tril(_tensor(m), k),
    np.triu: lambda m, k=0: shape_ops.triu(_tensor(m), k),
    np.dot: _dot, np.shape: lambda a: a.shape, np.ndim: lambda a: a.ndim, np.size: _size,
}


# ---------------------------------------------------------------- reading tensors as arrays (the fallback)
def _tensors_in(value: Any) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors_in(item)]
    return []


def _as_arrays(value: Any) -> Any:
    """value with every tensor (in lists and tuples too) replaced by its array, after checking it may be read so."""
    if isinstance(value, Tensor):
        return value.data
    if isinstance(value, (list, tuple)):
        return type(value)(_as_arrays(item) for item in value)
    return value


def _check_readable(name: str, values: list[Any]) -> None:
    """PyTorch's refusals for a tensor NumPy would read: one that requires grad, one on a GPU."""
    for t in _tensors_in(values):
        if t.requires_grad:
            raise TypeError(f"numpy.{name}: Frost has no op for it, and NumPy would read the tensor (shape "
                            f"{t.shape}) as an array, losing its graph. {GRAD_MESSAGE}")
        if t.device.type != "cpu":
            raise TypeError(f"numpy.{name}: Frost has no op for it, and can't convert {t.device} device type tensor "
                            f"to numpy. Use Tensor.cpu() to copy the tensor to host memory first.")


def array_ufunc(ufunc: np.ufunc, method: str, inputs: tuple, kwargs: dict) -> Any:
    """Tensor.__array_ufunc__: Frost's op where there is one, else NumPy's on the arrays (see the module docstring)."""
    op = UFUNCS.get(ufunc)
    if op is not None and method == "__call__" and not kwargs:
        return op(*inputs)
    name = ufunc.__name__ if method == "__call__" else f"{ufunc.__name__}.{method}"
    _check_readable(name, [inputs, kwargs.get("out", ())])
    out = kwargs.get("out")
    for t in _tensors_in(out):
        t._values_change()  # NumPy writes into the tensor's array
    result = getattr(ufunc, method)(*_as_arrays(inputs), **{k: _as_arrays(v) for k, v in kwargs.items()})
    if out is not None:
        return out[0] if isinstance(out, tuple) and len(out) == 1 else out
    if isinstance(result, tuple):
        return tuple(Tensor(r) if isinstance(r, (np.ndarray, np.generic)) else r for r in result)
    return Tensor(result) if isinstance(result, (np.ndarray, np.generic)) else result


def array_function(func: Callable, types: tuple, args: tuple, kwargs: dict) -> Any:
    """Tensor.__array_function__: Frost's op where there is one, else NumPy's on the arrays (see the module
    docstring); NotImplemented when another array type takes part (NumPy then asks it)."""
    if not all(issubclass(t, (Tensor, np.ndarray)) for t in types):
        return NotImplemented
    mapped = FUNCTIONS.get(func)
    if mapped is not None:
        try:
            return mapped(*args, **kwargs)
        except _Unmapped:
            pass
    _check_readable(func.__name__, [args, list(kwargs.values())])
    return func(*_as_arrays(args), **{k: _as_arrays(v) for k, v in kwargs.items()})
