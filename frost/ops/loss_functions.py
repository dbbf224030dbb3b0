"""More losses and distances (binary cross entropy, KL divergence, smooth L1 and Huber, margin ranking, cosine
similarity, normalize, pairwise distance), forward and backward together, with PyTorch's values and gradients."""
from __future__ import annotations

import numpy as np

from frost.ops.autocast_inputs import float32_inputs
from frost.autograd import unbroadcast
from frost.ops import elementwise, reduce
from frost.ops.loss import _check_reduction, _check_tensor, _pair, _pair_grads, _reduce
from frost.ops.math import broadcasts_to
from frost.ops.reduce import normalize_dim
from frost.tensor import Tensor, can_read_values, from_op

_LOG_FLOOR = -100.0  # PyTorch's binary_cross_entropy clamps each log here, so that a 0 or 1 input stays finite
_BCE_EPSILON = float(np.float32(1e-12))  # ...and the gradient's denominator x * (1 - x) at least this (PyTorch's
# constant is a float32 one, in every dtype)


def binary_cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None,
                         reduction: str = "mean") -> Tensor:
    """-weight * (t * log(x) + (1 - t) * log(1 - x)) of probabilities x in [0, 1], each log clamped at -100, as
    PyTorch's. The target's gradient is that of the clamped logs, so finite where x is 0 or 1 (PyTorch's is
    infinite there); unlike PyTorch, weight has a gradient."""
    op = "binary_cross_entropy"
    input, target, weight = float32_inputs(input, target, weight)
    _check_bce_arguments(op, input, target, weight, reduction)
    xp = input.xp
    x, t = input.data, target.data.astype(input.data.dtype, copy=False)
    w = None if weight is None else weight.data.astype(x.dtype, copy=False)
    with np.errstate(divide="ignore"):
        log_x, log_1mx = xp.maximum(xp.log(x), _LOG_FLOOR), xp.maximum(xp.log1p(-x), _LOG_FLOOR)
    unweighted = -(t * log_x + (1 - t) * log_1mx)
    loss = unweighted if w is None else unweighted * w
    out, per_element = _reduce(xp, loss, reduction)
    parents = [p for p in (input, target, weight) if p is not None]

    def backward(g):
        ge = per_element(g)
        gw = ge if w is None else ge * w
        d_input = gw * (x - t) / xp.maximum(x * (1 - x), _BCE_EPSILON)
        grads = [d_input.astype(x.dtype, copy=False), (gw * (log_1mx - log_x)).astype(target.data.dtype, copy=False)]
        if weight is not None:
            grads.append(unbroadcast(ge * unweighted, weight.shape).astype(weight.data.dtype, copy=False))
        return grads
    return from_op(out.astype(x.dtype, copy=False), parents, backward, op)


def _check_bce_arguments(op: str, input: Tensor, target: Tensor, weight: Tensor | None, reduction: str) -> None:
    _check_reduction(op, reduction)
    if not isinstance(input, Tensor):
        raise TypeError(f"{op}: input must be a Tensor, got {type(input).__name__}")
    if not input.dtype.is_floating_point:
        raise TypeError(f"{op}: input must hold probabilities in a floating dtype, got {input.dtype!r} of shape "
                        f"{input.shape}")
    _check_tensor(op, "target", target, input)
    if target.shape != input.shape:
        raise ValueError(f"{op}: target size {target.shape} must be the same as input size {input.shape}")
    if weight is not None:
        _check_tensor(op, "weight", weight, input)
        if not broadcasts_to(weight.shape, input.shape):
            raise RuntimeError(f"{op}: weight of shape {weight.shape} cannot be broadcast to input of shape "
                               f"{input.shape}")
    if input.numel() and can_read_values(input):
        x = input.data
        if bool(((x < 0) | (x > 1) | (x != x)).any()):
            raise RuntimeError(f"{op}: all elements of input should be between 0 and 1 (probabilities; for logits "
                               f"use binary_cross_entropy_with_logits), input of shape {input.shape}")


_KL_REDUCTIONS = ("none", "batchmean", "sum", "mean")


def kl_div(input: Tensor, target: Tensor, reduction: str = "mean", log_target: bool = False) -> Tensor:
    """KL(target || exp(input)) pointwise: target * (log(target) - input), 0 where target is 0 (input holds
    log-probabilities; with log_target=True so does target). reduction "batchmean" divides the sum by the batch
    size (input's dim 0): the true KL divergence; "mean" divides by every element, as PyTorch's. Where target is
    0, its gradient is -input (PyTorch's is NaN there)."""
    op = "kl_div"
    if reduction not in _KL_REDUCTIONS:
        raise ValueError(f"{op}: reduction must be one of {_KL_REDUCTIONS}, got {reduction!r}")
    input, target = float32_inputs(input, target)
    x, t = _pair(op, input, target, "none")
    xp = input.xp
    with np.errstate(divide="ignore", invalid="ignore"):
        if log_target:
            p = xp.exp(t)
            loss = p * (t - x)
        else:
            log_t = xp.where(t > 0, xp.log(xp.where(t > 0, t, 1)), 0)
            loss = t * log_t - t * x
    batch = input.shape[0] if input.ndim else 1
    out, per_element = _kl_reduce(xp, loss, reduction, batch)

    def backward(g):
        ge = per_element(g)
        d_input = -ge * (p if log_target else t)
        d_target = ge * (p * (t - x + 1) if log_target else xp.where(t > 0, log_t + 1, 0) - x)
        return (unbroadcast(d_input, input.shape).astype(input.data.dtype, copy=False),
                unbroadcast(d_target, target.shape).astype(target.data.dtype, copy=False))
    return from_op(out.astype(input.data.dtype, copy=False), (input, target), backward, op)


def _kl_reduce(xp, loss, reduction: str, batch: int):
    if reduction != "batchmean":
        return _reduce(xp, loss, reduction)
    total, per_element = _reduce(xp, loss, "sum")
    return total / batch, lambda g: per_element(g / batch)


def smooth_l1_loss(input: Tensor, target: Tensor, reduction: str = "mean", beta: float = 1.0) -> Tensor:
    """0.5 * d^2 / beta where |d| < beta, else |d| - 0.5 * beta (d = input - target); beta = 0 is the L1 loss."""
    op = "smooth_l1_loss"
    if beta < 0:
        raise ValueError(f"{op}: beta must be non-negative, got {beta}")
    input, target = float32_inputs(input, target)
    x, t = _pair(op, input, target, reduction)
    xp = input.xp
    d = x - t
    absd = xp.abs(d)
    inside = absd < beta
    with np.errstate(divide="ignore", invalid="ignore"):
        loss = xp.where(inside, 0.5 * d * d / (beta or 1), absd - 0.5 * beta)
        slope = xp.where(inside, d / (beta or 1), xp.sign(d))
    out, per_element = _reduce(xp, loss, reduction)
    return from_op(out.astype(input.data.dtype, copy=False), (input, target),
                   lambda g: _pair_grads(input, target, per_element(g) * slope), op)


def huber_loss(input: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0) -> Tensor:
    """0.5 * d^2 where |d| < delta, else delta * (|d| - 0.5 * delta): smooth_l1_loss(beta=delta) times delta."""
    op = "huber_loss"
    if not delta > 0:
        raise ValueError(f"{op}: delta must be positive, got {delta}")
    input, target = float32_inputs(input, target)
    x, t = _pair(op, input, target, reduction)
    xp = input.xp
    d = x - t
    inside = xp.abs(d) < delta
    loss = xp.where(inside, 0.5 * d * d, delta * (xp.abs(d) - 0.5 * delta))
    slope = xp.clip(d, -delta, delta)
    out, per_element = _reduce(xp, loss, reduction)
    return from_op(out.astype(input.data.dtype, copy=False), (input, target),
                   lambda g: _pair_grads(input, target, per_element(g) * slope), op)


def margin_ranking_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0.0,
                        reduction: str = "mean") -> Tensor:
    """max(0, -target * (input1 - input2) + margin): target 1 asks input1 to rank higher, -1 input2."""
    op = "margin_ranking_loss"
    _check_reduction(op, reduction)
    for name, t in (("input1", input1), ("input2", input2), ("target", target)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: {name} must be a Tensor, got {type(t).__name__}")
        _check_tensor(op, name, t, input1)
    try:
        shape = np.broadcast_shapes(input1.shape, input2.shape, target.shape)
    except ValueError:
        raise RuntimeError(f"{op}: input1 of shape {input1.shape}, input2 of shape {input2.shape} and target of "
                           f"shape {target.shape} cannot be broadcast together") from None
    xp = input1.xp
    dt = np.result_type(input1.data.dtype, input2.data.dtype, target.data.dtype)
    x1, x2, y = (a.data.astype(dt, copy=False) for a in (input1, input2, target))
    raw = xp.broadcast_to(-y * (x1 - x2) + margin, shape)
    active = raw >= 0  # clamp_min's gradient: 1 at the hinge itself, as PyTorch's
    out, per_element = _reduce(xp, xp.maximum(raw, 0), reduction)

    def backward(g):
        ge = xp.where(active, per_element(g), 0)
        return (unbroadcast(-ge * y, input1.shape).astype(input1.data.dtype, copy=False),
                unbroadcast(ge * y, input2.shape).astype(input2.data.dtype, copy=False),
                unbroadcast(-ge * (x1 - x2), target.shape).astype(target.data.dtype, copy=False))
    return from_op(out.astype(dt, copy=False), (input1, input2, target), backward, op)


# ------------------------------------------------------------------ distances

def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
    """sum(x1 * x2) / (max(|x1|, eps) * max(|x2|, eps)) along `dim` (x1 and x2 broadcast). As PyTorch's, the
    clamp to eps does not enter the gradient: each norm still varies as |x|."""
    op = "cosine_similarity"
    _check_pair_of_vectors(op, x1, x2)
    xp = x1.xp
    a, b = xp.broadcast_arrays(x1.data, x2.data)
    axis = normalize_dim(dim, a.ndim, op)
    norm_a = xp.sqrt((a * a).sum(axis=axis, keepdims=True))
    norm_b = xp.sqrt((b * b).sum(axis=axis, keepdims=True))
    na, nb = xp.maximum(norm_a, eps), xp.maximum(norm_b, eps)
    cos = (a * b).sum(axis=axis, keepdims=True) / (na * nb)

    def backward(g):
        gk = xp.expand_dims(g, axis)
        with np.errstate(divide="ignore", invalid="ignore"):
            # d|x|/dx = x / |x|, taken as 0 at x = 0, as the norm's gradient
            unit_a = xp.where(norm_a > 0, a / norm_a, 0)
            unit_b = xp.where(norm_b > 0, b / norm_b, 0)
            ga = gk * (b / (na * nb) - cos / na * unit_a)
            gb = gk * (a / (na * nb) - cos / nb * unit_b)
        return (unbroadcast(ga, x1.shape).astype(x1.data.dtype, copy=False),
                unbroadcast(gb, x2.shape).astype(x2.data.dtype, copy=False))
    return from_op(xp.squeeze(cos, axis), (x1, x2), backward, op)


def _check_pair_of_vectors(op: str, x1: Tensor, x2: Tensor) -> None:
    for name, t in (("x1", x1), ("x2", x2)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: {name} must be a Tensor, got {type(t).__name__}")
        if not t.dtype.is_floating_point:
            raise TypeError(f"{op}: {name} must be floating point, got {t.dtype!r} of shape {t.shape}")
    _check_tensor(op, "x2", x2, x1)
    if x1.dtype != x2.dtype:
        raise RuntimeError(f"{op}: x1 ({x1.dtype.name}, shape {x1.shape}) and x2 ({x2.dtype.name}, shape "
                           f"{x2.shape}) must have the same dtype")
    try:
        np.broadcast_shapes(x1.shape, x2.shape)
    except ValueError:
        raise RuntimeError(f"{op}: x1 of shape {x1.shape} and x2 of shape {x2.shape} cannot be broadcast "
                           f"together") from None


def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    """input / max(|input|_p, eps) along `dim`; composed of norm, clamp and div as PyTorch's (so where the norm is
    below eps, the divisor is the constant eps)."""
    if not isinstance(input, Tensor):
        raise TypeError(f"normalize: input must be a Tensor, got {type(input).__name__}")
    if not input.dtype.is_floating_point:
        raise TypeError(f"normalize: input must be floating point, got {input.dtype!r} of shape {input.shape}")
    normalize_dim(dim, input.ndim, "normalize")  # the range check, naming this op
    norm = reduce.norm(input, p, dim, keepdim=True)
    return elementwise.div(input, elementwise.clamp(norm, min=eps))


def pairwise_distance(x1: Tensor, x2: Tensor, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False) -> Tensor:
    """|x1 - x2 + eps|_p along the last dim (eps keeps the gradient finite where x1 == x2), as PyTorch's."""
    op = "pairwise_distance"
    _check_pair_of_vectors(op, x1, x2)
    if x1.ndim == 0 and x2.ndim == 0:
        raise RuntimeError(f"{op}: needs at least 1-D inputs, got x1 of shape {x1.shape} and x2 of shape "
                           f"{x2.shape}")
    return reduce.norm(elementwise.add(elementwise.sub(x1, x2), eps), p, -1, keepdim)
