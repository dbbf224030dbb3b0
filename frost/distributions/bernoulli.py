"""The Bernoulli distribution over {0, 1}, given by the probability of 1 or by its logit."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from frost.autograd import no_grad
from frost.distributions.distribution import Distribution, broadcast_all
from frost.ops.elementwise import clamp, sigmoid
from frost.ops.sampling import bernoulli
from frost.tensor import Tensor

__all__ = ["Bernoulli"]


class Bernoulli(Distribution):
    """Bernoulli(probs=...) (in [0, 1]) or Bernoulli(logits=...): one of the two; samples are 0./1. floats."""

    def __init__(self, probs: Tensor | float | None = None, logits: Tensor | float | None = None,
                 validate_args: bool | None = None) -> None:
        if (probs is None) == (logits is None):
            raise ValueError("Bernoulli: give either probs or logits, not both and not neither")
        if probs is not None:
            (self.probs,) = broadcast_all(probs)
            super().__init__(self.probs.shape, validate_args=validate_args)
            self._check("probs", self.probs, lambda a: (a >= 0) & (a <= 1), "Interval(lower_bound=0.0, "
                        "upper_bound=1.0)")
            eps = float(np.finfo(self.probs.dtype.np).eps)
            clamped = clamp(self.probs, eps, 1 - eps)
            self.logits = clamped.log() - (-clamped).log1p()
        else:
            (self.logits,) = broadcast_all(logits)
            super().__init__(self.logits.shape, validate_args=validate_args)
            self._check("logits", self.logits, lambda a: a == a, "Real()")
            self.probs = sigmoid(self.logits)

    def _param_names(self) -> tuple[str, ...]:
        return ("probs",)

    @property
    def mean(self) -> Tensor:
        return self.probs

    @property
    def variance(self) -> Tensor:
        return self.probs * (1 - self.probs)

    def sample(self, sample_shape: Sequence[int] | int = ()) -> Tensor:
        with no_grad():
            return bernoulli(self.probs.expand(*self._extended_shape(sample_shape)).contiguous())

    def log_prob(self, value: Any) -> Tensor:
        value = self._value(value, self.logits)
        self._check("value", value, lambda a: (a == 0) | (a == 1), "Boolean()")
        return -_bce_with_logits(self.logits, value)

    def entropy(self) -> Tensor:
        return _bce_with_logits(self.logits, self.probs)


def _bce_with_logits(logits: Tensor, target: Tensor) -> Tensor:
    """-(t log sigmoid(l) + (1 - t) log(1 - sigmoid(l))), as max(l, 0) - l t + log(1 + exp(-|l|)) (no overflow)."""
    return clamp(logits, 0) - logits * target + (-logits.abs()).exp().log1p()
