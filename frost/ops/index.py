"""The scatter and index family (scatter, scatter_add, scatter_reduce, index_add, index_copy, index_fill, index_put,
masked_select, masked_scatter) and their in-place forms; forward and backward together."""
from __future__ import annotations

from typing import Callable

import numpy as np

from frost.autograd import unbroadcast
from frost.ops.reduce import normalize_dim
from frost.ops.scan import _lowest
from frost.ops.shape import scatter_at
from frost.tensor import Tensor, can_read_values, from_op

SCATTER_REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")


# ------------------------------------------------------------------ checks

def _integer_index(index, name: str) -> Tensor:
    if not isinstance(index, Tensor) or index.dtype.np.kind not in "iu":
        got = f"a {index.dtype.name} tensor" if isinstance(index, Tensor) else type(index).__name__
        raise RuntimeError(f"{name}: index must be an integer tensor (int64 or int32), got {got}")
    return index


def _same_dtype(x: Tensor, other, name: str, what: str) -> None:
    if isinstance(other, Tensor) and other.dtype != x.dtype:
        raise RuntimeError(f"{name}: self ({x.dtype.name}, shape {x.shape}) and {what} ({other.dtype.name}, shape "
                           f"{other.shape}) must have the same dtype")


def _check_range(idx, index: Tensor, size: int, name: str, dim, shapes: str, negative_ok: bool = False) -> None:
    """Refuse indices outside dim `dim` (of size `size`): NumPy would raise without naming the op, CuPy would wrap
    or clip silently. Read where the values are readable (not while a CUDA graph is captured)."""
    if idx.size == 0 or not can_read_values(index):
        return
    lowest = -size if negative_ok else 0
    bad = (idx < lowest) | (idx >= size)
    if bool(bad.any()):
        raise IndexError(f"{name}: index {int(idx[bad].reshape(-1)[0])} is out of bounds for dim {dim} of size "
                         f"{size} ({shapes})")


def _scatter_args(name: str, x: Tensor, dim, index, src):
    """(axis, index array, the src values that index reaches) for scatter-like ops, as PyTorch checks them: index
    as many dims as self, no larger than src anywhere and than self outside `dim`, its values inside self's dim."""
    index = _integer_index(index, name)
    if x.ndim == 0:
        raise RuntimeError(f"{name}: self is 0-d; scatter into x.reshape(1) (index and src of shape (1,)) instead")
    axis = normalize_dim(dim, x.ndim, name)
    src_shape = src.shape if isinstance(src, Tensor) else index.shape
    shapes = f"self {x.shape}, index {index.shape}, src {src_shape}"
    if index.ndim != x.ndim or (isinstance(src, Tensor) and src.ndim != x.ndim):
        raise RuntimeError(f"{name}: index and src must have as many dimensions as self ({shapes})")
    if any(i > s or (d != axis and i > n) for d, (i, s, n) in enumerate(zip(index.shape, src_shape, x.shape))):
        raise RuntimeError(f"{name}: index must be no larger than self apart from dim {dim}, and no larger than "
                           f"src ({shapes})")
    _same_dtype(x, src, name, "src")
    _check_range(index.data, index, x.shape[axis], name, dim, shapes)
    corner = tuple(slice(0, i) for i in index.shape)
    values = src.data[corner] if isinstance(src, Tensor) else src
    return axis, index.data, corner, values


def _positions(xp, idx, axis: int) -> tuple:
    """The places of self that index (along `axis`) and its own coordinates (elsewhere) name."""
    # open grids, as np.indices(sparse=True) gives (CuPy's indices has no sparse form)
    grids = [xp.arange(n).reshape((1,) * d + (n,) + (1,) * (idx.ndim - d - 1)) for d, n in enumerate(idx.shape)]
    grids[axis] = idx
    return tuple(grids)


def _src_grad(xp, src, corner: tuple, reached):
    """src's gradient: `reached` (the gradient at each index position) in the leading corner, zero elsewhere."""
    if not isinstance(src, Tensor):
        return None
    g = xp.zeros(src.shape, dtype=reached.dtype)
    g[corner] = reached
    return g


# ------------------------------------------------------------------ scatter

def scatter(x: Tensor, dim: int, index: Tensor, src=None, *, value=None, reduce: str | None = None) -> Tensor:
    """self with src's values (or the number `value`) written at index along `dim`: out[i][index[i][j]] = src[i][j]
    for dim 1. Repeated indices keep one of their values (which one PyTorch leaves unspecified); each gets src's
    gradient. reduce='add' or 'multiply' accumulates instead (scatter_reduce's 'sum' and 'prod')."""
    src = value if src is None else src
    if src is None:
        raise TypeError("scatter: needs src (a tensor or a number) or value")
    if reduce is not None:
        modes = {"add": "sum", "multiply": "prod"}
        if reduce not in modes:
            raise RuntimeError(f"scatter: reduce must be 'add' or 'multiply', got {reduce!r}")
        src = src if isinstance(src, Tensor) else _full_like_index(x, index, src)
        return scatter_reduce(x, dim, index, src, modes[reduce])
    xp = x.xp
    axis, idx, corner, values = _scatter_args("scatter", x, dim, index, src)
    pos = _positions(xp, idx, axis)
    out = x.data.copy()
    out[pos] = values

    def backward(g):
        gx = g.copy()
        gx[pos] = 0
        return gx, _src_grad(xp, src, corner, g[pos])
    return from_op(out, (x, src) if isinstance(src, Tensor) else (x,), backward, "scatter")


def _full_like_index(x: Tensor, index, value) -> Tensor:
    shape = index.shape if isinstance(index, Tensor) else ()
    return Tensor(x.xp.full(shape, value, dtype=x.data.dtype))


def scatter_add(x: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    """self plus src's values added at index along `dim`; repeated indices accumulate."""
    if not isinstance(src, Tensor):
        raise TypeError(f"scatter_add: src must be a tensor, got {type(src).__name__}")
    xp = x.xp
    axis, idx, corner, values = _scatter_args("scatter_add", x, dim, index, src)
    pos = _positions(xp, idx, axis)
    out = x.data.copy()
    scatter_at(xp, "add", out, pos, values)
    return from_op(out, (x, src), lambda g: (g, _src_grad(xp, src, corner, g[pos])), "scatter_add")


def scatter_reduce(x: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str, *,
                   include_self: bool = True) -> Tensor:
    """src's values reduced into self at index along `dim` with `reduce` ('sum', 'prod', 'mean', 'amax', 'amin');
    include_self=False leaves self's values out where some index lands (they are kept where none does)."""
    if reduce not in SCATTER_REDUCTIONS:
        raise RuntimeError(f"scatter_reduce: reduce must be one of {SCATTER_REDUCTIONS}, got {reduce!r}")
    if not isinstance(src, Tensor):
        raise TypeError(f"scatter_reduce: src must be a tensor, got {type(src).__name__}")
    xp = x.xp
    axis, idx, corner, values = _scatter_args("scatter_reduce", x, dim, index, src)
    pos = _positions(xp, idx, axis)
    self_in = xp.ones(x.shape, dtype=bool)  # where self's value takes part: everywhere, or where no index lands
    if not include_self:
        self_in[pos] = False
    start = x.data if include_self else xp.where(self_in, x.data, _identity(x.data.dtype, reduce))
    out, grads = _REDUCERS[reduce](xp, start.astype(x.data.dtype, copy=False), pos, values, self_in)

    def backward(g):
        gx, reached = grads(g)
        if not include_self:
            gx = xp.where(self_in, gx, 0).astype(g.dtype, copy=False)
        return gx, _src_grad(xp, src, corner, reached)
    return from_op(out, (x, src), backward, "scatter_reduce")


def _identity(dtype, reduce: str):
    """The value self's places start from where self takes no part (include_self=False)."""
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    return _lowest(dtype, largest=reduce == "amax")


# Each reducer: (xp, start, pos, values, self_in) -> (out, grads), grads(g) -> (self's gradient, the gradient at
# each index position); `start` is self's values, or the reduction's identity where self takes no part.

def _reduce_sum(xp, start, pos, values, _self_in):
    out = start.copy()
    scatter_at(xp, "add", out, pos, values)
    return out, lambda g: (g, g[pos])


def _reduce_mean(xp, start, pos, values, self_in):
    total = start.copy()
    scatter_at(xp, "add", total, pos, values)
    count = self_in.astype(np.int32)  # int32 counts: CuPy's add.at (atomic adds) takes them, int64 not everywhere
    xp.add.at(count, pos, xp.ones(values.shape, dtype=np.int32))
    count = xp.maximum(count, 1)
    out = total // count if start.dtype.kind in "iu" else (total / count).astype(start.dtype, copy=False)

    def grads(g):
        shared = (g / count).astype(g.dtype, copy=False)
        return shared, shared[pos]
    return out, grads


def _reduce_extreme(largest: bool) -> Callable:
    def reduce(xp, start, pos, values, self_in):
        out = start.copy()
        scatter_at(xp, "maximum" if largest else "minimum", out, pos, values)

        def grads(g):
            # the values equal to the extreme (ties) share its gradient evenly, as PyTorch's
            self_is = (start == out) & self_in
            src_is = values == out[pos]
            ties = self_is.astype(np.int32)  # counts: int32, which CuPy's add.at takes (g's bfloat16 not)
            xp.add.at(ties, pos, src_is.astype(np.int32))
            shared = g / xp.maximum(ties, 1).astype(g.dtype)
            return xp.where(self_is, shared, 0).astype(g.dtype), xp.where(src_is, shared[pos], 0).astype(g.dtype)
        return out, grads
    return reduce


def _reduce_prod(xp, start, pos, values, _self_in):
    out = start.copy()
    _multiply_at(xp, out, pos, values)

    def grads(g):
        # each factor's gradient is the product of the others: exact with zeros among them (dividing the
        # product by the factor is not), from the number of zeros and the product of the nonzero factors
        zeros = (start == 0).astype(np.int32)
        xp.add.at(zeros, pos, (values == 0).astype(np.int32))
        nonzero_product = xp.where(start == 0, 1, start).astype(g.dtype)
        _multiply_at(xp, nonzero_product, pos, xp.where(values == 0, 1, values).astype(g.dtype))
        return (g * _others_product(xp, start, zeros, nonzero_product),
                g[pos] * _others_product(xp, values, zeros[pos], nonzero_product[pos]))
    return out, grads


def _others_product(xp, factor, zeros, nonzero_product):
    with np.errstate(divide="ignore", invalid="ignore"):
        alone = nonzero_product / xp.where(factor == 0, 1, factor)
    return xp.where(factor == 0, xp.where(zeros == 1, nonzero_product, 0), xp.where(zeros == 0, alone, 0))


def _multiply_at(xp, target, pos: tuple, values) -> None:
    """target[pos] *= values for a C-contiguous target, repeated places multiplying every value in (NumPy's
    multiply.at, which CuPy lacks): the values sorted by place, each place's run multiplied up in log2(run)
    whole-array steps (a segmented Hillis-Steele scan), then each run's last product multiplied into its place."""
    shape = np.broadcast_shapes(*(p.shape for p in pos))
    places = xp.ravel_multi_index(tuple(xp.broadcast_to(p, shape) for p in pos), target.shape).reshape(-1)
    order = xp.argsort(places)
    places, product = places[order], xp.broadcast_to(values, shape).reshape(-1)[order].astype(target.dtype)
    shift = 1
    while shift < places.size:
        same_run = places[shift:] == places[:-shift]
        product = xp.concatenate([product[:shift],
                                  xp.where(same_run, product[shift:] * product[:-shift], product[shift:])])
        shift *= 2
    run_end = xp.concatenate([places[1:] != places[:-1], xp.ones(min(places.size, 1), dtype=bool)])
    flat = target.reshape(-1)  # a view: target is C-contiguous
    flat[places[run_end]] *= product[run_end]


_REDUCERS: dict[str, Callable] = {"sum": _reduce_sum, "mean": _reduce_mean, "prod": _reduce_prod,
                                  "amax": _reduce_extreme(True), "amin": _reduce_extreme(False)}


# ------------------------------------------------------------------ index_* along one dim

def _index_args(name: str, x: Tensor, dim, index, source=None) -> tuple:
    """The places along `dim` that index names, with PyTorch's checks: a 1-D (or 0-d) integer index,
    inside self's dim; a source shaped like self with len(index) along dim."""
    index = _integer_index(index, name)
    if index.ndim > 1:
        raise RuntimeError(f"{name}: index must be 1-D (or 0-d), got shape {index.shape}")
    axis = normalize_dim(dim, x.ndim, name)
    idx = index.data.reshape(-1)
    size = x.shape[axis] if x.ndim else 1
    if isinstance(source, Tensor):
        expected = x.shape[:axis] + (idx.size,) + x.shape[axis + 1:]
        if source.shape != expected and not (x.ndim == 0 and source.numel() == idx.size):
            raise RuntimeError(f"{name}: source of shape {source.shape} does not fit self of shape {x.shape} with "
                               f"{idx.size} indices along dim {dim} (expected {expected})")
        _same_dtype(x, source, name, "source")
    _check_range(idx, index, size, name, dim, f"self {x.shape}, index {index.shape}")
    return ((slice(None),) * axis + (idx,)) if x.ndim else (idx,)


def _as_1d(x: Tensor, source: Tensor | None = None):
    """A 0-d self reads as one element (PyTorch indexes it with dim 0 and index [0]), its source as 1-D."""
    t = x if source is None else source
    return t.data.reshape(-1) if x.ndim == 0 else t.data


def index_add(x: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha=1) -> Tensor:
    """self with alpha * source added at index along `dim`; repeated indices accumulate."""
    xp = x.xp
    place = _index_args("index_add", x, dim, index, source)
    out = _as_1d(x).copy()
    src = _as_1d(x, source)
    scatter_at(xp, "add", out, place, src if alpha == 1 else src * alpha)

    def backward(g):
        reached = g.reshape(out.shape)[place]
        return g, (reached if alpha == 1 else reached * alpha).reshape(source.shape)
    return from_op(out.reshape(x.shape), (x, source), backward, "index_add")


def index_copy(x: Tensor, dim: int, index: Tensor, source: Tensor) -> Tensor:
    """self with source's slices copied to index along `dim` (of repeated indices one copy stays)."""
    place = _index_args("index_copy", x, dim, index, source)
    out = _as_1d(x).copy()
    out[place] = _as_1d(x, source)

    def backward(g):
        gx = g.reshape(out.shape).copy()
        reached = gx[place].reshape(source.shape)
        gx[place] = 0
        return gx.reshape(x.shape), reached
    return from_op(out.reshape(x.shape), (x, source), backward, "index_copy")


def index_fill(x: Tensor, dim: int, index: Tensor, value) -> Tensor:
    """self with the slices at index along `dim` set to `value` (a number or a 0-d tensor)."""
    if isinstance(value, Tensor) and value.ndim:
        raise RuntimeError(f"index_fill: value must be a number or a 0-d tensor, got shape {value.shape}")
    xp = x.xp
    place = _index_args("index_fill", x, dim, index)
    filled = xp.zeros(_as_1d(x).shape, dtype=bool)
    filled[place] = True
    filled = filled.reshape(x.shape)
    fill = value.data if isinstance(value, Tensor) else value
    out = xp.where(filled, xp.asarray(fill, dtype=x.data.dtype), x.data)

    def backward(g):
        gx = xp.where(filled, 0, g).astype(g.dtype, copy=False)
        if not isinstance(value, Tensor):
            return (gx,)
        return gx, xp.asarray(xp.where(filled, g, 0).sum(), dtype=value.data.dtype)  # it fills every such place
    return from_op(out, (x, value) if isinstance(value, Tensor) else (x,), backward, "index_fill")


# ------------------------------------------------------------------ index_put

def _put_positions(x: Tensor, indices) -> tuple:
    if not isinstance(indices, (tuple, list)):
        raise TypeError(f"index_put: indices must be a tuple of tensors, got {type(indices).__name__}")
    if len(indices) > x.ndim:
        raise IndexError(f"index_put: too many indices ({len(indices)}) for self of shape {x.shape}")
    pos = []
    for d, i in enumerate(indices):
        if i is None:
            pos.append(slice(None))
            continue
        if not isinstance(i, Tensor) or not (i.dtype.np.kind in "iu" or i.dtype.name == "bool"):
            got = f"a {i.dtype.name} tensor" if isinstance(i, Tensor) else type(i).__name__
            raise IndexError(f"index_put: indices must be integer or bool tensors (or None), got {got} at {d}")
        if i.dtype.name != "bool":
            _check_range(i.data, i, x.shape[d], "index_put", d, f"self {x.shape}", negative_ok=True)
        pos.append(i.data)
    return tuple(pos)


def index_put(x: Tensor, indices, values, accumulate: bool = False) -> Tensor:
    """self with values written (accumulate=True: added, repeated places adding up) at x[indices], where indices
    is a tuple of integer or bool tensors, None standing for a whole dim."""
    xp = x.xp
    pos = _put_positions(x, indices)
    _same_dtype(x, values, "index_put", "values")
    vals = values.data if isinstance(values, Tensor) else values
    out = x.data.copy()
    try:
        if accumulate:
            scatter_at(xp, "add", out, pos, vals)
        else:
            out[pos] = vals
    except (IndexError, ValueError) as e:
        raise RuntimeError(f"index_put: {e} (self {x.shape}, values {getattr(vals, 'shape', ())})") from None

    def backward(g):
        gx = g
        if not accumulate:
            gx = g.copy()
            gx[pos] = 0
        if not isinstance(values, Tensor):
            return (gx,)
        return gx, unbroadcast(g[pos], values.shape)
    return from_op(out, (x, values) if isinstance(values, Tensor) else (x,), backward, "index_put")


# ------------------------------------------------------------------ masks

def _bool_mask(mask, name: str) -> Tensor:
    if not isinstance(mask, Tensor) or mask.dtype.name != "bool":
        got = f"a {mask.dtype.name} tensor" if isinstance(mask, Tensor) else type(mask).__name__
        raise RuntimeError(f"{name}: mask must be a bool tensor, got {got}")
    return mask


def _broadcast_with_mask(x: Tensor, mask: Tensor, name: str):
    try:
        shape = np.broadcast_shapes(x.shape, mask.shape)
    except ValueError:
        raise RuntimeError(f"{name}: mask of shape {mask.shape} does not broadcast with self of shape "
                           f"{x.shape}") from None
    return shape, x.xp.broadcast_to(mask.data, shape)


def masked_select(x: Tensor, mask: Tensor) -> Tensor:
    """The values of self where mask (both broadcast) is true, as a 1-D tensor in C order."""
    xp = x.xp
    shape, m = _broadcast_with_mask(x, _bool_mask(mask, "masked_select"), "masked_select")
    out = xp.broadcast_to(x.data, shape)[m]

    def backward(g):
        full = xp.zeros(shape, dtype=g.dtype)
        full[m] = g
        return (unbroadcast(full, x.shape),)
    return from_op(out, (x,), backward, "masked_select")


def masked_scatter(x: Tensor, mask: Tensor, source: Tensor) -> Tensor:
    """self with source's leading values (in C order) written where mask (both broadcast) is true."""
    xp = x.xp
    shape, m = _broadcast_with_mask(x, _bool_mask(mask, "masked_scatter"), "masked_scatter")
    _same_dtype(x, source, "masked_scatter", "source")
    n = int(m.sum())
    if source.numel() < n:
        raise RuntimeError(f"masked_scatter: mask (shape {mask.shape}) selects {n} places but source (shape "
                           f"{source.shape}) has only {source.numel()} values")
    out = xp.broadcast_to(x.data, shape).copy()
    out[m] = source.data.reshape(-1)[:n]

    def backward(g):
        gsource = xp.zeros(source.numel(), dtype=g.dtype)
        gsource[:n] = g[m]
        return unbroadcast(xp.where(m, 0, g).astype(g.dtype, copy=False), x.shape), gsource.reshape(source.shape)
    return from_op(out, (x, source), backward, "masked_scatter")


# ------------------------------------------------------------------ in place

def in_place(x: Tensor, name: str, op: Callable, *args, **kwargs) -> Tensor:
    """x changed in place to op(x, *args, **kwargs), as Tensor's other in-place ops: not recorded on the tape, so
    refused where a gradient would be lost (Tensor._assign_result)."""
    operands = [a for a in args if isinstance(a, Tensor)] + [v for v in kwargs.values() if isinstance(v, Tensor)]
    return x._assign_result(name, lambda t, *_: op(t, *args, **kwargs), *operands)
