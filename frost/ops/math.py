"""Element-wise math beyond elementwise.py's core (inverse trig and hyperbolic functions, log2/log10, atan2, fmod,
hypot, lerp, nan_to_num), matrix products (outer, bmm, addmm, baddbmm, tensordot) and array helpers (roll, diag,
trace, diff, count_nonzero, median, quantile), forward and backward together, with PyTorch's values and gradients."""
from __future__ import annotations

import math

import numpy as np

from frost.autograd import unbroadcast
from frost.ops import elementwise, matmul as matmul_ops, reduce, shape as shape_ops
from frost.ops.elementwise import _binary, _cast, _compare, _describe, _integer_safe, _operands, _quiet, _unary
from frost.ops.reduce import normalize_dim, normalize_dims, values_indices
from frost.tensor import Tensor, from_op

_LN2, _LN10 = math.log(2.0), math.log(10.0)


def _check_tensor(name: str, x, what: str = "input") -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: {what} must be a Tensor, got {type(x).__name__}")


def broadcasts_to(shape: tuple, target: tuple) -> bool:
    """Whether an operand of `shape` broadcasts to `target` without growing it (PyTorch's rule for a weight or an
    added input: the result keeps the other operand's shape)."""
    try:
        return np.broadcast_shapes(shape, target) == target
    except ValueError:
        return False


# ------------------------------------------------------------------ unary math

def square(x: Tensor) -> Tensor:
    """x * x, in x's dtype (integers stay integers, as PyTorch's)."""
    _check_tensor("square", x)
    return elementwise.mul(x, x)


def log2(x: Tensor) -> Tensor:
    return _unary("log2", x, lambda a: x.xp.log2(a), lambda g, a, o: g / (a * _LN2))


def log10(x: Tensor) -> Tensor:
    return _unary("log10", x, lambda a: x.xp.log10(a), lambda g, a, o: g / (a * _LN10))


def tan(x: Tensor) -> Tensor:
    return _unary("tan", x, lambda a: x.xp.tan(a), lambda g, a, o: g * (1 + o * o))


def sinh(x: Tensor) -> Tensor:
    return _unary("sinh", x, lambda a: x.xp.sinh(a), lambda g, a, o: g * x.xp.cosh(a))


def cosh(x: Tensor) -> Tensor:
    return _unary("cosh", x, lambda a: x.xp.cosh(a), lambda g, a, o: g * x.xp.sinh(a))


def asin(x: Tensor) -> Tensor:
    return _unary("asin", x, lambda a: x.xp.arcsin(a), lambda g, a, o: g / x.xp.sqrt(1 - a * a))


def acos(x: Tensor) -> Tensor:
    return _unary("acos", x, lambda a: x.xp.arccos(a), lambda g, a, o: -g / x.xp.sqrt(1 - a * a))


def atan(x: Tensor) -> Tensor:
    return _unary("atan", x, lambda a: x.xp.arctan(a), lambda g, a, o: g / (1 + a * a))


def asinh(x: Tensor) -> Tensor:
    return _unary("asinh", x, lambda a: x.xp.arcsinh(a), lambda g, a, o: g / x.xp.sqrt(a * a + 1))


def acosh(x: Tensor) -> Tensor:
    # sqrt(a - 1) * sqrt(a + 1), not sqrt(a * a - 1), which loses precision near 1 (as PyTorch writes it)
    return _unary("acosh", x, lambda a: x.xp.arccosh(a),
                  lambda g, a, o: g / (x.xp.sqrt(a - 1) * x.xp.sqrt(a + 1)))


def atanh(x: Tensor) -> Tensor:
    return _unary("atanh", x, lambda a: x.xp.arctanh(a), lambda g, a, o: g / (1 - a * a))


def nan_to_num(x: Tensor, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None) -> Tensor:
    """NaN, +inf and -inf replaced (by default with 0 and the dtype's largest and lowest finite values); the
    gradient flows only to the finite elements, as PyTorch's."""
    _check_tensor("nan_to_num", x)
    xp = x.xp
    if not x.dtype.is_floating_point:
        return Tensor(x.data.copy())
    a = x.data
    info = np.finfo(a.dtype)
    out = xp.where(a != a, nan, a)
    out = xp.where(out == np.inf, info.max if posinf is None else posinf, out)
    out = xp.where(out == -np.inf, info.min if neginf is None else neginf, out).astype(a.dtype, copy=False)
    return from_op(out, (x,), lambda g: (xp.where(xp.isfinite(a), g, 0).astype(g.dtype, copy=False),), "nan_to_num")


# ------------------------------------------------------------------ binary math

def atan2(input: Tensor | float, other: Tensor | float) -> Tensor:
    """The angle of the point (other, input), in (-pi, pi]; integers give floats."""
    def backward(g, y, x, out):
        r2 = x * x + y * y
        return g * x / r2, -g * y / r2
    return _binary("atan2", input, other, lambda y, x: elementwise._xp(y, x).arctan2(y, x), backward,
                   float_result=True)


def fmod(input: Tensor | float, other: Tensor | float) -> Tensor:
    """C's remainder: the sign of the dividend (remainder's takes the divisor's)."""
    def backward(g, x, y, out):
        return g, -g * elementwise._xp(g).trunc(x / y)
    return _binary("fmod", input, other, _integer_safe("fmod", lambda x, y: elementwise._xp(x, y).fmod(x, y)),
                   backward)


def hypot(input: Tensor | float, other: Tensor | float) -> Tensor:
    """sqrt(input^2 + other^2) without overflow in the squares."""
    return _binary("hypot", input, other, lambda x, y: elementwise._xp(x, y).hypot(x, y),
                   lambda g, x, y, out: (g * x / out, g * y / out), float_result=True)


def logical_xor(input: Tensor | float, other: Tensor | float) -> Tensor:
    return _compare("logical_xor", input, other, lambda x, y: elementwise._xp(x, y).logical_xor(x, y))


def clamp_min(x: Tensor, min: Tensor | float) -> Tensor:
    return elementwise.clamp(x, min=min)


def clamp_max(x: Tensor, max: Tensor | float) -> Tensor:
    return elementwise.clamp(x, max=max)


def lerp(input: Tensor, end: Tensor, weight: Tensor | float) -> Tensor:
    """input + weight * (end - input); weight a number or a tensor, all three broadcast."""
    _check_tensor("lerp", input)
    _check_tensor("lerp", end, "end")
    if input.dtype != end.dtype:
        raise RuntimeError(f"lerp: input {_describe(input)} and end {_describe(end)} must have the same dtype")
    if not input.dtype.is_floating_point:
        raise TypeError(f"lerp: needs floating-point tensors, got {_describe(input)}")
    _, _, start, stop, _ = _operands(input, end, "lerp")
    w_tensor = weight if isinstance(weight, Tensor) else None
    if w_tensor is not None:
        _operands(input, w_tensor, "lerp")  # device and shape checks
    xp = input.xp
    w = weight.data.astype(start.dtype, copy=False) if w_tensor is not None else weight
    span = stop - start
    # from the nearer end, as PyTorch's, so that weight 1 gives exactly `end`
    # a number's side is picked on the host: xp.asarray(number) would copy it to the GPU, which a capture refuses
    if w_tensor is None:
        out = start + w * span if abs(w) < 0.5 else stop - span * (1 - w)
    else:
        out = xp.where(xp.abs(w) < 0.5, start + w * span, stop - span * (1 - w))
    out = out.astype(start.dtype, copy=False)
    parents = (input, end) if w_tensor is None else (input, end, w_tensor)

    def backward(g):
        grads = [unbroadcast(g * (1 - w), input.shape), unbroadcast(g * w, end.shape)]
        if w_tensor is not None:
            grads.append(unbroadcast(g * span, w_tensor.shape))
        return [_cast(gr, p.dtype) for gr, p in zip(grads, parents)]
    return from_op(out, parents, backward, "lerp")


# ------------------------------------------------------------------ products

def outer(input: Tensor, vec2: Tensor) -> Tensor:
    """The matrix input[i] * vec2[j] of two vectors."""
    _check_tensor("outer", input)
    _check_tensor("outer", vec2, "vec2")
    if input.ndim != 1 or vec2.ndim != 1:
        raise RuntimeError(f"outer: expects two 1-D tensors, got shapes {input.shape} and {vec2.shape}")
    return elementwise.mul(shape_ops.unsqueeze(input, 1), vec2)


def bmm(input: Tensor, mat2: Tensor) -> Tensor:
    """Batched matrix product of (b, n, m) and (b, m, p); no broadcasting, as PyTorch's."""
    _check_tensor("bmm", input)
    _check_tensor("bmm", mat2, "mat2")
    if input.ndim != 3 or mat2.ndim != 3:
        raise RuntimeError(f"bmm: expects two 3-D tensors, got shapes {input.shape} and {mat2.shape}")
    if input.shape[0] != mat2.shape[0] or input.shape[2] != mat2.shape[1]:
        raise RuntimeError(f"bmm: shapes {input.shape} and {mat2.shape} do not fit (expected (b, n, m) and "
                           f"(b, m, p))")
    return matmul_ops.matmul(input, mat2)


def _scaled_sum(name: str, input: Tensor, product: Tensor, beta, alpha) -> Tensor:
    """beta * input + alpha * product; beta = 0 ignores input (a NaN there does not spread), as PyTorch's."""
    _check_tensor(name, input)
    if not broadcasts_to(input.shape, product.shape):
        raise RuntimeError(f"{name}: input of shape {input.shape} cannot be broadcast to the product's shape "
                           f"{product.shape}")
    scaled = product if alpha == 1 else elementwise.mul(product, alpha)
    if beta == 0:  # input still gets a gradient, of zeros, as PyTorch's
        xp = input.xp
        return from_op(scaled.data, (scaled, input),
                       lambda g: (g, xp.zeros(input.shape, dtype=input.data.dtype)), name)
    return elementwise.add(input if beta == 1 else elementwise.mul(input, beta), scaled)


def addmm(input: Tensor, mat1: Tensor, mat2: Tensor, *, beta: float = 1, alpha: float = 1) -> Tensor:
    """beta * input + alpha * (mat1 @ mat2), mat1 (n, m) and mat2 (m, p)."""
    _check_tensor("addmm", mat1, "mat1")
    _check_tensor("addmm", mat2, "mat2")
    if mat1.ndim != 2 or mat2.ndim != 2 or mat1.shape[1] != mat2.shape[0]:
        raise RuntimeError(f"addmm: mat1 of shape {mat1.shape} and mat2 of shape {mat2.shape} must be matrices "
                           f"(n, m) and (m, p)")
    return _scaled_sum("addmm", input, matmul_ops.matmul(mat1, mat2), beta, alpha)


def baddbmm(input: Tensor, batch1: Tensor, batch2: Tensor, *, beta: float = 1, alpha: float = 1) -> Tensor:
    """beta * input + alpha * bmm(batch1, batch2)."""
    return _scaled_sum("baddbmm", input, bmm(batch1, batch2), beta, alpha)


def tensordot(a: Tensor, b: Tensor, dims: int | tuple = 2) -> Tensor:
    """Sum over a's last `dims` dims and b's first (or over the listed dims, dims=([a dims], [b dims])): one
    matrix product of the permuted, flattened operands."""
    _check_tensor("tensordot", a, "a")
    _check_tensor("tensordot", b, "b")
    axes_a, axes_b = _contracted_axes(a, b, dims)
    free_a = [i for i in range(a.ndim) if i not in axes_a]
    free_b = [i for i in range(b.ndim) if i not in axes_b]
    k = math.prod(a.shape[i] for i in axes_a)
    m, n = math.prod(a.shape[i] for i in free_a), math.prod(b.shape[i] for i in free_b)
    left = shape_ops.reshape(shape_ops.permute(a, tuple(free_a + axes_a)), (m, k))
    right = shape_ops.reshape(shape_ops.permute(b, tuple(axes_b + free_b)), (k, n))
    out_shape = tuple(a.shape[i] for i in free_a) + tuple(b.shape[i] for i in free_b)
    return shape_ops.reshape(matmul_ops.matmul(left, right), out_shape)


def _contracted_axes(a: Tensor, b: Tensor, dims) -> tuple:
    if isinstance(dims, int):
        if dims < 0 or dims > min(a.ndim, b.ndim):
            raise RuntimeError(f"tensordot: dims={dims} must be in [0, {min(a.ndim, b.ndim)}] for shapes {a.shape} "
                               f"and {b.shape}")
        axes_a, axes_b = list(range(a.ndim - dims, a.ndim)), list(range(dims))
    else:
        dims_a, dims_b = dims
        dims_a = [dims_a] if isinstance(dims_a, int) else list(dims_a)
        dims_b = [dims_b] if isinstance(dims_b, int) else list(dims_b)
        if len(dims_a) != len(dims_b):
            raise RuntimeError(f"tensordot: both dim lists must have the same length, got {dims_a} and {dims_b}")
        axes_a = [normalize_dim(d, a.ndim, "tensordot") for d in dims_a]
        axes_b = [normalize_dim(d, b.ndim, "tensordot") for d in dims_b]
    for i, j in zip(axes_a, axes_b):
        if a.shape[i] != b.shape[j]:
            raise RuntimeError(f"tensordot: contracted dimensions must match in size: a's dim {i} is "
                               f"{a.shape[i]} but b's dim {j} is {b.shape[j]} (shapes {a.shape} and {b.shape})")
    return axes_a, axes_b


# ------------------------------------------------------------------ array helpers

def roll(x: Tensor, shifts: int | tuple, dims: int | tuple | None = None) -> Tensor:
    """Elements shifted along `dims`, those pushed off the end coming back at the start; with dims=None the
    flattened tensor is rolled and reshaped."""
    _check_tensor("roll", x)
    shifts_t = (shifts,) if isinstance(shifts, int) else tuple(shifts)
    if dims is None:
        if len(shifts_t) != 1:
            raise RuntimeError(f"roll: without dims, shifts must be one number, got {shifts}")
        axes = None
    else:
        dims_t = (dims,) if isinstance(dims, int) else tuple(dims)
        if len(dims_t) != len(shifts_t):
            raise RuntimeError(f"roll: shifts and dims must align: shifts {shifts_t} and dims {dims_t}")
        axes = tuple(normalize_dim(d, x.ndim, "roll") for d in dims_t)
    xp = x.xp
    shift = shifts_t[0] if axes is None else shifts_t
    back = -shift if axes is None else tuple(-s for s in shifts_t)
    return from_op(xp.roll(x.data, shift, axis=axes), (x,), lambda g: (xp.roll(g, back, axis=axes),), "roll")


def _diagonal_positions(xp, shape: tuple, diagonal: int):
    """Row and column indices of the `diagonal`-th diagonal of a matrix of `shape`."""
    rows, cols = shape
    n = max(0, min(rows - max(-diagonal, 0), cols - max(diagonal, 0)))
    steps = xp.arange(n)
    return steps + max(-diagonal, 0), steps + max(diagonal, 0)


def diag(x: Tensor, diagonal: int = 0) -> Tensor:
    """A vector's square matrix with it on the `diagonal`-th diagonal, or a matrix's `diagonal`-th diagonal."""
    _check_tensor("diag", x)
    xp = x.xp
    if x.ndim == 1:
        size = x.shape[0] + abs(diagonal)
        rows, cols = _diagonal_positions(xp, (size, size), diagonal)
        out = xp.zeros((size, size), dtype=x.data.dtype)
        out[rows, cols] = x.data
        return from_op(out, (x,), lambda g: (g[rows, cols],), "diag")
    if x.ndim != 2:
        raise RuntimeError(f"diag: expects a 1-D or 2-D tensor, got shape {x.shape}")
    rows, cols = _diagonal_positions(xp, x.shape, diagonal)

    def backward(g):
        gx = xp.zeros(x.shape, dtype=g.dtype)
        gx[rows, cols] = g
        return (gx,)
    return from_op(x.data[rows, cols], (x,), backward, "diag")


def trace(x: Tensor) -> Tensor:
    """The sum of a matrix's main diagonal; integers sum in int64, as PyTorch's."""
    _check_tensor("trace", x)
    if x.ndim != 2:
        raise RuntimeError(f"trace: expects a matrix (2-D tensor), got shape {x.shape}")
    return reduce.sum(diag(x))


def diff(x: Tensor, n: int = 1, dim: int = -1, prepend: Tensor | None = None, append: Tensor | None = None) -> Tensor:
    """The n-th forward difference along `dim` (x[i + 1] - x[i], n times), after concatenating prepend and append;
    for bools, x[i + 1] != x[i], as PyTorch's."""
    _check_tensor("diff", x)
    if x.ndim == 0:
        raise RuntimeError("diff: expects input to be at least one-dimensional, got a 0-d tensor")
    if n < 0:
        raise RuntimeError(f"diff: order must be non-negative, got n={n}")
    axis = normalize_dim(dim, x.ndim, "diff")
    parts = [t for t in (prepend, x, append) if t is not None]
    for t in parts:
        if not isinstance(t, Tensor) or t.ndim != x.ndim:
            raise RuntimeError(f"diff: prepend and append must be tensors with as many dims as input (shape "
                               f"{x.shape}), got {_describe(t)}")
    out = shape_ops.cat(parts, axis) if len(parts) > 1 else x
    step = elementwise.ne if out.dtype.name == "bool" else elementwise.sub
    for _ in range(n):
        length = out.shape[axis]
        if length == 0:
            break
        out = step(shape_ops.narrow(out, axis, 1, length - 1), shape_ops.narrow(out, axis, 0, length - 1))
    return out


def count_nonzero(x: Tensor, dim: int | tuple | None = None) -> Tensor:
    """How many elements are not zero (over `dim`, or all), as int64."""
    _check_tensor("count_nonzero", x)
    axes = normalize_dims(dim, x.ndim, "count_nonzero")
    return Tensor(x.xp.asarray((x.data != 0).sum(axis=axes)).astype(np.int64))


# ------------------------------------------------------------------ order statistics

def median(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor | tuple:
    """The lower median (of an even count, the smaller middle value), NaN if the values hold one. Without dim: a
    0-d tensor whose gradient is split evenly among the elements equal to it; with dim: (values, indices), the
    gradient going to the index, as PyTorch's."""
    _check_tensor("median", x)
    xp = x.xp
    if dim is None:
        a = x.data.reshape(-1)
        if a.size == 0:
            raise RuntimeError(f"median: cannot take the median of an empty tensor (shape {x.shape})")
        value = xp.asarray(a[_median_positions(xp, a[None])[0]])

        def backward(g):
            with _quiet():
                ties = (x.data == value) | ((x.data != x.data) & (value != value))
                return ((g * ties / ties.sum()).astype(g.dtype, copy=False),)
        return from_op(value, (x,), backward, "median")
    axis = normalize_dim(dim, x.ndim, "median")
    if x.ndim and x.shape[axis] == 0:
        raise IndexError(f"median: cannot take the median along dim {dim} of size 0 (shape {x.shape})")
    moved = xp.moveaxis(x.data, axis, -1) if x.ndim else x.data.reshape(1)
    idx = xp.expand_dims(_median_positions(xp, moved.reshape(-1, moved.shape[-1])).reshape(moved.shape[:-1]), -1)
    idx = xp.moveaxis(idx, -1, axis) if x.ndim else idx.reshape(())
    values = shape_ops.gather(x, axis, Tensor(idx)) if x.ndim else shape_ops.clone(x)
    if not keepdim and x.ndim:
        values, idx = shape_ops.squeeze(values, axis), xp.squeeze(idx, axis)
    return values_indices(values, Tensor(idx))


def _median_positions(xp, rows):
    """Per row (along axis 1 of a 2-D array), the index of its lower median, or of its first NaN."""
    order = xp.argsort(rows, axis=1, kind="stable")
    middle = order[:, (rows.shape[1] - 1) // 2]
    nans = rows != rows
    return xp.where(nans.any(axis=1), xp.argmax(nans, axis=1), middle)


_QUANTILE_MODES = ("linear", "lower", "higher", "midpoint", "nearest")


def quantile(x: Tensor, q: float | Tensor, dim: int | None = None, keepdim: bool = False,
             interpolation: str = "linear") -> Tensor:
    """The q-th quantiles (q in [0, 1], a number or a 1-D tensor, which adds a leading dim) of x's values, or along
    `dim`, interpolating between the two nearest sorted values; NaN where the values hold one, as PyTorch's."""
    _check_tensor("quantile", x)
    if not x.dtype.is_floating_point:
        raise TypeError(f"quantile: needs a floating-point tensor, got {_describe(x)}")
    if interpolation not in _QUANTILE_MODES:
        raise ValueError(f"quantile: interpolation must be one of {_QUANTILE_MODES}, got {interpolation!r}")
    qs = np.asarray(q._host() if isinstance(q, Tensor) else q, dtype=np.float64)
    if qs.ndim > 1 or not ((qs >= 0) & (qs <= 1)).all():
        raise ValueError(f"quantile: q must be a number or a 1-D tensor of values in [0, 1], got {q}")
    source = shape_ops.reshape(x, (-1,)) if dim is None else x
    axis = 0 if dim is None else normalize_dim(dim, x.ndim, "quantile")
    n = source.shape[axis] if source.ndim else 1
    if n == 0:
        raise IndexError(f"quantile: cannot take quantiles of an empty tensor (shape {x.shape}, dim {dim})")
    sorted_values = reduce.sort(source, axis).values
    out = _interpolated(sorted_values, axis, qs.reshape(-1) * (n - 1), interpolation)
    has_nan = reduce.any(elementwise.isnan(source), axis, keepdim=True)
    out = elementwise.where(has_nan, float("nan"), out)
    out = shape_ops.permute(out, (axis,) + tuple(i for i in range(out.ndim) if i != axis))  # q's dim first
    if keepdim:
        kept = [1] * x.ndim if dim is None else list(x.shape)
        if dim is not None:
            kept[axis] = 1
        out = shape_ops.reshape(out, (out.shape[0], *kept))
    return shape_ops.reshape(out, out.shape[1:]) if qs.ndim == 0 else out


def _interpolated(sorted_values: Tensor, axis: int, ranks: np.ndarray, interpolation: str) -> Tensor:
    """The sorted values at fractional `ranks` along axis (one slot per rank, in place of axis)."""
    lower, upper = np.floor(ranks), np.ceil(ranks)
    if interpolation == "nearest":
        lower = upper = np.round(ranks)  # half to even, as PyTorch's
    elif interpolation == "lower":
        upper = lower
    elif interpolation == "higher":
        lower = upper
    xp = sorted_values.xp
    low = shape_ops.index_select(sorted_values, axis, Tensor(xp.asarray(lower.astype(np.int64))))
    high = shape_ops.index_select(sorted_values, axis, Tensor(xp.asarray(upper.astype(np.int64))))
    if interpolation in ("lower", "higher", "nearest"):
        return low
    weight = ranks - lower if interpolation == "linear" else np.full_like(ranks, 0.5) * (upper != lower)
    shape = [1] * sorted_values.ndim
    shape[axis] = len(ranks)
    return lerp(low, high, Tensor(xp.asarray(weight.reshape(shape).astype(sorted_values.data.dtype))))
