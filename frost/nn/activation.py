"""Activation layers: ReLU, GELU, SiLU, Sigmoid, Tanh, LeakyReLU, Softplus, Softmax, LogSoftmax, and ELU, SELU, CELU,
Mish, Hardswish, Hardsigmoid, Hardtanh, ReLU6, LogSigmoid, Softsign, Tanhshrink, GLU, PReLU."""
from __future__ import annotations

import warnings
from typing import Callable

from frost.autograd import is_grad_enabled
from frost.nn.module import Module, Parameter
from frost.ops import activation, elementwise
from frost.ops.reduce import log_softmax, softmax
from frost.tensor import Tensor, full


def apply_inplace(op: Callable[[Tensor], Tensor], x: Tensor, inplace: bool) -> Tensor:
    """op(x); with inplace=True written into x and x returned, as PyTorch's inplace layers, when x needs no gradient
    (inference, frost.no_grad()). The write goes through copy_, which bumps x's version (a backward that saved x's
    old values then refuses to run, as PyTorch's) and drops what was cached about x's values.

    When x needs a gradient (grad mode on and x.requires_grad) the result is a new tensor and x keeps its values:
    frost records no in-place op on the tape, and the out-of-place result has the right gradient. (PyTorch would
    overwrite a non-leaf x and rebase its history, and refuses a leaf.)"""
    result = op(x)
    if not inplace or result is x or (is_grad_enabled() and x.requires_grad):
        return result
    return x.copy_(result)


class ReLU(Module):
    """max(x, 0). inplace=True overwrites and returns x unless x needs a gradient (see apply_inplace)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, x: Tensor) -> Tensor:
        return apply_inplace(elementwise.relu, x, self.inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class GELU(Module):
    """x * Phi(x); approximate='tanh' uses the tanh approximation."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        return elementwise.gelu(x, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class SiLU(Module):
    """x * sigmoid(x). inplace=True overwrites and returns x unless x needs a gradient (see apply_inplace)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, x: Tensor) -> Tensor:
        return apply_inplace(elementwise.silu, x, self.inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class Sigmoid(Module):
    def forward(self, x: Tensor) -> Tensor:
        return elementwise.sigmoid(x)


class Tanh(Module):
    def forward(self, x: Tensor) -> Tensor:
        return elementwise.tanh(x)


class LeakyReLU(Module):
    """x for x > 0, negative_slope * x otherwise.

    inplace=True overwrites and returns x unless x needs a gradient (see apply_inplace).
    """

    def __init__(self, negative_slope: float = 0.01, inplace: bool = False) -> None:
        super().__init__()
        self.negative_slope = negative_slope
        self.inplace = inplace

    def forward(self, x: Tensor) -> Tensor:
        return apply_inplace(lambda t: elementwise.leaky_relu(t, self.negative_slope), x, self.inplace)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}" + (", inplace=True" if self.inplace else "")


class Softplus(Module):
    """log(1 + exp(beta * x)) / beta, linear above `threshold`."""

    def __init__(self, beta: float = 1.0, threshold: float = 20.0) -> None:
        super().__init__()
        self.beta = beta
        self.threshold = threshold

    def forward(self, x: Tensor) -> Tensor:
        return elementwise.softplus(x, self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"


def _implicit_dim(ndim: int, name: str) -> int:
    warnings.warn(f"Implicit dimension choice for {name} has been deprecated. Change the call to include dim=X "
                  f"as an argument.", stacklevel=3)
    return 0 if ndim in (0, 1, 3) else 1


class Softmax(Module):
    """exp(x) / sum(exp(x)) along `dim`."""

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        dim = self.dim if self.dim is not None else _implicit_dim(x.ndim, "softmax")
        return softmax(x, dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(Module):
    """log(softmax(x)) along `dim`, computed stably."""

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        dim = self.dim if self.dim is not None else _implicit_dim(x.ndim, "log_softmax")
        return log_softmax(x, dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class _InplaceActivation(Module):
    """An element-wise activation `op` with PyTorch's inplace flag (see apply_inplace)."""

    op: Callable[[Tensor], Tensor]

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, x: Tensor) -> Tensor:
        return apply_inplace(self.op, x, self.inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class ELU(_InplaceActivation):
    """x for x > 0, alpha * (exp(x) - 1) otherwise."""

    def __init__(self, alpha: float = 1.0, inplace: bool = False) -> None:
        super().__init__(inplace)
        self.alpha = alpha

    def op(self, x: Tensor) -> Tensor:
        return activation.elu(x, self.alpha)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}" + (", inplace=True" if self.inplace else "")


class CELU(ELU):
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""

    def op(self, x: Tensor) -> Tensor:
        return activation.celu(x, self.alpha)


class SELU(_InplaceActivation):
    """scale * elu(x, alpha) with the self-normalizing constants."""
    op = staticmethod(activation.selu)


class Mish(_InplaceActivation):
    """x * tanh(softplus(x))."""
    op = staticmethod(activation.mish)


class Hardswish(_InplaceActivation):
    """x * relu6(x + 3) / 6."""
    op = staticmethod(activation.hardswish)


class Hardsigmoid(_InplaceActivation):
    """relu6(x + 3) / 6."""
    op = staticmethod(activation.hardsigmoid)


class ReLU6(_InplaceActivation):
    """min(max(x, 0), 6)."""
    op = staticmethod(activation.relu6)


class Hardtanh(_InplaceActivation):
    """x clamped to [min_val, max_val]."""

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> None:
        super().__init__(inplace)
        if min_val > max_val:
            raise ValueError(f"Hardtanh: min_val ({min_val}) must not be greater than max_val ({max_val})")
        self.min_val = min_val
        self.max_val = max_val

    def op(self, x: Tensor) -> Tensor:
        return activation.hardtanh(x, self.min_val, self.max_val)

    def extra_repr(self) -> str:
        return f"min_val={self.min_val}, max_val={self.max_val}" + (", inplace=True" if self.inplace else "")


class LogSigmoid(Module):
    def forward(self, x: Tensor) -> Tensor:
        return activation.logsigmoid(x)


class Softsign(Module):
    def forward(self, x: Tensor) -> Tensor:
        return activation.softsign(x)


class Tanhshrink(Module):
    def forward(self, x: Tensor) -> Tensor:
        return activation.tanhshrink(x)


class GLU(Module):
    """a * sigmoid(b) of the two halves of x along `dim`."""

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return activation.glu(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class PReLU(Module):
    """x for x > 0, a * x otherwise, with a learned slope a: one shared, or one per channel (num_parameters)."""

    def __init__(self, num_parameters: int = 1, init: float = 0.25, device=None, dtype=None) -> None:
        super().__init__()
        if num_parameters < 1:
            raise ValueError(f"PReLU: num_parameters must be at least 1, got {num_parameters}")
        self.num_parameters = num_parameters
        self.init = init
        self.weight = Parameter(full((num_parameters,), float(init), dtype=dtype, device=device))

    def forward(self, x: Tensor) -> Tensor:
        return activation.prelu(x, self.weight)

    def extra_repr(self) -> str:
        return f"num_parameters={self.num_parameters}"
