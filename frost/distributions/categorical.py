"""The categorical distribution over K classes, given by probabilities or by logits (the last dimension)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from frost.distributions.distribution import Distribution
from frost.ops.elementwise import clamp
from frost.ops.reduce import logsumexp, softmax
from frost.ops.sampling import multinomial
from frost.ops.shape import expand, gather
from frost.tensor import Tensor

__all__ = ["Categorical"]


class Categorical(Distribution):
    """Categorical(probs=...) (non-negative, normalized along the last dimension) or Categorical(logits=...)
    (unnormalized log-probabilities): one of the two. Samples are int64 class indices of batch_shape."""

    def __init__(self, probs: Tensor | None = None, logits: Tensor | None = None,
                 validate_args: bool | None = None) -> None:
        if (probs is None) == (logits is None):
            raise ValueError("Categorical: give either probs or logits, not both and not neither")
        given = probs if probs is not None else logits
        if not isinstance(given, Tensor) or given.ndim < 1 or not given.dtype.is_floating_point:
            raise ValueError(f"Categorical: {'probs' if probs is not None else 'logits'} must be a floating-point "
                             f"tensor with at least one dimension, got {_describe(given)}")
        super().__init__(given.shape[:-1], validate_args=validate_args)
        self._num_events = given.shape[-1]
        if probs is not None:
            self._check("probs", probs, lambda a: (a >= 0) & (a < np.inf), "Simplex()")
            self.probs = probs / probs.sum(-1, keepdim=True)
            eps = float(np.finfo(probs.dtype.np).eps)
            self.logits = clamp(self.probs, eps, 1 - eps).log()
        else:
            self._check("logits", logits, lambda a: a == a, "IndependentConstraint(Real(), 1)")
            self.logits = logits - logsumexp(logits, -1, keepdim=True)
            self.probs = softmax(self.logits, -1)

    def _param_names(self) -> tuple[str, ...]:
        return ("probs",)

    @property
    def param_shape(self) -> tuple:
        return self.probs.shape

    def sample(self, sample_shape: Sequence[int] | int = ()) -> Tensor:
        shape = self._extended_shape(sample_shape)
        n = int(np.prod(shape[:len(shape) - len(self.batch_shape)]))
        if n == 0:
            return Tensor(self.probs.xp.zeros(shape, dtype=np.int64))
        draws = multinomial(self.probs.detach().reshape(-1, self._num_events), n, True)  # (batch, n)
        return draws.T.reshape(shape)

    def log_prob(self, value: Any) -> Tensor:
        value = self._value(value, self.logits).long()
        self._check("value", value, lambda a: (a >= 0) & (a < self._num_events), f"IntegerInterval(0, "
                    f"{self._num_events - 1})")
        shape = np.broadcast_shapes(value.shape, self.batch_shape)
        index = expand(value, shape).unsqueeze(-1)
        log_pmf = expand(self.logits, shape + (self._num_events,))
        return gather(log_pmf, -1, index.contiguous()).squeeze(-1)

    def entropy(self) -> Tensor:
        """-sum p log p, with logits of -inf (p = 0) counted as the dtype's lowest number so that 0 * log 0 is 0."""
        lowest = float(np.finfo(self.logits.dtype.np).min)
        return -(clamp(self.logits, lowest) * self.probs).sum(-1)

    def enumerate_support(self) -> Tensor:
        """The classes 0..K-1 along a new first dimension, expanded to batch_shape."""
        values = Tensor(self.probs.xp.arange(self._num_events, dtype=np.int64))
        return values.reshape((-1,) + (1,) * len(self.batch_shape)).expand(self._num_events, *self.batch_shape)

    @property
    def mean(self) -> Tensor:
        return Tensor(self.probs.xp.full(self.batch_shape, np.nan, dtype=self.probs.data.dtype))

    @property
    def mode(self) -> Tensor:
        return self.probs.argmax(-1)


def _describe(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"a tensor of {value.dtype} and shape {value.shape}"
    return type(value).__name__
