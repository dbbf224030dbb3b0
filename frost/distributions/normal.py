"""The normal distribution N(loc, scale^2), with a reparameterized (differentiable) sample."""
from __future__ import annotations

import math
from typing import Any, Sequence

from frost.autograd import no_grad
from frost.distributions.distribution import Distribution, broadcast_all
from frost.ops.elementwise import erf
from frost.ops.draws import randn
from frost.tensor import Tensor

__all__ = ["Normal"]

_LOG_SQRT_2PI = math.log(math.sqrt(2 * math.pi))


class Normal(Distribution):
    """Normal(loc, scale): loc and scale (> 0) are tensors or numbers that broadcast together."""

    has_rsample = True

    def __init__(self, loc: Tensor | float, scale: Tensor | float, validate_args: bool | None = None) -> None:
        self.loc, self.scale = broadcast_all(loc, scale)
        if not self.loc.dtype.is_floating_point:
            raise TypeError(f"Normal: loc and scale must be floating point, got {self.loc.dtype}")
        super().__init__(self.loc.shape, validate_args=validate_args)
        self._check("loc", self.loc, lambda a: a == a, "Real()")
        self._check("scale", self.scale, lambda a: a > 0, "GreaterThan(lower_bound=0.0)")

    def _param_names(self) -> tuple[str, ...]:
        return ("loc", "scale")

    @property
    def mean(self) -> Tensor:
        return self.loc

    @property
    def mode(self) -> Tensor:
        return self.loc

    @property
    def stddev(self) -> Tensor:
        return self.scale

    @property
    def variance(self) -> Tensor:
        return self.scale * self.scale

    def rsample(self, sample_shape: Sequence[int] | int = ()) -> Tensor:
        """loc + scale * eps with eps ~ N(0, 1): the gradient flows to loc and scale."""
        eps = randn(self._extended_shape(sample_shape), dtype=self.loc.dtype, device=self.loc.device)
        return self.loc + eps * self.scale

    def sample(self, sample_shape: Sequence[int] | int = ()) -> Tensor:
        with no_grad():
            return self.rsample(sample_shape)

    def log_prob(self, value: Any) -> Tensor:
        value = self._value(value, self.loc)
        self._check("value", value, lambda a: a == a, "Real()")
        return -((value - self.loc) ** 2) / (2 * self.variance) - self.scale.log() - _LOG_SQRT_2PI

    def cdf(self, value: Any) -> Tensor:
        value = self._value(value, self.loc)
        return 0.5 * (1 + erf((value - self.loc) * self.scale.reciprocal() / math.sqrt(2)))

    def entropy(self) -> Tensor:
        return 0.5 + _LOG_SQRT_2PI + self.scale.log()

