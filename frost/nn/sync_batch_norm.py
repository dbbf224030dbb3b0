"""SyncBatchNorm: batch normalization whose statistics are those of the whole global batch, over every process of
the default group (in training; otherwise it is BatchNorm). Under DistributedDataParallel it makes N processes
train as one process on the concatenated batch."""
from __future__ import annotations

import numpy as np

from frost import distributed as dist
from frost.nn.module import Module
from frost.nn.norm import _BatchNorm
from frost.tensor import Tensor, from_op


def _reduce_axes(x) -> tuple:
    return (0,) + tuple(range(2, x.ndim))


def _per_channel(v, ndim: int):
    return v.reshape((1, -1) + (1,) * (ndim - 2))


def _all_reduce_sum(xp, *vectors):
    """The sums over all processes of float64 vectors, in one collective."""
    joined = Tensor(xp.ascontiguousarray(xp.concatenate(vectors)))
    dist.all_reduce(joined)
    ends = [int(e) for e in np.cumsum([v.size for v in vectors])]
    return [joined.data[start:end] for start, end in zip([0] + ends, ends)]


def sync_batch_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float):
    """Batch norm of x with the mean and biased variance of every process's batch; returns (y, mean, unbiased
    variance, global count). Backward: each process's input gradient through the global statistics (the sums of
    the gradient terms are all-reduced), weight and bias gradients of the local batch (DDP averages them)."""
    xp = x.xp
    a = x.data
    axes = _reduce_axes(a)
    wide = a.astype(xp.float64)
    count = xp.asarray([a.size / a.shape[1]], dtype=xp.float64)
    total, squares, n = _all_reduce_sum(xp, wide.sum(axis=axes), (wide * wide).sum(axis=axes), count)
    n = float(n[0])
    mean = total / n
    var = xp.maximum(squares / n - mean * mean, 0)
    invstd = 1 / xp.sqrt(var + eps)
    xhat = (wide - _per_channel(mean, a.ndim)) * _per_channel(invstd, a.ndim)
    w = weight.data.astype(xp.float64) if weight is not None else None
    y = xhat * _per_channel(w, a.ndim) if w is not None else xhat
    if bias is not None:
        y = y + _per_channel(bias.data.astype(xp.float64), a.ndim)

    def backward(g):
        g = g.astype(xp.float64)
        sum_g, sum_g_xhat = g.sum(axis=axes), (g * xhat).sum(axis=axes)
        total_g, total_g_xhat = _all_reduce_sum(xp, sum_g, sum_g_xhat)
        scale = invstd * (w if w is not None else 1)
        dx = _per_channel(scale, a.ndim) * (g - _per_channel(total_g / n, a.ndim)
                                             - xhat * _per_channel(total_g_xhat / n, a.ndim))
        return (dx.astype(a.dtype), None if weight is None else sum_g_xhat.astype(weight.data.dtype),
                None if bias is None else sum_g.astype(bias.data.dtype))
    out = from_op(y.astype(a.dtype), (x, weight, bias), backward, "sync_batch_norm")
    return out, mean, var * n / max(n - 1, 1), n


class SyncBatchNorm(_BatchNorm):
    """BatchNorm over (N, C, *) inputs with statistics synchronized over the default process group in training
    (one all-reduce forward, one backward); without a group of several processes, plain batch norm."""

    _expected_dims = (2, 3, 4, 5)

    def forward_fused(self, x: Tensor, residual: Tensor | None = None, relu: bool = False) -> Tensor:
        if not (self.training and dist.is_initialized() and dist.get_world_size() > 1):
            return super().forward_fused(x, residual, relu)
        self._check_input_dim(x)
        y, mean, unbiased_var, _ = sync_batch_norm(x, self.weight, self.bias, self.eps)
        if self.track_running_stats and self.running_mean is not None:
            self._update_running_stats(mean, unbiased_var)
        if residual is not None:
            y = y + residual
        return y.relu() if relu else y

    def _update_running_stats(self, mean, unbiased_var) -> None:
        self.num_batches_tracked.data += 1
        factor = 1.0 / float(self.num_batches_tracked.item()) if self.momentum is None else self.momentum
        for buffer, batch_value in ((self.running_mean, mean), (self.running_var, unbiased_var)):
            buffer.data[...] = ((1 - factor) * buffer.data + factor * batch_value).astype(buffer.data.dtype)

    @classmethod
    def convert_sync_batchnorm(cls, module: Module, process_group=None) -> Module:
        """module with every BatchNorm*d replaced by a SyncBatchNorm holding the same parameters and buffers."""
        if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
            converted = cls.__new__(cls)
            Module.__init__(converted)
            for name in ("num_features", "eps", "momentum", "affine", "track_running_stats", "training"):
                object.__setattr__(converted, name, getattr(module, name))
            for name, p in module._parameters.items():
                converted.register_parameter(name, p)
            for name, b in module._buffers.items():
                converted.register_buffer(name, b)
            return converted
        for name, child in list(module._modules.items()):
            if child is not None:
                setattr(module, name, cls.convert_sync_batchnorm(child, process_group))
        return module
