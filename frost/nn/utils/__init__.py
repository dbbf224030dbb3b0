"""Gradient utilities: clip_grad_norm_, clip_grad_value_, parameters_to_vector, vector_to_parameters; rnn:
pad_sequence."""
from __future__ import annotations

import functools
import math
from typing import Iterable

import numpy as np

from frost import backend, dispatch
from frost.autograd import no_grad
from frost.ops.shape import cat
from frost.tensor import Tensor
from frost.nn.utils import rnn

__all__ = ["clip_grad_norm_", "clip_grad_value_", "parameters_to_vector", "vector_to_parameters", "rnn"]


def _as_list(parameters) -> list:
    return [parameters] if isinstance(parameters, Tensor) else list(parameters)


def _norm_of(xp, g, norm_type: float):
    """The norm of one gradient array, as a 0-d array in float32 or wider (it stays on the device)."""
    a = g if g.dtype.itemsize >= 4 and g.dtype.kind == "f" else g.astype("float32")
    if norm_type == math.inf:
        return xp.abs(a).max()
    if norm_type == -math.inf:
        return xp.abs(a).min()
    if norm_type == 0:  # the count of non-zeros, as torch.linalg.vector_norm's ord=0
        return xp.asarray(xp.count_nonzero(a), dtype=a.dtype)
    if norm_type == 2.0:
        # CuPy's vdot calls cuBLAS, which refuses to run while frost.jit captures a step; a reduction kernel does not
        flat = a.ravel()
        fast = dispatch.lookup("sum_of_squares", flat)
        return xp.sqrt(fast(flat) if fast else xp.vdot(flat, flat) if xp is np else (flat * flat).sum())
    return (xp.abs(a) ** norm_type).sum() ** (1.0 / norm_type)


def _joint_norm(xp, norms: list, norm_type: float):
    """The norm of the vector of per-gradient norms, one elementwise op at a time: CuPy's stack copies its list of
    addresses from the host, which a captured step refuses."""
    if norm_type in (math.inf, -math.inf):
        pick = xp.maximum if norm_type == math.inf else xp.minimum
        return functools.reduce(pick, norms)
    if norm_type == 0:  # the count of non-zero norms, as a vector norm of order 0 counts
        return functools.reduce(xp.add, ((n != 0).astype(n.dtype) for n in norms))
    total = functools.reduce(xp.add, (n ** norm_type for n in norms))
    return xp.sqrt(total) if norm_type == 2.0 else total ** (1.0 / norm_type)


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach=None) -> Tensor:
    """Scale gradients in place so that their joint norm is at most max_norm; return that norm before clipping.

    PyTorch's rule exactly: coef = max_norm / (total_norm + 1e-6), clamped to 1, and every gradient is
    multiplied by coef (also when it is 1, so there is no host synchronization unless error_if_nonfinite).
    """
    params = _as_list(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    max_norm, norm_type = float(max_norm), float(norm_type)
    if not grads:
        return Tensor(backend.xp_for(params[0].device if params else backend.CPU).zeros((), dtype="float32"))
    device = grads[0].device
    xp = grads[0].xp
    arrays = [(g.data, g.device) for g in grads]
    buffers = dispatch.lookup("gradient_buffers", grads[0], grads=grads) if norm_type > 0 else None
    if buffers is not None:
        # flat buffers holding exactly these gradients and zeros between them, which leave a norm of positive order
        # (and the infinity norm) as it is: a few launches per buffer instead of several per parameter
        arrays = [(b, device) for b in buffers(grads)]
    norms = [backend.to_device(_norm_of(backend.xp_for(d), a, norm_type), device) for a, d in arrays]
    total = _joint_norm(xp, norms, norm_type)
    if error_if_nonfinite and not bool(xp.isfinite(total)):
        raise RuntimeError(f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so "
                           f"it cannot be clipped. To disable this error and scale the gradients by the non-finite "
                           f"norm anyway, set `error_if_nonfinite=False`")
    coef = xp.minimum(max_norm / (total + 1e-6), 1.0)
    for a, d in arrays:
        c = (backend.to_device(coef, d) if d != device else coef).astype(a.dtype, copy=False)
        fast = dispatch.lookup("scale_", a, coef=c)
        if fast:
            fast(a, c)
        else:
            a *= c
    out_dtype = grads[0].data.dtype if all(g.data.dtype == grads[0].data.dtype for g in grads) else total.dtype
    return Tensor(xp.asarray(total, dtype=out_dtype))


def clip_grad_value_(parameters, clip_value: float, foreach=None) -> None:
    """Clamp every gradient in place to [-clip_value, clip_value]."""
    clip_value = float(clip_value)
    for p in _as_list(parameters):
        if p.grad is not None:
            p.grad.xp.clip(p.grad.data, -clip_value, clip_value, out=p.grad.data)


def parameters_to_vector(parameters: Iterable[Tensor]) -> Tensor:
    """All parameters flattened into one vector (differentiable with respect to them)."""
    params = _as_list(parameters)
    if not params:
        raise RuntimeError("parameters_to_vector: got no parameters")
    devices = {str(p.device) for p in params}
    if len(devices) > 1:
        raise TypeError(f"parameters_to_vector: found parameters on different devices: {sorted(devices)}")
    return cat([p.reshape(-1) for p in params])


def vector_to_parameters(vec: Tensor, parameters: Iterable[Tensor]) -> None:
    """Copy consecutive slices of vec into the parameters, in place (values only; no graph is recorded)."""
    if not isinstance(vec, Tensor):
        raise TypeError(f"expected frost.Tensor, but got: {type(vec).__name__}")
    params = _as_list(parameters)
    total = sum(p.numel() for p in params)
    if vec.ndim != 1 or vec.numel() != total:
        raise RuntimeError(f"vector_to_parameters: vec of shape {vec.shape} does not hold the {total} values "
                           f"of the parameters")
    offset = 0
    with no_grad():
        for p in params:
            n = p.numel()
            chunk = vec.data[offset:offset + n].reshape(p.shape)
            p.data[...] = backend.to_device(chunk, p.device).astype(p.data.dtype, copy=False)
            offset += n
