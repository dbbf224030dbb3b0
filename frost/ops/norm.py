"""Normalization ops: batch norm, layer norm and RMS norm, each with a fused closed-form backward."""

import math

import numpy as np

from frost import dispatch
from frost.dtype import compute_dtype
from frost.tensor import Tensor, from_op


def _param(t: Tensor | None, dtype):
    """A parameter's array in the compute dtype, or None."""
    return None if t is None else t.data.astype(dtype, copy=False)


def _describe(name: str, t: Tensor) -> str:
    return f"{name} of shape {t.shape} ({t.dtype.name}, {t.device})"


def _check_params(op: str, x: Tensor, expected: tuple, **params) -> None:
    for pname, p in params.items():
        if p is None:
            continue
        if not isinstance(p, Tensor):
            raise TypeError(f"{op}: {pname} must be a Tensor or None, got {type(p).__name__}")
        if p.shape != expected:
            raise RuntimeError(f"{op}: {pname} of shape {p.shape} does not fit input of shape {x.shape} "
                               f"(expected {pname} of shape {expected})")
        if p.device != x.device:
            raise RuntimeError(f"{op}: {_describe(pname, p)} is on a different device than "
                               f"{_describe('input', x)}")


# ------------------------------------------------------------------ batch norm

def batch_norm(x: Tensor, running_mean: Tensor | None, running_var: Tensor | None, weight: Tensor | None = None,
               bias: Tensor | None = None, training: bool = False, momentum: float = 0.1,
               eps: float = 1e-5) -> Tensor:
    """Normalize each channel (dim 1) of (N, C, *) over N and the spatial dims, as torch.nn.functional.batch_norm.

    In training the batch statistics are used and running_mean/running_var (when given) are updated in place
    with the unbiased batch variance; in evaluation the running statistics are used.
    """
    _check_batch_norm(x, running_mean, running_var, weight, bias, training)
    if x.numel() == 0:
        return _empty_batch_norm(x, weight, bias)
    xp = x.xp
    C = x.shape[1]
    axes = (0,) + tuple(range(2, x.ndim))
    channel_shape = (1, C) + (1,) * (x.ndim - 2)
    n = x.numel() // C
    cdt = compute_dtype(x.data)
    xf = x.data.astype(cdt, copy=False)

    if training:
        mean = xf.mean(axis=axes)
        centered = xf - mean.reshape(channel_shape)
        var = (centered * centered).mean(axis=axes)
        _update_running(running_mean, mean, momentum)
        _update_running(running_var, var * (n / (n - 1)), momentum)
    else:
        if running_mean is None or running_var is None:
            raise RuntimeError("batch_norm: running_mean and running_var must be given in evaluation mode "
                               "(training=False)")
        mean = running_mean.data.astype(cdt)
        var = running_var.data.astype(cdt)
        centered = xf - mean.reshape(channel_shape)
    invstd = (1 / xp.sqrt(var + eps)).astype(cdt, copy=False)
    xhat = centered * invstd.reshape(channel_shape)
    w, b = _param(weight, cdt), _param(bias, cdt)
    out = xhat
    if w is not None:
        out = out * w.reshape(channel_shape)
    if b is not None:
        out = out + b.reshape(channel_shape)
    parents = [t for t in (x, weight, bias) if t is not None]

    def backward(g):
        gf = g.astype(cdt, copy=False)
        dbias = gf.sum(axis=axes)
        dweight = (gf * xhat).sum(axis=axes)
        scale = invstd if w is None else w * invstd
        if training:
            # d/dx of (x - mean) * invstd with mean and invstd depending on the batch:
            # dx = w * invstd * (g - mean(g) - xhat * mean(g * xhat)), the means over the channel's n values
            dx = scale.reshape(channel_shape) * (gf - (dbias / n).reshape(channel_shape)
                                                 - xhat * (dweight / n).reshape(channel_shape))
        else:
            dx = gf * scale.reshape(channel_shape)
        grads = [dx.astype(x.data.dtype, copy=False)]
        if weight is not None:
            grads.append(dweight.astype(weight.data.dtype, copy=False))
        if bias is not None:
            grads.append(dbias.astype(bias.data.dtype, copy=False))
        return grads

    return from_op(out.astype(x.data.dtype, copy=False), parents, backward, "batch_norm")


def batch_norm_act(x: Tensor, running_mean: Tensor | None, running_var: Tensor | None, weight: Tensor | None = None,
                   bias: Tensor | None = None, training: bool = False, momentum: float = 0.1, eps: float = 1e-5,
                   residual: Tensor | None = None, relu: bool = False,
                   num_batches_tracked: Tensor | None = None) -> Tensor:
    """relu(batch_norm(x) + residual), the add and the ReLU optional, as one op: what a ResNet block's batch norm
    layer computes. In training, num_batches_tracked (a one-element int64 buffer, when given) is incremented by one.

    A fast path registered for it (frost.accel.batch_norm: a few GPU launches per direction, channels-last and bf16
    activations read as they are) takes the call where it applies; otherwise this composition of the ops runs.
    """
    _check_batch_norm(x, running_mean, running_var, weight, bias, training)
    fast = dispatch.lookup("batch_norm_act", x, running_mean, running_var, weight, bias, training=training,
                           residual=residual)
    if fast is not None:
        return fast(x, running_mean, running_var, weight, bias, training, momentum, eps, residual, relu,
                    num_batches_tracked)
    out = batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)
    if training and num_batches_tracked is not None:
        num_batches_tracked.data += 1
    if residual is not None:
        out = out + residual
    return out.relu() if relu else out


def _check_batch_norm(x: Tensor, running_mean: Tensor | None, running_var: Tensor | None, weight: Tensor | None,
                      bias: Tensor | None, training: bool) -> None:
    if x.ndim < 2:
        raise RuntimeError(f"batch_norm: expected an input of shape (N, C, *) with at least 2 dims, got {x.shape}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"batch_norm: needs a floating-point input, got {x.dtype!r}")
    _check_params("batch_norm", x, (x.shape[1],), running_mean=running_mean, running_var=running_var,
                  weight=weight, bias=bias)
    if training:
        _check_values_per_channel(x)


def _check_values_per_channel(x: Tensor) -> None:
    """Training needs a batch variance: PyTorch refuses exactly one value per channel (none is an empty batch)."""
    values = x.shape[0] * math.prod(x.shape[2:])
    if values == 1:
        raise ValueError(f"batch_norm: expected more than 1 value per channel when training, got input of shape "
                         f"{x.shape} (one value per channel has no variance); use a batch of at least 2 or "
                         f"evaluation mode")


def _empty_batch_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None) -> Tensor:
    """PyTorch's answer to an input without elements: an empty output and no statistics (the running ones stay
    as they are); weight and bias stay in the graph and get zero gradients. NumPy or CuPy alike (x's xp)."""
    xp = x.xp
    parents = [t for t in (x, weight, bias) if t is not None]

    def backward(g):
        return [xp.zeros(x.shape, dtype=x.data.dtype)] + [xp.zeros_like(p.data) for p in parents[1:]]

    return from_op(xp.empty(x.shape, dtype=x.data.dtype), parents, backward, "batch_norm")


def _update_running(stat: Tensor | None, batch_value, momentum: float) -> None:
    """stat <- (1 - momentum) * stat + momentum * batch_value, in place (a buffer: no autograd)."""
    if stat is None:
        return
    new = (1 - momentum) * stat.data.astype(batch_value.dtype) + momentum * batch_value
    stat.data[...] = new.astype(stat.data.dtype, copy=False)


# ------------------------------------------------------------------ layer norm and RMS norm

def _normalized_axes(op: str, x: Tensor, normalized_shape) -> tuple:
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(int(n) for n in normalized_shape)
    k = len(shape)
    if k == 0 or k > x.ndim or x.shape[x.ndim - k:] != shape:
        raise RuntimeError(f"{op}: normalized_shape {shape} does not match the last dims of input of shape "
                           f"{x.shape} (expected input of shape (*, {', '.join(map(str, shape))}))")
    if not x.dtype.is_floating_point:
        raise TypeError(f"{op}: needs a floating-point input, got {x.dtype!r}")
    return shape, tuple(range(x.ndim - k, x.ndim))


def layer_norm(x: Tensor, normalized_shape, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """Normalize over the trailing `normalized_shape` dims, then scale and shift, as torch's layer_norm."""
    shape, axes = _normalized_axes("layer_norm", x, normalized_shape)
    _check_params("layer_norm", x, shape, weight=weight, bias=bias)
    fast = dispatch.lookup("layer_norm", x, weight, bias, shape=shape)
    if fast is not None:
        return fast(x, shape, weight, bias, eps)
    xp = x.xp
    cdt = compute_dtype(x.data)
    xf = x.data.astype(cdt, copy=False)
    # in-place updates below only touch arrays made here; they save a full-size temporary each
    xhat = xf - xf.mean(axis=axes, keepdims=True)
    invstd = (1 / xp.sqrt(xp.square(xhat).mean(axis=axes, keepdims=True) + eps)).astype(cdt, copy=False)
    xhat *= invstd
    w, b = _param(weight, cdt), _param(bias, cdt)
    out = xhat if w is None else xhat * w
    if b is not None:
        out = out + b if out is xhat else xp.add(out, b, out=out)
    lead_axes = tuple(range(x.ndim - len(shape)))
    parents = [t for t in (x, weight, bias) if t is not None]

    def backward(g):
        gf = g.astype(cdt, copy=False)
        g_xhat = gf * xhat
        dweight = g_xhat.sum(axis=lead_axes) if weight is not None else None
        # dx = invstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) with dxhat = g * w
        proj = (g_xhat if w is None else xp.multiply(g_xhat, w, out=g_xhat)).mean(axis=axes, keepdims=True)
        dx = gf * w if w is not None else gf.copy()
        dx -= dx.mean(axis=axes, keepdims=True)
        dx -= xp.multiply(xhat, proj, out=g_xhat)
        dx *= invstd
        grads = [dx.astype(x.data.dtype, copy=False)]
        if weight is not None:
            grads.append(dweight.astype(weight.data.dtype, copy=False))
        if bias is not None:
            grads.append(gf.sum(axis=lead_axes).astype(bias.data.dtype, copy=False))
        return grads

    return from_op(out.astype(x.data.dtype, copy=False), parents, backward, "layer_norm")


def rms_norm(x: Tensor, normalized_shape, weight: Tensor | None = None, eps: float | None = None) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the trailing dims, as torch.nn.functional.rms_norm.

    eps=None means the machine epsilon of the compute type (float32 for float16/bfloat16 inputs), as PyTorch.
    """
    shape, axes = _normalized_axes("rms_norm", x, normalized_shape)
    _check_params("rms_norm", x, shape, weight=weight)
    xp = x.xp
    cdt = compute_dtype(x.data)
    if eps is None:
        eps = float(np.finfo(cdt).eps)
    fast = dispatch.lookup("rms_norm", x, weight, shape=shape)
    if fast is not None:
        return fast(x, shape, weight, eps)
    xf = x.data.astype(cdt, copy=False)
    rstd = (1 / xp.sqrt((xf * xf).mean(axis=axes, keepdims=True) + eps)).astype(cdt, copy=False)
    xhat = xf * rstd
    w = _param(weight, cdt)
    out = xhat if w is None else xhat * w
    lead_axes = tuple(range(x.ndim - len(shape)))
    parents = [t for t in (x, weight) if t is not None]

    def backward(g):
        gf = g.astype(cdt, copy=False)
        dxhat = gf if w is None else gf * w
        dx = rstd * (dxhat - xhat * (dxhat * xhat).mean(axis=axes, keepdims=True))
        grads = [dx.astype(x.data.dtype, copy=False)]
        if weight is not None:
            grads.append((gf * xhat).sum(axis=lead_axes).astype(weight.data.dtype, copy=False))
        return grads

    return from_op(out.astype(x.data.dtype, copy=False), parents, backward, "rms_norm")
