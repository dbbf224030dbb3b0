"""The continuous uniform distribution on [low, high), with a reparameterized (differentiable) sample."""
from __future__ import annotations

from typing import Any, Sequence

from frost.autograd import no_grad
from frost.distributions.distribution import Distribution, broadcast_all
from frost.ops.elementwise import clamp
from frost.ops.draws import rand
from frost.tensor import Tensor

__all__ = ["Uniform"]


class Uniform(Distribution):
    """Uniform(low, high) with low < high (tensors or numbers that broadcast together)."""

    has_rsample = True

    def __init__(self, low: Tensor | float, high: Tensor | float, validate_args: bool | None = None) -> None:
        self.low, self.high = broadcast_all(low, high)
        super().__init__(self.low.shape, validate_args=validate_args)
        self._check("low", self.low, lambda a: a < self.high.detach().data, "LessThan(high)")

    def _param_names(self) -> tuple[str, ...]:
        return ("low", "high")

    @property
    def mean(self) -> Tensor:
        return (self.high + self.low) / 2

    @property
    def variance(self) -> Tensor:
        return (self.high - self.low) ** 2 / 12

    def rsample(self, sample_shape: Sequence[int] | int = ()) -> Tensor:
        u = rand(self._extended_shape(sample_shape), dtype=self.low.dtype, device=self.low.device)
        return self.low + u * (self.high - self.low)

    def sample(self, sample_shape: Sequence[int] | int = ()) -> Tensor:
        with no_grad():
            return self.rsample(sample_shape)

    def log_prob(self, value: Any) -> Tensor:
        """-log(high - low) inside [low, high), -inf outside."""
        value = self._value(value, self.low)
        inside = ((self.low <= value) & (self.high > value)).to(self.low.dtype)
        return inside.log() - (self.high - self.low).log()

    def cdf(self, value: Any) -> Tensor:
        value = self._value(value, self.low)
        return clamp((value - self.low) / (self.high - self.low), 0, 1)

    def icdf(self, value: Any) -> Tensor:
        value = self._value(value, self.low)
        return value * (self.high - self.low) + self.low

    def entropy(self) -> Tensor:
        return (self.high - self.low).log()
