"""More activations (elu, selu, celu, mish, hard*, relu6, logsigmoid, softsign, tanhshrink, glu, prelu), forward and
backward together, with PyTorch's values and gradients (also at the kinks: the side PyTorch takes is noted)."""
from __future__ import annotations


from frost.autograd import unbroadcast
from frost.ops.elementwise import _describe, _quiet, _sigmoid_array, _unary
from frost.ops.reduce import normalize_dim
from frost.tensor import Tensor, from_op

# SELU's constants (Klambauer et al., 2017), to the digits PyTorch uses
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


def _check_tensor(name: str, x) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a Tensor, got {type(x).__name__}")


def _exponential_linear(name: str, x: Tensor, alpha: float, scale: float, input_scale: float) -> Tensor:
    """scale * (x for x > 0, else alpha * (exp(x * input_scale) - 1)): elu, selu and celu are this one curve. At 0
    the gradient is the exponential side's, as PyTorch's."""
    _check_tensor(name, x)
    xp = x.xp

    def forward(a):
        negative = alpha * xp.expm1(a * input_scale)
        return (scale * xp.where(a > 0, a, negative)).astype(a.dtype, copy=False)

    def backward(g, a, o):
        slope = xp.where(a > 0, scale, scale * alpha * input_scale * xp.exp(a * input_scale))
        return (g * slope).astype(g.dtype, copy=False)
    return _unary(name, x, forward, backward)


def elu(x: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """x for x > 0, alpha * (exp(x) - 1) otherwise. `inplace` is accepted for PyTorch's signature (the result is
    a new tensor; frost records no in-place op)."""
    return _exponential_linear("elu", x, alpha, 1.0, 1.0)


def selu(x: Tensor, inplace: bool = False) -> Tensor:
    """SELU_SCALE * elu(x, SELU_ALPHA): self-normalizing for standardized inputs."""
    return _exponential_linear("selu", x, SELU_ALPHA, SELU_SCALE, 1.0)


def celu(x: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
    if alpha == 0:
        raise ValueError(f"celu: alpha must be nonzero (the exponent divides by it), got {alpha} for input "
                         f"{_describe(x)}")
    return _exponential_linear("celu", x, alpha, 1.0, 1.0 / alpha)


def _softplus_array(xp, a):
    """log(1 + exp(a)) without overflow."""
    return xp.maximum(a, 0) + xp.log1p(xp.exp(-xp.abs(a)))


def mish(x: Tensor, inplace: bool = False) -> Tensor:
    """x * tanh(softplus(x))."""
    _check_tensor("mish", x)
    xp = x.xp

    def backward(g, a, o):
        t = xp.tanh(_softplus_array(xp, a))
        return (g * (t + a * _sigmoid_array(a) * (1 - t * t))).astype(g.dtype, copy=False)
    return _unary("mish", x, lambda a: (a * xp.tanh(_softplus_array(xp, a))).astype(a.dtype, copy=False), backward)


def hardsigmoid(x: Tensor, inplace: bool = False) -> Tensor:
    """relu6(x + 3) / 6; the gradient is 1/6 strictly inside (-3, 3), else 0, as PyTorch's."""
    _check_tensor("hardsigmoid", x)
    xp = x.xp

    def backward(g, a, o):
        return xp.where((a > -3) & (a < 3), g / 6, 0).astype(g.dtype, copy=False)
    return _unary("hardsigmoid", x, lambda a: (xp.clip(a + 3, 0, 6) / 6).astype(a.dtype, copy=False), backward)


def hardswish(x: Tensor, inplace: bool = False) -> Tensor:
    """x * relu6(x + 3) / 6; the gradient is x / 3 + 1/2 inside (-3, 3), 0 at -3 and 1 at 3, as PyTorch's."""
    _check_tensor("hardswish", x)
    xp = x.xp

    def backward(g, a, o):
        slope = xp.where(a <= -3, 0, xp.where(a < 3, a / 3 + 0.5, 1))
        return (g * slope).astype(g.dtype, copy=False)
    return _unary("hardswish", x, lambda a: (a * xp.clip(a + 3, 0, 6) / 6).astype(a.dtype, copy=False), backward)


def hardtanh(x: Tensor, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Tensor:
    """x clamped to [min_val, max_val]; the gradient is 0 at the bounds themselves, as PyTorch's (clamp's is 1)."""
    _check_tensor("hardtanh", x)
    if min_val > max_val:
        raise ValueError(f"hardtanh: min_val ({min_val}) must not be greater than max_val ({max_val})")
    xp = x.xp

    def backward(g, a, o):
        return xp.where((a > min_val) & (a < max_val), g, 0).astype(g.dtype, copy=False)
    return _unary("hardtanh", x, lambda a: xp.clip(a, min_val, max_val).astype(a.dtype, copy=False), backward)


def relu6(x: Tensor, inplace: bool = False) -> Tensor:
    """min(max(x, 0), 6): hardtanh(x, 0, 6), so the gradient is 0 at 0 and at 6, as PyTorch's."""
    return hardtanh(x, 0.0, 6.0)


def logsigmoid(x: Tensor) -> Tensor:
    """log(sigmoid(x)) = min(x, 0) - log(1 + exp(-|x|)), which neither overflows nor loses the tail."""
    _check_tensor("logsigmoid", x)
    xp = x.xp

    def forward(a):
        return (xp.minimum(a, 0) - xp.log1p(xp.exp(-xp.abs(a)))).astype(a.dtype, copy=False)
    return _unary("logsigmoid", x, forward, lambda g, a, o: (g * _sigmoid_array(-a)).astype(g.dtype, copy=False))


def softsign(x: Tensor) -> Tensor:
    """x / (1 + |x|)."""
    _check_tensor("softsign", x)
    xp = x.xp

    def backward(g, a, o):
        d = 1 + xp.abs(a)
        return (g / (d * d)).astype(g.dtype, copy=False)
    return _unary("softsign", x, lambda a: (a / (1 + xp.abs(a))).astype(a.dtype, copy=False), backward)


def tanhshrink(x: Tensor) -> Tensor:
    """x - tanh(x)."""
    _check_tensor("tanhshrink", x)
    xp = x.xp

    def backward(g, a, o):
        t = xp.tanh(a)
        return (g * t * t).astype(g.dtype, copy=False)
    return _unary("tanhshrink", x, lambda a: (a - xp.tanh(a)).astype(a.dtype, copy=False), backward)


def glu(x: Tensor, dim: int = -1) -> Tensor:
    """a * sigmoid(b), where a and b are the first and second halves of x along `dim`."""
    _check_tensor("glu", x)
    if x.ndim == 0:
        raise RuntimeError("glu: does not support 0-d (scalar) tensors")
    if not x.dtype.is_floating_point:
        raise TypeError(f"glu: needs a floating-point tensor, got {_describe(x)}")
    axis = normalize_dim(dim, x.ndim, "glu")
    size = x.shape[axis]
    if size % 2:
        raise RuntimeError(f"glu: halving dimension must be even, but dimension {axis} is size {size} (input of "
                           f"shape {x.shape})")
    xp = x.xp
    a, b = xp.split(x.data, 2, axis=axis)
    s = _sigmoid_array(b)
    out = a * s

    def backward(g):
        with _quiet():
            return (xp.concatenate([g * s, g * out * (1 - s)], axis=axis),)
    return from_op(out, (x,), backward, "glu")


def prelu(x: Tensor, weight: Tensor) -> Tensor:
    """x for x > 0, weight * x otherwise; weight has one element, or one per channel (x's dim 1)."""
    _check_tensor("prelu", x)
    _check_tensor("prelu", weight)
    _check_prelu_weight(x, weight)
    xp = x.xp
    # the weight as an array that broadcasts along x's channel dim
    w = weight.data.reshape(()) if weight.data.size == 1 else weight.data.reshape((-1,) + (1,) * (x.ndim - 2))
    positive = x.data > 0
    out = xp.where(positive, x.data, w * x.data).astype(x.data.dtype, copy=False)

    def backward(g):
        gx = xp.where(positive, g, w * g).astype(x.data.dtype, copy=False)
        gw_full = xp.where(positive, 0, g * x.data)
        gw = gw_full.sum() if weight.data.size == 1 else unbroadcast(gw_full, (1,) + w.shape).reshape(-1)
        return gx, xp.asarray(gw).reshape(weight.shape).astype(weight.data.dtype, copy=False)
    return from_op(out, (x, weight), backward, "prelu")


def _check_prelu_weight(x: Tensor, weight: Tensor) -> None:
    if x.device != weight.device:
        raise RuntimeError(f"prelu: input {_describe(x)} and weight {_describe(weight)} are on different devices")
    if weight.ndim > 1:
        raise RuntimeError(f"prelu: weight must be 1-D or 0-d, got shape {weight.shape}")
    count = weight.numel()
    if count == 1:
        return
    if x.ndim == 0:
        raise RuntimeError(f"prelu: a 0-d input takes a one-element weight, got weight of shape {weight.shape}")
    channels = x.shape[1] if x.ndim >= 2 else 1
    if count != channels:
        raise RuntimeError(f"prelu: the weight's {count} parameters do not match the input's {channels} channels "
                           f"(input of shape {x.shape}, weight of shape {weight.shape}; the channel dim is 1)")
