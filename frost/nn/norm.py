"""Normalization layers: BatchNorm1d, BatchNorm2d, LayerNorm, RMSNorm."""
from __future__ import annotations

import numbers

from frost.nn import init
from frost.nn.module import Module, Parameter
from frost.ops.norm import batch_norm_act, layer_norm, rms_norm
from frost.tensor import Tensor, empty, ones, tensor, zeros


class _BatchNorm(Module):
    """Batch normalization over dim 1; running statistics are buffers, updated in place in training mode.

    momentum=None makes the running statistics a cumulative (equal-weight) average, as in PyTorch.
    """

    _expected_dims: tuple = ()
    _optional_state = ("num_batches_tracked",)

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device=None, dtype=None, *, bias: bool = True) -> None:
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        shape, tracked, kw = (num_features,), track_running_stats, dict(device=device, dtype=dtype)
        self.register_parameter("weight", Parameter(empty(shape, **kw)) if affine else None)
        self.register_parameter("bias", Parameter(empty(shape, **kw)) if affine and bias else None)
        self.register_buffer("running_mean", zeros(shape, **kw) if tracked else None)
        self.register_buffer("running_var", ones(shape, **kw) if tracked else None)
        self.register_buffer("num_batches_tracked", tensor(0, dtype="int64", device=device) if tracked else None)
        self.reset_parameters()

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            self.running_mean.data[...] = 0
            self.running_var.data[...] = 1
            self.num_batches_tracked.data[...] = 0

    def reset_parameters(self) -> None:
        self.reset_running_stats()
        if self.affine:
            init.ones_(self.weight)
            if self.bias is not None:
                init.zeros_(self.bias)

    def _check_input_dim(self, x: Tensor) -> None:
        if x.ndim not in self._expected_dims:
            want = " or ".join(f"{d}D" for d in self._expected_dims)
            raise ValueError(f"{type(self).__name__}: expected {want} input (got {x.ndim}D input of shape {x.shape})")

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_fused(x)

    def forward_fused(self, x: Tensor, residual: Tensor | None = None, relu: bool = False) -> Tensor:
        """relu(bn(x) + residual) as one fused op (four launches on the GPU); both extras optional."""
        self._check_input_dim(x)
        factor = 0.0 if self.momentum is None else self.momentum
        counter = None
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            if self.momentum is None:  # the cumulative average needs the count on the host (not the fast path)
                self.num_batches_tracked.data += 1
                factor = 1.0 / float(self.num_batches_tracked.item())
            else:
                counter = self.num_batches_tracked  # batch_norm_act adds one (on the GPU, in its normalize kernel)
        # batch statistics in training, and in eval when no running statistics exist
        use_batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        track = not self.training or self.track_running_stats
        return batch_norm_act(x, self.running_mean if track else None, self.running_var if track else None,
                              self.weight, self.bias, use_batch_stats, factor, self.eps, residual, relu,
                              num_batches_tracked=counter)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"bias={self.bias is not None}, track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """Batch norm over (N, C) or (N, C, L) inputs."""

    _expected_dims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch norm over (N, C, H, W) inputs, per channel."""

    _expected_dims = (4,)


def _shape_tuple(normalized_shape) -> tuple:
    if isinstance(normalized_shape, numbers.Integral):
        return (int(normalized_shape),)
    return tuple(int(n) for n in normalized_shape)


class LayerNorm(Module):
    """Normalizes over the last len(normalized_shape) dims; weight ones and bias zeros at init."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 device=None, dtype=None) -> None:
        super().__init__()
        self.normalized_shape = _shape_tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        affine, shape, kw = elementwise_affine, self.normalized_shape, dict(device=device, dtype=dtype)
        self.register_parameter("weight", Parameter(ones(shape, **kw)) if affine else None)
        self.register_parameter("bias", Parameter(zeros(shape, **kw)) if affine and bias else None)

    def reset_parameters(self) -> None:
        if self.elementwise_affine:
            init.ones_(self.weight)
            if self.bias is not None:
                init.zeros_(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
                f"bias={self.bias is not None}")


class RMSNorm(Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last dims; eps=None uses the dtype's machine epsilon."""

    def __init__(self, normalized_shape, eps: float | None = None, elementwise_affine: bool = True,
                 device=None, dtype=None) -> None:
        super().__init__()
        self.normalized_shape = _shape_tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.register_parameter("weight", Parameter(ones(self.normalized_shape, device=device, dtype=dtype))
                                if elementwise_affine else None)

    def reset_parameters(self) -> None:
        if self.elementwise_affine:
            init.ones_(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
