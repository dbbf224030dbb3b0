"""The base of Frost's probability distributions (as torch.distributions.Distribution): shapes, argument checks, and
the helpers the distributions share."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from frost.dtype import default_float_dtype
from frost.ops.shape import expand
from frost.tensor import Tensor, can_read_values, tensor

__all__ = ["Distribution", "broadcast_all"]


class Distribution:
    """A batch of distributions of `batch_shape`, each over events of `event_shape`.

    validate_args (True by default, as PyTorch's) checks the parameters when the distribution is made and the
    values given to log_prob / cdf; set Distribution.set_default_validate_args(False) to skip the checks' host
    reads."""

    has_rsample = False
    _validate_default = True

    def __init__(self, batch_shape: Sequence[int] = (), event_shape: Sequence[int] = (),
                 validate_args: bool | None = None) -> None:
        self.batch_shape = tuple(batch_shape)
        self.event_shape = tuple(event_shape)
        self._validate_args = self._validate_default if validate_args is None else bool(validate_args)

    @classmethod
    def set_default_validate_args(cls, value: bool) -> None:
        Distribution._validate_default = bool(value)

    def __repr__(self) -> str:
        params = ", ".join(f"{name}: {tuple(getattr(self, name).shape)}" for name in self._param_names()
                           if hasattr(self, name))  # a check fails before every parameter is set
        return f"{type(self).__name__}({params})"

    def _param_names(self) -> tuple[str, ...]:
        return ()

    # shapes and draws
    def _extended_shape(self, sample_shape: Sequence[int] | int = ()) -> tuple:
        sample_shape = (sample_shape,) if isinstance(sample_shape, int) else tuple(sample_shape)
        return sample_shape + self.batch_shape + self.event_shape

    def sample(self, sample_shape: Sequence[int] | int = ()) -> Tensor:
        """Draws of shape sample_shape + batch_shape + event_shape, without gradient."""
        return self.rsample(sample_shape).detach()

    def rsample(self, sample_shape: Sequence[int] | int = ()) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no reparameterized sample (rsample); use sample()")

    def log_prob(self, value: Tensor) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__}.log_prob is not implemented")

    def entropy(self) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__}.entropy is not implemented")

    def cdf(self, value: Tensor) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__}.cdf is not implemented")

    def perplexity(self) -> Tensor:
        return self.entropy().exp()

    @property
    def mean(self) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__}.mean is not implemented")

    @property
    def variance(self) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__}.variance is not implemented")

    @property
    def stddev(self) -> Tensor:
        return self.variance.sqrt()

    # checks
    def _check(self, name: str, value: Tensor, holds, constraint: str) -> None:
        """Raise a ValueError naming the distribution, the argument and the constraint where `holds(array)` fails
        somewhere (skipped without validate_args, and on a GPU while a CUDA graph is captured)."""
        if not self._validate_args or not can_read_values(value):
            return
        with np.errstate(invalid="ignore"):
            ok = bool(holds(value.detach().data).all())
        if not ok:
            raise ValueError(f"Expected parameter {name} (Tensor of shape {value.shape}) of distribution {self!r} "
                             f"to satisfy the constraint {constraint}, but found invalid values")

    def _value(self, value: Any, like: Tensor) -> Tensor:
        """value as a tensor (a number becomes one of like's dtype and device)."""
        return value if isinstance(value, Tensor) else tensor(value, dtype=like.dtype, device=like.device)


def broadcast_all(*values: Any) -> tuple[Tensor, ...]:
    """Tensors and numbers as tensors of one broadcast shape; numbers take the first tensor's dtype and device (the
    default float dtype on the CPU when all are numbers)."""
    tensors = [v for v in values if isinstance(v, Tensor)]
    for v in values:
        if not isinstance(v, (Tensor, int, float)) or isinstance(v, bool):
            raise TypeError(f"distribution parameters must be tensors or numbers, got {type(v).__name__}")
    dtype = tensors[0].dtype if tensors else default_float_dtype()
    device = tensors[0].device if tensors else None
    as_tensors = [v if isinstance(v, Tensor) else tensor(float(v), dtype=dtype, device=device) for v in values]
    shape = np.broadcast_shapes(*[t.shape for t in as_tensors])
    return tuple(t if t.shape == shape else expand(t, shape) for t in as_tensors)
