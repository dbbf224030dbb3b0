"""Random ops: dropout (inverted, drawn from Frost's generators) and Bernoulli sampling.

On the CPU the draws come from NumPy's generator; on CUDA from Frost's Philox4x32-10 generator
(frost.accel.philox), whose offset lives on the device, so a step captured by frost.jit draws a new dropout
mask on every replay (the same sequence as eager calls from the same seed).
"""
from __future__ import annotations

from frost import dispatch
from frost.backend import Device
from frost.generator import engine
from frost.tensor import Tensor, from_op


def generator_for(device: Device):
    """Frost's random generator for a device: NumPy's on the CPU, Philox on CUDA (both reseeded by manual_seed)."""
    return engine(None, device, "random")


def _check_p(p: float, name: str) -> None:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{name}: dropout probability has to be between 0 and 1, but got {p}")


def dropout(x: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Zero each element with probability p and scale the survivors by 1/(1-p); identity when not training.

    `inplace` is accepted for PyTorch compatibility; the result is always a new tensor.
    """
    _check_p(p, "dropout")
    if not x.dtype.is_floating_point:
        raise TypeError(f"dropout: needs a floating-point tensor, got {x.dtype!r} of shape {x.shape}")
    if not training or p == 0.0:
        return x
    return _apply_mask(x, x.shape, p, "dropout")


def dropout2d(x: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Zero whole channels (dim 1 of (N, C, H, W), dim 0 of (C, H, W)) with probability p, scaling by 1/(1-p)."""
    _check_p(p, "dropout2d")
    if x.ndim not in (3, 4):
        raise RuntimeError(f"dropout2d: expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, got shape {x.shape}")
    if not training or p == 0.0:
        return x
    mask_shape = x.shape[:-2] + (1, 1)
    return _apply_mask(x, mask_shape, p, "dropout2d")


def _apply_mask(x: Tensor, mask_shape: tuple, p: float, name: str) -> Tensor:
    # the acceleration layer's fused kernel where it applies (frost/accel/dropout.py): the same draws, no mask stored
    fast = dispatch.lookup("dropout", x, mask_shape=mask_shape, p=p)
    if fast is not None:
        return fast(x, mask_shape, p)
    xp = x.xp
    dt = x.data.dtype
    if p == 1.0:
        scaled_mask = xp.zeros(mask_shape, dtype=dt)
    else:
        keep = generator_for(x.device).random(mask_shape, dtype="float32") >= p
        # mask values are exactly 1/(1-p) rounded to x's dtype, as PyTorch's bernoulli_().div_(1-p); a NumPy
        # scalar, not a device array, so that no host-to-device copy happens inside a captured step
        scaled_mask = keep.astype(dt) * dt.type(1.0 / (1.0 - p))
    out = x.data * scaled_mask
    return from_op(out, (x,), lambda g: ((g * scaled_mask).astype(dt, copy=False),), name)


def bernoulli(probs: Tensor) -> Tensor:
    """Draw 0/1 samples with the given probabilities (no gradient); result has probs' dtype."""
    if not probs.dtype.is_floating_point:
        raise TypeError(f"bernoulli: probabilities must be floating point, got {probs.dtype!r}")
    xp = probs.xp
    u = generator_for(probs.device).random(probs.shape, dtype="float32")
    return Tensor((u < probs.data.astype(xp.float32)).astype(probs.data.dtype))


def sample_categorical(logits: Tensor) -> Tensor:
    """Class indices (int64) drawn from softmax(logits) over the last axis, with Frost's generator for the device.

    SophiaG's Gauss-Newton-Bartlett estimate backpropagates the loss on labels drawn this way (sample_labels).
    """
    xp, x = logits.xp, logits.detach().data
    x = x.astype(xp.float64 if x.dtype == xp.float64 else xp.float32)
    cdf = xp.cumsum(xp.exp(x - x.max(axis=-1, keepdims=True)), axis=-1)
    u = generator_for(logits.device).random(x.shape[:-1] + (1,), dtype=x.dtype) * cdf[..., -1:]
    return Tensor(xp.minimum((cdf <= u).sum(axis=-1), x.shape[-1] - 1).astype(xp.int64))
