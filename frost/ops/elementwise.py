"""Elementwise ops: arithmetic with broadcasting, comparisons, activations, casts; forward and backward together."""
from __future__ import annotations

import math

import numpy as np

from frost import backend, dispatch
from frost.autograd import GradientPair, grad_destination, sum_of_gradients, unbroadcast
from frost.backend import cuda
from frost.dtype import DType, default_float_dtype, result_type, scalar_result, to_dtype, widened
from frost.tensor import Tensor, from_op, record_tensor_backward


def _describe(x) -> str:
    if isinstance(x, Tensor):
        return f"tensor(shape={x.shape}, dtype={x.dtype.name}, device={x.device})"
    return repr(x)


def _as_tensor_or_scalar(x, name: str):
    if isinstance(x, Tensor) or isinstance(x, (bool, int, float)):
        return x
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return Tensor(x)
    raise TypeError(f"{name}: unsupported operand {type(x).__name__}; expected a Tensor or a Python number")


def _operands(a, b, name: str):
    """Check devices and shapes, promote dtypes; return (tensor_a|None, tensor_b|None, array_a, array_b, dtype)."""
    a, b = _as_tensor_or_scalar(a, name), _as_tensor_or_scalar(b, name)
    ta = a if isinstance(a, Tensor) else None
    tb = b if isinstance(b, Tensor) else None
    if ta is not None and tb is not None:
        if ta.device != tb.device:
            raise RuntimeError(f"{name}: operands are on different devices: {_describe(ta)} and {_describe(tb)}")
        if ta.data.shape != tb.data.shape:
            try:
                np.broadcast_shapes(ta.shape, tb.shape)
            except ValueError:
                raise RuntimeError(f"{name}: shapes {ta.shape} and {tb.shape} cannot be broadcast together "
                                   f"({_describe(ta)} and {_describe(tb)})") from None
        if ta.data.dtype == tb.data.dtype:  # the common case: nothing to promote
            dt = ta.dtype
        else:
            dt = result_type(ta.dtype, ta.ndim, tb.dtype, tb.ndim)
    elif ta is not None:
        dt = scalar_result(ta.dtype, b)
    else:
        dt = scalar_result(tb.dtype, a)
    xa = _cast(ta.data, dt) if ta is not None else _wrapped(a, dt)
    xb = _cast(tb.data, dt) if tb is not None else _wrapped(b, dt)
    return ta, tb, xa, xb, dt


def _wrapped(scalar, dt: DType):
    """A Python int outside an integer tensor's range wraps into it, as in PyTorch (uint8 + -2 adds 254); NumPy
    would raise OverflowError instead."""
    if type(scalar) is int and dt.np.kind in "iu":
        info = np.iinfo(dt.np)
        if not info.min <= scalar <= info.max:
            return np.array(scalar % 2 ** 64, dtype=np.uint64).astype(dt.np)[()]
    return scalar


def _cast(array, dt: DType):
    return array if array.dtype == dt.np else converted(array, dt.np)


def _quiet():
    """NumPy's floating-point warnings off: log(0) is -inf and inf - inf is nan without a warning, as in
    PyTorch (anomaly mode is the tool that finds where a NaN first appears)."""
    return np.errstate(divide="ignore", invalid="ignore", over="ignore")


def _binary(name: str, a, b, forward, backward, float_result: bool = False, derivative: tuple | None = None) -> Tensor:
    """Run a broadcasting binary op; `backward(g, xa, xb, out)` returns full-shape (grad_a, grad_b) arrays;
    `derivative`: (d_a, d_b), each `(g, out, a, b) -> full-shape gradient` on Tensors (the Tensor-level backward)."""
    ta, tb, xa, xb, dt = _operands(a, b, name)
    if float_result and not dt.is_floating_point:
        dt = default_float_dtype()
        xa = _cast(xa, dt) if ta is not None else float(xa)
        xb = _cast(xb, dt) if tb is not None else float(xb)
    with _quiet():
        out = forward(xa, xb)
    if hasattr(out, "dtype") and out.dtype != dt.np and out.dtype.kind != "b":
        out = out.astype(dt.np)
    elif not hasattr(out, "dtype"):
        out = np.asarray(out, dtype=dt.np)
    parents = [t for t in (ta, tb) if t is not None]

    def grad_fn(g):
        with _quiet():
            ga, gb = backward(g, xa, xb, out)
        grads = []
        if ta is not None:
            grads.append(None if ga is None else _cast(unbroadcast(ga, ta.shape), ta.dtype))
        if tb is not None:
            grads.append(None if gb is None else _cast(unbroadcast(gb, tb.shape), tb.dtype))
        return grads

    operands = (ta if ta is not None else xa, tb if tb is not None else xb)
    return from_op(out, parents, grad_fn, name, derivative and _binary_derivative(derivative, operands))


def _binary_derivative(derivative: tuple, operands: tuple):
    """A binary op's tensor_backward: each Tensor operand's gradient from its half of `derivative`, summed down to
    its shape (unbroadcast, on the tape) in its dtype; made only for an operand that requires grad."""
    def tensor_backward(g: Tensor, out: Tensor) -> list:
        return [sum_to(d(g, out, *operands), t.shape).to(t.dtype) if t.requires_grad else None
                for d, t in zip(derivative, operands) if isinstance(t, Tensor)]
    return tensor_backward


def sum_to(g: Tensor, shape: tuple) -> Tensor:
    """unbroadcast on Tensors: g summed down to `shape` with Frost's ops, so that the sum has a graph."""
    if g.shape == tuple(shape):
        return g
    extra = g.ndim - len(shape)
    axes = tuple(range(extra)) + tuple(extra + i for i, n in enumerate(shape) if n == 1 and g.shape[extra + i] != 1)
    return g.sum(axes, keepdim=True).reshape(tuple(shape))


def _unary(name: str, x: Tensor, forward, backward, derivative=None) -> Tensor:
    """Run an elementwise op on a float tensor; `backward(g, x_array, out)` gives the input gradient, and
    `derivative(g, out, x)` the same on Tensors (the Tensor-level backward)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a Tensor, got {type(x).__name__}")
    xa = x.data if x.dtype.is_floating_point else x.data.astype(default_float_dtype().np)
    with _quiet():
        out = forward(xa)

    def grad_fn(g):
        with _quiet():
            return (backward(g, xa, out),)
    return from_op(out, (x,), grad_fn, name, derivative and (lambda g, o: (derivative(g, o, x),)))


# ------------------------------------------------------------------ arithmetic

_ADD_DERIVATIVE = (lambda g, o, x, y: g, lambda g, o, x, y: g)


def add(a, b) -> Tensor:
    one_pass = _added_in_one_pass(a, b)
    if one_pass is not None:
        return one_pass
    return _binary("add", a, b, lambda x, y: x + y, lambda g, x, y, o: (g, g), derivative=_ADD_DERIVATIVE)


def _added_in_one_pass(a, b) -> Tensor | None:
    """a + b of two float tensors of one shape by the acceleration layer's single pass, where one registers (operands
    of two dtypes are read as they are, not cast to a copy first); None otherwise."""
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)) or not dispatch.has_paths("add", a.data) \
            or a.shape != b.shape or a.device != b.device \
            or not (a.dtype.is_floating_point and b.dtype.is_floating_point):
        return None
    dt = a.dtype if a.dtype == b.dtype else result_type(a.dtype, a.ndim, b.dtype, b.ndim)
    fast = dispatch.lookup("add", a.data, b.data, dtype=dt.np)
    if fast is None:
        return None

    def backward(g):
        if isinstance(g, GradientPair):  # a residual stream's two contributions: summed once for both operands
            return sum_in_dtypes(g, (a.data.dtype, b.data.dtype))
        kept = [t.__dict__.pop("_gradient_copy", None) for t in (a, b)]   # keep_branch_gradient's
        return [_cast(g, t.dtype) if k is None or k[0] is not g else k[1] for t, k in zip((a, b), kept)]
    backward.takes_gradient_pairs = True
    return from_op(fast(a.data, b.data, dt.np), (a, b), backward, "add", _binary_derivative(_ADD_DERIVATIVE, (a, b)))


def keep_branch_gradient(t: Tensor, g, copy) -> None:
    """`copy`: gradient g in branch t's dtype, written beside g by a fast path (LayerNorm's backward on a residual
    stream); the one-pass add that joined t to the stream hands it to t instead of casting g."""
    t.__dict__["_gradient_copy"] = (g, copy)


def sum_in_dtypes(pair: tuple, dtypes: tuple) -> list:
    """The sum of two like arrays in each of `dtypes` (NumPy dtypes): a float32 stream's gradient and its 16-bit
    branch's in one pass where the acceleration layer registers one ("sum_in_dtypes"), else one sum and its casts."""
    fast = dispatch.lookup("sum_in_dtypes", *pair, dtypes=dtypes)
    if fast is not None:
        return fast(*pair, dtypes)
    total = sum_of_gradients(*pair)
    return [total if total.dtype == dtype else converted(total, dtype) for dtype in dtypes]


def sub(a, b) -> Tensor:
    return _binary("sub", a, b, lambda x, y: x - y, lambda g, x, y, o: (g, -g),
                   derivative=(lambda g, o, x, y: g, lambda g, o, x, y: -g))


def mul(a, b) -> Tensor:
    return _binary("mul", a, b, lambda x, y: x * y, lambda g, x, y, o: (g * y, g * x),
                   derivative=(lambda g, o, x, y: g * y, lambda g, o, x, y: g * x))


def div(a, b, rounding_mode: str | None = None) -> Tensor:
    """a / b; rounding_mode "trunc" rounds toward zero and "floor" down, keeping integer dtypes (their gradient is
    0, as PyTorch's)."""
    if rounding_mode is None:
        return _binary("div", a, b, lambda x, y: x / y,
                       lambda g, x, y, o: (g / y, -g * x / (y * y)), float_result=True,
                       derivative=(lambda g, o, x, y: g / y, lambda g, o, x, y: -g * o / y))
    if rounding_mode == "floor":
        return _binary("div", a, b, _integer_safe("div", lambda x, y: x // y), _no_grad)
    if rounding_mode == "trunc":
        return _binary("div", a, b, _integer_safe("div", _truncated_division), _no_grad)
    raise RuntimeError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found "
                       f"{rounding_mode!r}")


def _no_grad(g, x, y, out):
    return _xp(g).zeros_like(g), _xp(g).zeros_like(g)


def _truncated_division(x, y):
    xp = _xp(x, y)
    if xp.result_type(x, y).kind in "iub":  # floor, then one up where the signs differ and something remains
        q = x // y
        return q + ((x % y != 0) & ((xp.asarray(x) < 0) != (xp.asarray(y) < 0)))
    return xp.trunc(x / y)


def pow(a, b) -> Tensor:
    def backward(g, x, y, out):
        xp = _xp(out, x, y)
        gx = gy = None
        with np.errstate(divide="ignore", invalid="ignore"):
            if isinstance(a, Tensor):
                # d/dx x**0 is 0 everywhere, also at x == 0 where y * x**(y-1) would be 0 * inf
                gx = xp.where(xp.asarray(y) == 0, 0, g * y * x ** (y - 1)).astype(g.dtype, copy=False)
            if isinstance(b, Tensor):
                # PyTorch's rule: 0 where the base is 0 and the exponent >= 0, else out * log(base)
                gy = xp.where((xp.asarray(x) == 0) & (xp.asarray(y) >= 0), 0,
                              g * out * xp.log(xp.asarray(x, dtype=out.dtype))).astype(g.dtype, copy=False)
        return gx, gy
    return _binary("pow", a, b, lambda x, y: x ** y, backward, derivative=(_pow_base_grad, _pow_exponent_grad))


def _pow_base_grad(g: Tensor, out: Tensor, x, y) -> Tensor:
    if isinstance(y, Tensor):
        return where(y == 0, 0.0, g * y * x ** (y - 1))
    return g * 0 if y == 0 else g * y * x ** (y - 1)


def _pow_exponent_grad(g: Tensor, out: Tensor, x, y) -> Tensor:
    # PyTorch's rule: 0 where the base is 0 and the exponent >= 0, else out * log(base)
    if not isinstance(x, Tensor):
        return g * out * math.log(x) if x != 0 else where(y >= 0, 0.0, g * out * -math.inf)
    return where((x == 0) & (y >= 0), 0.0, g * out * log(x))


def neg(x: Tensor) -> Tensor:
    return from_op(-x.data, (x,), lambda g: (-g,), "neg", lambda g, o: (-g,))


def floor_divide(a, b) -> Tensor:
    return _binary("floor_divide", a, b, _integer_safe("floor_divide", lambda x, y: x // y),
                   lambda g, x, y, o: (None, None))


def remainder(a, b) -> Tensor:
    # a % b = a - floor(a / b) * b
    return _binary("remainder", a, b, _integer_safe("remainder", lambda x, y: x % y),
                   lambda g, x, y, o: (g, -g * ((x - o) / y)))


def _integer_safe(name: str, forward):
    """forward, refusing an integer division by zero on the CPU as PyTorch does (NumPy answers 0 with a warning; on
    the GPU the check would cost a synchronisation, so it is not made there)."""
    def checked(x, y):
        arrays = [v for v in (x, y) if isinstance(v, np.ndarray)]
        if arrays and arrays[0].dtype.kind in "iub" and not np.all(y):
            raise ZeroDivisionError(f"{name}: integer division by zero")
        return forward(x, y)
    return checked


def _split_ties(g, x, y, wins):
    """Gradients of max/min(x, y): all of g to the winner, half each where they tie, and all of g to both where a
    NaN makes them unordered (as PyTorch)."""
    xp = _xp(g)
    half = (g * 0.5).astype(g.dtype, copy=False)
    gx = xp.where(x == y, half, xp.where(wins, g, 0)).astype(g.dtype, copy=False)
    unordered = (x != x) | (y != y)
    return xp.where(unordered, g, gx), xp.where(unordered, g, g - gx)


def maximum(a, b) -> Tensor:
    return _binary("maximum", a, b, lambda x, y: _xp(x, y).maximum(x, y),
                   lambda g, x, y, out: _split_ties(g, x, y, x > y))


def minimum(a, b) -> Tensor:
    return _binary("minimum", a, b, lambda x, y: _xp(x, y).minimum(x, y),
                   lambda g, x, y, out: _split_ties(g, x, y, x < y))


def _xp(*arrays):
    for a in arrays:
        if hasattr(a, "shape") and not isinstance(a, (np.ndarray, np.generic)):
            return cuda.cupy()
    return np


# ------------------------------------------------------------------ comparisons (no gradient)

def _compare(name: str, a, b, fn) -> Tensor:
    ta, tb, xa, xb, _ = _operands(a, b, name)
    return Tensor(fn(xa, xb))


def eq(a, b) -> Tensor: return _compare("eq", a, b, lambda x, y: x == y)
def ne(a, b) -> Tensor: return _compare("ne", a, b, lambda x, y: x != y)
def lt(a, b) -> Tensor: return _compare("lt", a, b, lambda x, y: x < y)
def le(a, b) -> Tensor: return _compare("le", a, b, lambda x, y: x <= y)
def gt(a, b) -> Tensor: return _compare("gt", a, b, lambda x, y: x > y)
def ge(a, b) -> Tensor: return _compare("ge", a, b, lambda x, y: x >= y)


def logical_not(x: Tensor) -> Tensor:
    return Tensor(x.xp.logical_not(x.data))


def _bitwise(name: str, a, b, fn) -> Tensor:
    """A bitwise op of bool or integer operands (on bools it is the logical one), in the promoted dtype."""
    ta, tb, xa, xb, dt = _operands(a, b, name)
    if dt.is_floating_point:
        raise TypeError(f"{name}: defined for bool and integer tensors only, got {_describe(a)} and {_describe(b)}")
    out = fn(xa, xb)
    return Tensor(out if out.dtype == dt.np else out.astype(dt.np))


def bitwise_and(a, b) -> Tensor: return _bitwise("bitwise_and", a, b, lambda x, y: _xp(x, y).bitwise_and(x, y))
def bitwise_or(a, b) -> Tensor: return _bitwise("bitwise_or", a, b, lambda x, y: _xp(x, y).bitwise_or(x, y))
def bitwise_xor(a, b) -> Tensor: return _bitwise("bitwise_xor", a, b, lambda x, y: _xp(x, y).bitwise_xor(x, y))


def bitwise_not(x: Tensor) -> Tensor:
    if x.dtype.is_floating_point:
        raise TypeError(f"bitwise_not: defined for bool and integer tensors only, got {_describe(x)}")
    return Tensor(x.xp.invert(x.data))


def logical_and(a, b) -> Tensor: return _compare("logical_and", a, b, lambda x, y: _xp(x, y).logical_and(x, y))
def logical_or(a, b) -> Tensor: return _compare("logical_or", a, b, lambda x, y: _xp(x, y).logical_or(x, y))


def isnan(x: Tensor) -> Tensor:
    return Tensor(x.xp.isnan(x.data))


def isfinite(x: Tensor) -> Tensor:
    return Tensor(x.xp.isfinite(x.data))


def allclose(a: Tensor, b: Tensor, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> bool:
    return bool(a.xp.allclose(a.data, b.data, rtol=rtol, atol=atol, equal_nan=equal_nan))


def isclose(a: Tensor, b: Tensor, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> Tensor:
    """|a - b| <= atol + rtol * |b| elementwise, broadcasting; a and b must share a dtype, as in PyTorch."""
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise TypeError(f"isclose: expected two Tensors, got {_describe(a)} and {_describe(b)}")
    if a.dtype != b.dtype:
        raise RuntimeError(f"isclose: expected both tensors to have the same dtype, got {a.dtype.name} and "
                           f"{b.dtype.name}")
    _operands(a, b, "isclose")  # the device and shape checks
    return Tensor(a.xp.isclose(a.data, b.data, rtol=rtol, atol=atol, equal_nan=equal_nan))


# ------------------------------------------------------------------ unary math

def exp(x: Tensor) -> Tensor:
    return _unary("exp", x, lambda a: x.xp.exp(a), lambda g, a, o: g * o, lambda g, o, x: g * o)


def log(x: Tensor) -> Tensor:
    return _unary("log", x, lambda a: x.xp.log(a), lambda g, a, o: g / a, lambda g, o, x: g / x)


def sqrt(x: Tensor) -> Tensor:
    return _unary("sqrt", x, lambda a: x.xp.sqrt(a), lambda g, a, o: g / (2 * o), lambda g, o, x: g / (o * 2))


def rsqrt(x: Tensor) -> Tensor:
    return _unary("rsqrt", x, lambda a: 1 / x.xp.sqrt(a), lambda g, a, o: -0.5 * g * o * o * o,
                  lambda g, o, x: g * o * o * o * -0.5)


def sin(x: Tensor) -> Tensor:
    return _unary("sin", x, lambda a: x.xp.sin(a), lambda g, a, o: g * x.xp.cos(a), lambda g, o, x: g * cos(x))


def cos(x: Tensor) -> Tensor:
    return _unary("cos", x, lambda a: x.xp.cos(a), lambda g, a, o: -g * x.xp.sin(a), lambda g, o, x: -g * sin(x))


def tanh(x: Tensor) -> Tensor:
    return _unary("tanh", x, lambda a: x.xp.tanh(a), lambda g, a, o: g * (1 - o * o), lambda g, o, x: g * (1 - o * o))


def _sigmoid_array(a):
    """1 / (1 + exp(-a)) without overflow and with full relative precision for large negative a."""
    xp = _xp(a)
    e = xp.exp(-xp.abs(a))  # in (0, 1]: never overflows
    return xp.where(a >= 0, 1 / (1 + e), e / (1 + e)).astype(a.dtype, copy=False)


def sigmoid(x: Tensor) -> Tensor:
    return _unary("sigmoid", x, _sigmoid_array, lambda g, a, o: g * o * (1 - o), lambda g, o, x: g * o * (1 - o))


def abs(x: Tensor) -> Tensor:
    return from_op(x.xp.abs(x.data), (x,), lambda g: (g * x.xp.sign(x.data),), "abs", lambda g, o: (g * sign(x),))


def sign(x: Tensor) -> Tensor:
    return from_op(x.xp.sign(x.data), (x,), lambda g: (g * 0,), "sign", lambda g, o: (g * 0,))


def sgn(x: Tensor) -> Tensor:
    """sign for real tensors (PyTorch's sgn differs only for complex ones, which Frost has not)."""
    return sign(x)


def copysign(a, b) -> Tensor:
    """|a| with the sign of b (of -0.0 too), in a floating dtype."""
    def backward(g, x, y, out):
        xp = _xp(g)
        # b's gradient is 0, not None, so that b.grad is a zero tensor as PyTorch's
        return xp.where(xp.asarray(x) == 0, 0, g * out / x).astype(g.dtype, copy=False), xp.zeros_like(g)
    return _binary("copysign", a, b, lambda x, y: _xp(x, y).copysign(x, y), backward, float_result=True)


def relu(x: Tensor) -> Tensor:
    xa = x.data
    # maximum, not xa * (xa > 0), which would turn negatives into -0.0
    return from_op(x.xp.maximum(xa, 0).astype(xa.dtype, copy=False), (x,),
                   lambda g: (x.xp.where(xa <= 0, 0, g).astype(g.dtype, copy=False),), "relu",
                   lambda g, o: (where(x <= 0, 0.0, g),))


def leaky_relu(x: Tensor, negative_slope: float = 0.01) -> Tensor:
    xa, xp = x.data, x.xp
    positive = xa > 0
    # the product in float32 for 16-bit types (as PyTorch; float16 would round the slope first), the result in
    # x's dtype (a bfloat16 array times a Python float is float32 in NumPy)
    out = xp.where(positive, xa, widened(xa) * negative_slope).astype(xa.dtype, copy=False)
    return from_op(out, (x,), lambda g: (xp.where(positive, g, widened(g) * negative_slope).astype(
        g.dtype, copy=False),), "leaky_relu", lambda g, o: (where(x > 0, g, g * negative_slope),))


def softplus(x: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    xp = x.xp

    def forward(a):
        z = beta * a
        return xp.where(z > threshold, a, xp.log1p(xp.exp(xp.minimum(z, threshold))) / beta).astype(a.dtype)

    def backward(g, a, o):
        z = beta * a
        return g * xp.where(z > threshold, 1, _sigmoid_array(z)).astype(a.dtype, copy=False)

    def derivative(g, o, x):
        z = x * beta
        return where(z > threshold, g, g * sigmoid(z))
    return _unary("softplus", x, forward, backward, derivative)


def silu(x: Tensor) -> Tensor:
    def backward(g, a, o):
        s = _sigmoid_array(a)
        return g * s * (1 + a * (1 - s))

    def derivative(g, o, x):
        s = sigmoid(x)
        return g * s * (1 + x * (1 - s))
    return _unary("silu", x, lambda a: a * _sigmoid_array(a), backward, derivative)


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


# erfc(z) = t * exp(-z^2 + P(t)), t = 1 / (1 + z/2), for z >= 0, with relative error below 1.2e-7
# everywhere (Numerical Recipes' Chebyshev fit): enough for float32, ten array ops instead of a Python call
_ERFC_COEFFS = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398,
                1.48851587, -0.82215223, 0.17087277)


def _erf_float32(a):
    xp = _xp(a)
    z = xp.abs(a.astype(np.float32, copy=False))
    t = 1 / (1 + 0.5 * z)
    poly = xp.full_like(z, _ERFC_COEFFS[-1])
    for c in reversed(_ERFC_COEFFS[:-1]):
        poly *= t
        poly += c
    poly -= z * z
    erfc = t * xp.exp(poly)
    return (xp.sign(a).astype(np.float32) * (1 - erfc)).astype(a.dtype, copy=False)


def erf_array(a):
    """The error function of an array (NumPy has none; CuPy's lives in cupyx.scipy.special).

    float64 gets the exact math.erf; lower precisions a fast vectorized fit (error below 1.2e-7).
    """
    if isinstance(a, (np.ndarray, np.generic)):  # a 0-d result of NumPy math may be a NumPy scalar
        a = np.asarray(a)
        if a.dtype == np.float64:
            return np.asarray(np.frompyfunc(math.erf, 1, 1)(a), dtype=a.dtype)
        return _erf_float32(a)
    from cupyx.scipy.special import erf
    return erf(a)


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """x * Phi(x) (or its tanh approximation). float16 and bfloat16 compute in float32 and round once, as PyTorch's:
    in float16, 1 + erf(x / sqrt(2)) loses the negative tail (gelu(-4) would be -0)."""
    xp = x.xp
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    derivative = _gelu_derivative(approximate)
    fast = dispatch.lookup("gelu", x, approximate=approximate)
    if fast is not None:
        return record_tensor_backward(fast(x, approximate), lambda g, o: (derivative(g, o, x),))

    def inner(a):  # the (1 + tanh(...)) or (1 + erf(...)) factor's argument and value, in float32 at least
        if approximate == "tanh":
            return xp.tanh(_SQRT_2_OVER_PI * (a + 0.044715 * (a * a * a)))  # a ** 3 is a slow NumPy power
        return erf_array(a / math.sqrt(2.0))

    def forward(a):
        w = widened(a)
        return (0.5 * w * (1 + inner(w))).astype(a.dtype, copy=False)

    def backward(g, a, o):
        w = widened(a)
        if approximate == "tanh":
            t = inner(w)
            slope = 0.5 * (1 + t) + 0.5 * w * (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * w * w)
        else:
            slope = 0.5 * (1 + inner(w)) + w * xp.exp(-0.5 * w * w) / math.sqrt(2 * math.pi)
        return (g.astype(w.dtype, copy=False) * slope).astype(a.dtype, copy=False)
    return _unary("gelu", x, forward, backward, derivative)


def _gelu_derivative(approximate: str):
    """gelu's slope on Tensors (what its backward multiplies g by), for the Tensor-level backward."""
    def derivative(g: Tensor, o: Tensor, x: Tensor) -> Tensor:
        if approximate == "tanh":
            t = tanh((x + x * x * x * 0.044715) * _SQRT_2_OVER_PI)
            return g * ((t + 1) * 0.5 + x * (1 - t * t) * (x * x * (3 * 0.044715) + 1) * (0.5 * _SQRT_2_OVER_PI))
        return g * ((erf(x / math.sqrt(2.0)) + 1) * 0.5 + x * exp(x * x * -0.5) / math.sqrt(2 * math.pi))
    return derivative


def clamp(x: Tensor, min=None, max=None) -> Tensor:
    if min is None and max is None:
        raise ValueError("clamp: at least one of min and max must be given")
    if isinstance(min, Tensor) or isinstance(max, Tensor):
        # PyTorch's rule: x gets the gradient where min <= x <= max (ties included), a bound where it is used
        out = x  # a NaN in x stays NaN (no comparison with it holds), as in PyTorch
        if min is not None:
            out = where(out < min, min, out)
        if max is not None:
            out = where(out > max, max, out)
        return out
    if not x.dtype.is_floating_point and any(isinstance(v, float) for v in (min, max)):
        x = cast(x, default_float_dtype())  # int tensor, float bound: the result is float, as in PyTorch
    xa = x.data
    out = x.xp.clip(xa, min, max).astype(xa.dtype, copy=False)  # bfloat16's clip answers in float32
    inside = xa == xa  # all True, same shape
    if min is not None:
        inside = inside & (xa >= min)
    if max is not None:
        inside = inside & (xa <= max)
    return from_op(out, (x,), lambda g: (g * inside,), "clamp", lambda g, o: (where(Tensor(inside), g, 0.0),))


def where(condition, a, b) -> Tensor:
    """Elementwise choice: a where condition is true, else b (all three broadcast)."""
    if not isinstance(condition, Tensor) or condition.dtype != "bool":
        raise TypeError(f"where: the condition must be a bool tensor, got {_describe(condition)} (compare, e.g. "
                        f"x > 0, or cast with .bool())")
    cond = condition.data
    for value, other in ((a, b), (b, a)):  # a number the result's integer type cannot hold: PyTorch refuses it
        if type(value) is int and isinstance(other, Tensor) and other.dtype.np.kind in "iu" and \
                _wrapped(value, scalar_result(other.dtype, value)) is not value:
            raise RuntimeError(f"where: the value {value} cannot be converted to {other.dtype} without overflow "
                               f"(the other value is {_describe(other)})")
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):  # two numbers: a 0-d tensor of the first's kind
        kind = default_float_dtype() if isinstance(a, float) else scalar_result(to_dtype("bool"), a)
        a = Tensor(condition.xp.asarray(a, dtype=kind.np))
    ta, tb, xa, xb, dt = _operands(a, b, "where")
    some = ta if ta is not None else tb
    dev = some.device
    if isinstance(condition, Tensor) and dev is not None and condition.device != dev:
        raise RuntimeError(f"where: condition is on {condition.device} but values are on {dev}")
    xp = _xp(cond, xa, xb)
    out = xp.where(cond, xa, xb)
    if out.dtype != dt.np:
        out = out.astype(dt.np)
    parents = [t for t in (ta, tb) if t is not None]

    def backward(g):
        grads = []
        zero = xp.zeros((), dtype=g.dtype)
        if ta is not None:
            grads.append(_cast(unbroadcast(xp.where(cond, g, zero), ta.shape), ta.dtype))
        if tb is not None:
            grads.append(_cast(unbroadcast(xp.where(cond, zero, g), tb.shape), tb.dtype))
        return grads

    def tensor_backward(g, o):
        return [sum_to(pick, t.shape).to(t.dtype) for pick, t in
                ((where(condition, g, 0.0), ta), (where(condition, 0.0, g), tb)) if t is not None]
    return from_op(out, parents, backward, "where", tensor_backward)


def masked_fill(x: Tensor, mask, value) -> Tensor:
    m = mask.data if isinstance(mask, Tensor) else mask
    xp = x.xp
    tensor_value = value if isinstance(value, Tensor) else None
    value = value.data if isinstance(value, Tensor) else value
    out = xp.where(m, xp.asarray(value, dtype=x.data.dtype), x.data)
    if out.shape != x.shape:
        raise RuntimeError(f"masked_fill: mask of shape {tuple(m.shape)} does not broadcast to the tensor's "
                           f"shape {x.shape}")

    def backward(g):
        gx = unbroadcast(xp.where(m, 0, g).astype(g.dtype), x.shape)
        if tensor_value is None:
            return (gx,)
        # the value fills every masked place (broadcast): its gradient is theirs, summed (as PyTorch)
        return gx, _cast(unbroadcast(xp.where(m, g, 0), tensor_value.shape), tensor_value.dtype)

    def tensor_backward(g, o):
        mask = Tensor(m)
        gv = None if tensor_value is None else sum_to(where(mask, g, 0.0), tensor_value.shape).to(tensor_value.dtype)
        return where(mask, 0.0, g), gv
    return from_op(out, (x,) if tensor_value is None else (x, tensor_value), backward, "masked_fill", tensor_backward)


# ------------------------------------------------------------------ dtype and device moves

def converted(a, dtype):
    """Array a in dtype (a NumPy dtype): the acceleration layer's cast where one registers for it, else astype."""
    fast = dispatch.lookup("cast", a, dtype=dtype)
    return fast(a, dtype) if fast is not None else a.astype(dtype)


def cast(x: Tensor, dtype: DType, out=None) -> Tensor:
    """x in dtype; `out`: x's values already in dtype (autocast's view of a whole flat buffer cast at once)."""
    dtype = to_dtype(dtype)
    if x.dtype == dtype:
        return x
    src = x.data.dtype
    out = converted(x.data, dtype.np) if out is None else out
    if not dtype.is_floating_point:
        return Tensor(out)

    def backward(g):
        # autocast's weight casts: the float32 gradient goes straight into the parameter's zeroed .grad buffer
        dest = grad_destination(x)
        if dest is None:  # (also when g is already x's float32 gradient, which conv2d wrote into x's .grad)
            return (g if g.dtype == src else converted(g, src),)
        dest[...] = g
        return (dest,)

    return from_op(out, (x,), backward, "cast", lambda g, o: (cast(g, x.dtype),))


def to_device(x: Tensor, device) -> Tensor:
    if x.device == device:
        return x
    src = x.device
    out = backend.to_device(x.data, device)
    return from_op(out, (x,), lambda g: (backend.to_device(g, src),), "to_device", lambda g, o: (to_device(g, src),))


# ------------------------------------------------------------------ more unary math

def log1p(x: Tensor) -> Tensor:
    return _unary("log1p", x, lambda a: x.xp.log1p(a), lambda g, a, o: g / (1 + a), lambda g, o, x: g / (x + 1))


def expm1(x: Tensor) -> Tensor:
    return _unary("expm1", x, lambda a: x.xp.expm1(a), lambda g, a, o: g * (o + 1), lambda g, o, x: g * (o + 1))


def reciprocal(x: Tensor) -> Tensor:
    return _unary("reciprocal", x, lambda a: 1 / a, lambda g, a, o: -g * o * o, lambda g, o, x: -g * o * o)


def erf(x: Tensor) -> Tensor:
    two_over_sqrt_pi = 2.0 / math.sqrt(math.pi)
    return _unary("erf", x, erf_array, lambda g, a, o: g * two_over_sqrt_pi * x.xp.exp(-a * a),
                  lambda g, o, x: g * exp(x * x * -1) * two_over_sqrt_pi)


def _rounding(name: str, x: Tensor, fn) -> Tensor:
    # piecewise constant: the gradient is zero almost everywhere, as in PyTorch
    if not x.dtype.is_floating_point:
        return Tensor(x.data.copy())  # a new tensor, as PyTorch's: changing it leaves x
    return from_op(fn(x.data), (x,), lambda g: (g * 0,), name, lambda g, o: (g * 0,))


def floor(x: Tensor) -> Tensor:
    return _rounding("floor", x, x.xp.floor)


def ceil(x: Tensor) -> Tensor:
    return _rounding("ceil", x, x.xp.ceil)


def round(x: Tensor) -> Tensor:
    """Round half to even, as PyTorch (and NumPy) do."""
    return _rounding("round", x, x.xp.round)
