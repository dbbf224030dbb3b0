"""Loss functions (cross entropy, NLL, MSE, L1, BCE with logits), each a fused forward with a closed-form backward."""
from __future__ import annotations

import warnings

import numpy as np

from frost import dispatch
from frost.autograd import is_grad_enabled, unbroadcast
from frost.dtype import compute_dtype, float32
from frost.ops.autocast_inputs import float32_dtype, float32_inputs
from frost.ops.elementwise import cast, sigmoid, softplus, sum_to, where
from frost.ops.math import broadcasts_to
from frost.ops.reduce import softmax
from frost.tensor import Tensor, from_op, can_read_values, record_tensor_backward

_REDUCTIONS = ("none", "mean", "sum")


def _check_reduction(op: str, reduction: str) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{op}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")


def _check_tensor(op: str, name: str, t, ref: Tensor) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{op}: {name} must be a Tensor, got {type(t).__name__}")
    if t.device != ref.device:
        raise RuntimeError(f"{op}: {name} of shape {t.shape} is on {t.device} but input of shape {ref.shape} "
                           f"is on {ref.device}")


def _log_softmax_rows(xp, z):
    shifted = z - z.max(axis=1, keepdims=True)
    return shifted - xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))


# ------------------------------------------------------------------ layout: (N, C, d1, ...) as rows of C classes

def _rows(input_array, xp):
    """View the input as (M, C) rows (class dim last); return the rows and a function that undoes it."""
    shape = input_array.shape
    if input_array.ndim == 1:
        return input_array.reshape(1, -1), lambda d: d.reshape(shape)
    C = shape[1]
    moved = xp.moveaxis(input_array, 1, -1)
    moved_shape = moved.shape
    return moved.reshape(-1, C), lambda d: xp.moveaxis(d.reshape(moved_shape), -1, 1)


def _class_target_shape(input: Tensor) -> tuple:
    return input.shape[:1] + input.shape[2:] if input.ndim >= 2 else ()


def _check_class_input(op: str, input: Tensor, target, weight) -> None:
    if not isinstance(input, Tensor):
        raise TypeError(f"{op}: input must be a Tensor, got {type(input).__name__}")
    if input.ndim == 0:
        raise RuntimeError(f"{op}: input must have a class dimension, got a 0-d tensor")
    if not input.dtype.is_floating_point:
        raise TypeError(f"{op}: input must be floating point, got {input.dtype!r} of shape {input.shape}")
    _check_tensor(op, "target", target, input)
    C = input.shape[1] if input.ndim >= 2 else input.shape[0]
    if weight is not None:
        _check_tensor(op, "weight", weight, input)
        if weight.shape != (C,):
            raise RuntimeError(f"{op}: weight of shape {weight.shape} does not fit input of shape {input.shape} "
                               f"with {C} classes (expected weight of shape ({C},))")


_HOST_CHECK_LIMIT = 1 << 16  # class targets up to this many elements are checked on the host


def _check_class_target(op: str, input: Tensor, target: Tensor, ignore_index: int) -> None:
    expected = _class_target_shape(input)
    if target.dtype.is_floating_point or target.dtype.name == "bool":
        raise RuntimeError(f"{op}: class-index target must have an integer dtype, got {target.dtype.name} "
                           f"(input of shape {input.shape}, target of shape {target.shape}); "
                           f"probability targets must have the input's shape")
    if target.shape != expected:
        raise RuntimeError(f"{op}: target of shape {target.shape} does not fit input of shape {input.shape} "
                           f"(expected target of shape {expected})")
    if target.numel() == 0 or not can_read_values(target):
        return
    C = input.shape[1] if input.ndim >= 2 else input.shape[0]
    t = target.data
    if target.numel() <= _HOST_CHECK_LIMIT:
        # a batch's worth of labels: one small copy checked by NumPy, instead of five GPU kernels that each cost
        # a CuPy compile at a cold start (the check reads the values on the host either way)
        t = target.numpy()
    bad = (t != ignore_index) & ((t < 0) | (t >= C))
    if bool(bad.any()):
        value = int(t[bad].reshape(-1)[0])
        raise IndexError(f"{op}: target index {value} is out of range for {C} classes (valid: 0..{C - 1} or "
                         f"ignore_index={ignore_index}; input of shape {input.shape}, target of shape "
                         f"{target.shape})")


# ------------------------------------------------------------------ cross entropy and NLL

def cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """Log-softmax over dim 1 (dim 0 for unbatched (C,)) and negative log-likelihood in one op, as PyTorch.

    `target` holds class indices (shape (N, d1, ...), integer) or class probabilities (the input's shape, float).
    """
    op = "cross_entropy"
    _check_reduction(op, reduction)
    _check_class_input(op, input, target, weight)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be between 0.0 and 1.0, got {label_smoothing}")
    if target.dtype.is_floating_point and target.shape == input.shape:
        (input,) = float32_inputs(input)  # under autocast the loss is computed in float32, as PyTorch does
        return _cross_entropy_probs(input, target, weight, reduction, label_smoothing)
    _check_class_target(op, input, target, ignore_index)
    # a fast path computes in float32 whatever the logits' dtype: it takes them as they are, without the float32
    # copy autocast makes for the reference path (GPT-2's 16k x 50k logits: 3.3 GB and 1.7 ms on an H100)
    loss_dtype = float32_dtype(input)
    fast = dispatch.lookup("cross_entropy", input, target, weight, reduction=reduction,
                           label_smoothing=label_smoothing)
    if fast is not None:
        loss = fast(input, target, weight, ignore_index, reduction, label_smoothing, loss_dtype=loss_dtype.name)
        return record_tensor_backward(loss, _class_index_derivative(input, target, weight, ignore_index, reduction,
                                                                    label_smoothing, from_logits=True,
                                                                    in_float32=loss_dtype != input.dtype))
    (input,) = float32_inputs(input)
    return _class_index_loss(op, input, target, weight, ignore_index, reduction, label_smoothing, from_logits=True)


def nll_loss(input: Tensor, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100,
             reduction: str = "mean") -> Tensor:
    """Negative log-likelihood of class indices given log-probabilities (N, C, d1, ...), as PyTorch."""
    op = "nll_loss"
    (input,) = float32_inputs(input)  # under autocast in float32, as PyTorch's
    _check_reduction(op, reduction)
    _check_class_input(op, input, target, weight)
    _check_class_target(op, input, target, ignore_index)
    return _class_index_loss(op, input, target, weight, ignore_index, reduction, 0.0, from_logits=False)


def _class_index_loss(op: str, input: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int,
                      reduction: str, smoothing: float, from_logits: bool) -> Tensor:
    xp = input.xp
    cdt = compute_dtype(input.data)
    rows, to_input_layout = _rows(input.data.astype(cdt, copy=False), xp)
    M, C = rows.shape
    idx = target.data.reshape(-1).astype(xp.int64, copy=False)
    valid = idx != ignore_index
    safe_idx = xp.where(valid, idx, 0)
    logp = _log_softmax_rows(xp, rows) if from_logits else rows
    picked = xp.take_along_axis(logp, safe_idx[:, None], axis=1)[:, 0]
    w = None if weight is None else weight.data.astype(cdt, copy=False)
    # w[y_i] for counted samples, 0 for ignored ones: the per-sample weight and the mean's denominator
    target_weight = valid.astype(cdt) if w is None else xp.where(valid, w[safe_idx], 0).astype(cdt, copy=False)
    zero = xp.zeros((), dtype=cdt)
    loss = xp.where(valid, -target_weight * picked, zero) * (1 - smoothing)
    if smoothing:
        smooth = -(logp.sum(axis=1) if w is None else (logp * w).sum(axis=1))
        loss = loss + xp.where(valid, smooth, zero) * (smoothing / C)
    denom = target_weight.sum() if reduction == "mean" else None
    out = _reduce_rows(xp, loss, reduction, denom, target.shape)

    def backward(g):
        # where, not a product: with every target ignored the mean's coefficient is g/0, and ignored rows get 0
        coef = xp.where(valid, _row_coefficients(xp, g.astype(cdt, copy=False), reduction, denom, M), zero)
        if from_logits:
            p = xp.exp(logp)
            d = ((1 - smoothing) * target_weight)[:, None] * p
            d[xp.arange(M), safe_idx] -= (1 - smoothing) * target_weight
            if smoothing:
                w_total = C if w is None else w.sum()
                w_row = 1 if w is None else w
                d += (smoothing / C) * valid[:, None] * (p * w_total - w_row)
        else:
            d = xp.zeros((M, C), dtype=cdt)
            d[xp.arange(M), safe_idx] = -target_weight
        d *= coef[:, None]
        return (to_input_layout(d).astype(input.data.dtype, copy=False),)

    derivative = _class_index_derivative(input, target, weight, ignore_index, reduction, smoothing, from_logits)
    return from_op(out.astype(input.data.dtype, copy=False), (input,), backward, op, derivative)


def _class_index_derivative(input: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int, reduction: str,
                            smoothing: float, from_logits: bool, in_float32: bool = False):
    """The Tensor-level backward of cross_entropy (nll_loss) with class-index targets: the array backward's formula,
    its probabilities a softmax of the input (on the tape), the one-hot rows and class weights constants.
    in_float32: 16-bit logits that the loss computes in float32 (autocast), the gradient cast back to theirs."""
    if in_float32:
        def tensor_backward_in_float32(g: Tensor, out: Tensor) -> tuple:   # the copy made only when asked
            inner = _class_index_derivative(cast(input, float32), target, weight, ignore_index, reduction, smoothing,
                                            from_logits)
            return tuple(cast(d, input.dtype) for d in inner(g, out))
        return tensor_backward_in_float32

    def tensor_backward(g: Tensor, out: Tensor) -> tuple:
        xp, (rows, from_rows) = input.xp, _tensor_rows(input)
        M, C = rows.shape
        idx = target.data.reshape(-1).astype(xp.int64, copy=False)
        valid = idx != ignore_index
        safe = xp.where(valid, idx, 0)
        w = xp.ones(C, input.data.dtype) if weight is None else weight.data.astype(input.data.dtype, copy=False)
        tw = xp.where(valid, w[safe], 0).astype(w.dtype, copy=False)
        picked = (1 - smoothing) * tw[:, None] * (safe[:, None] == xp.arange(C)) + (smoothing / C) * valid[:, None] * w
        coef = g.reshape((M,)) if reduction == "none" else g.expand((M,))
        coef = where(Tensor(valid), coef / float(tw.sum()) if reduction == "mean" else coef, 0.0).reshape((M, 1))
        if not from_logits:
            return (from_rows(coef * Tensor(-picked)),)
        total = (1 - smoothing) * tw + (smoothing / C) * valid * w.sum()
        return (from_rows(coef * (softmax(rows, 1) * Tensor(total[:, None]) - Tensor(picked))),)
    return tensor_backward


def _tensor_rows(x: Tensor) -> tuple:
    """_rows on Tensors: x as (M, C) rows with Frost's ops, and the function that puts rows back in x's layout."""
    if x.ndim == 1:
        return x.reshape((1, x.shape[0])), lambda d: d.reshape(x.shape)
    order = (0,) + tuple(range(2, x.ndim)) + (1,)
    moved = x.permute(order)
    return moved.reshape((-1, x.shape[1])), lambda d: d.reshape(moved.shape).permute(tuple(np.argsort(order)))


def _cross_entropy_probs(input: Tensor, target: Tensor, weight: Tensor | None, reduction: str,
                         smoothing: float) -> Tensor:
    op = "cross_entropy"
    xp = input.xp
    cdt = compute_dtype(input.data)
    rows, to_input_layout = _rows(input.data.astype(cdt, copy=False), xp)
    t_rows, _ = _rows(target.data.astype(cdt, copy=False), xp)
    M, C = rows.shape
    logp = _log_softmax_rows(xp, rows)
    w_row = 1 if weight is None else weight.data.astype(cdt, copy=False)
    weighted_target = w_row * (t_rows * (1 - smoothing) + smoothing / C)
    loss = -(weighted_target * logp).sum(axis=1)
    out_shape = _class_target_shape(input)
    # the mean of probability targets divides by the number of samples, never by the weights
    out = _reduce_rows(xp, loss, reduction, M if reduction == "mean" else None, out_shape)

    def backward(g):
        coef = _row_coefficients(xp, g.astype(cdt, copy=False), reduction, M, M)[:, None]
        p = xp.exp(logp)
        d_input = coef * (p * weighted_target.sum(axis=1, keepdims=True) - weighted_target)
        d_target = coef * (-(1 - smoothing) * w_row * logp)
        return (to_input_layout(d_input).astype(input.data.dtype, copy=False),
                to_input_layout(d_target).astype(target.data.dtype, copy=False))

    return from_op(out.astype(input.data.dtype, copy=False), (input, target), backward, op)


def _reduce_rows(xp, loss, reduction: str, denom, out_shape: tuple):
    if reduction == "none":
        return loss.reshape(out_shape)
    total = xp.asarray(loss.sum())  # an array, not a NumPy scalar
    if reduction == "sum":
        return total
    with np.errstate(invalid="ignore", divide="ignore"):
        return xp.asarray(total / denom)  # 0/0 (every target ignored) is NaN, as PyTorch


def _row_coefficients(xp, g, reduction: str, denom, M: int):
    """The upstream gradient of each row's loss."""
    if reduction == "none":
        return g.reshape(-1)
    if reduction == "sum":
        return xp.broadcast_to(g, (M,))
    with np.errstate(invalid="ignore", divide="ignore"):
        return xp.broadcast_to(g / denom, (M,))


# ------------------------------------------------------------------ elementwise losses

def _reduce(xp, loss, reduction: str):
    """Reduce an elementwise loss; also return the function giving each element's upstream gradient."""
    shape, n = loss.shape, loss.size
    if reduction == "none":
        return loss, lambda g: g
    if reduction == "sum":
        return xp.asarray(loss.sum()), lambda g: xp.broadcast_to(g, shape)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = xp.asarray(loss.sum() / n)
    return mean, lambda g: xp.broadcast_to(g / n, shape)


def _pair(op: str, input: Tensor, target: Tensor, reduction: str):
    """Check a (input, target) pair of an elementwise loss; return arrays in a common float dtype."""
    _check_reduction(op, reduction)
    if not isinstance(input, Tensor):
        raise TypeError(f"{op}: input must be a Tensor, got {type(input).__name__}")
    _check_tensor(op, "target", target, input)
    if target.shape != input.shape:
        try:
            np.broadcast_shapes(input.shape, target.shape)
        except ValueError:
            raise RuntimeError(f"{op}: input of shape {input.shape} and target of shape {target.shape} "
                               f"cannot be broadcast together") from None
        warnings.warn(f"{op}: using a target size {target.shape} that is different to the input size "
                      f"{input.shape}; the two are broadcast, which is likely not what you want", stacklevel=3)
    dt = np.result_type(input.data.dtype, target.data.dtype)
    if dt.kind != "f" or dt.itemsize < 4:
        dt = np.dtype(np.float32)  # integers and half precision are computed (and summed) in float32
    return input.data.astype(dt, copy=False), target.data.astype(dt, copy=False)


def _per_element(g: Tensor, reduction: str, shape: tuple) -> Tensor:
    """_reduce's per-element gradient on Tensors."""
    if reduction == "none":
        return g
    return (g if reduction == "sum" else g / max(int(np.prod(shape)), 1)).expand(shape)


def _pair_derivative(input: Tensor, target: Tensor, d: Tensor) -> tuple:
    """_pair_grads on Tensors."""
    return (sum_to(d, input.shape).to(input.dtype) if input.requires_grad else None,
            sum_to(-d, target.shape).to(target.dtype) if target.requires_grad else None)


def _pair_grads(input: Tensor, target: Tensor, d):
    """Gradients for (input, target) from d(loss)/d(input) when the loss depends on input - target."""
    return (unbroadcast(d, input.shape).astype(input.data.dtype, copy=False),
            unbroadcast(-d, target.shape).astype(target.data.dtype, copy=False))


def mse_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """Mean squared error (input - target)^2, reduced."""
    input, target = float32_inputs(input, target)  # under autocast in float32, as PyTorch's
    x, t = _pair("mse_loss", input, target, reduction)
    xp = input.xp
    diff = x - t
    out, per_element = _reduce(xp, diff * diff, reduction)
    return from_op(out.astype(input.data.dtype, copy=False), (input, target),
                   lambda g: _pair_grads(input, target, 2 * per_element(g) * diff), "mse_loss",
                   lambda g, o: _pair_derivative(input, target,
                                                 _per_element(g, reduction, diff.shape) * (input - target) * 2))


def l1_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """Mean absolute error |input - target|, reduced."""
    input, target = float32_inputs(input, target)  # under autocast in float32, as PyTorch's
    x, t = _pair("l1_loss", input, target, reduction)
    xp = input.xp
    diff = x - t
    out, per_element = _reduce(xp, xp.abs(diff), reduction)
    return from_op(out.astype(input.data.dtype, copy=False), (input, target),
                   lambda g: _pair_grads(input, target, per_element(g) * xp.sign(diff)), "l1_loss")


def binary_cross_entropy_with_logits(input: Tensor, target: Tensor, weight: Tensor | None = None,
                                     reduction: str = "mean", pos_weight: Tensor | None = None) -> Tensor:
    """Sigmoid and binary cross entropy in one numerically stable op, as PyTorch.

    loss = -w * (pos_weight * t * log(sigmoid(x)) + (1 - t) * log(1 - sigmoid(x))), written as
    (1 - t) * x + (1 + (pos_weight - 1) * t) * softplus(-x) so that no exp overflows.
    """
    op = "binary_cross_entropy_with_logits"
    input, target, weight, pos_weight = float32_inputs(input, target, weight, pos_weight)  # as PyTorch's autocast
    _check_reduction(op, reduction)
    if not isinstance(input, Tensor):
        raise TypeError(f"{op}: input must be a Tensor, got {type(input).__name__}")
    _check_tensor(op, "target", target, input)
    if target.shape != input.shape:
        raise ValueError(f"{op}: target size {target.shape} must be the same as input size {input.shape}")
    for name, t in (("weight", weight), ("pos_weight", pos_weight)):
        if t is None:
            continue
        _check_tensor(op, name, t, input)
        if not broadcasts_to(t.shape, input.shape):
            raise RuntimeError(f"{op}: {name} of shape {t.shape} cannot be broadcast to input of shape "
                               f"{input.shape}")
    if pos_weight is not None and pos_weight.requires_grad and is_grad_enabled():
        raise RuntimeError(f"{op}: not differentiable with respect to pos_weight; pass a pos_weight that does not "
                           f"require grad (e.g. pos_weight.detach())")
    xp = input.xp
    cdt = compute_dtype(input.data)
    x = input.data.astype(cdt, copy=False)
    t = target.data.astype(cdt, copy=False)
    w = None if weight is None else weight.data.astype(cdt, copy=False)
    pw = None if pos_weight is None else pos_weight.data.astype(cdt, copy=False)
    softplus_neg_x = xp.maximum(-x, 0) + xp.log1p(xp.exp(-xp.abs(x)))  # log(1 + exp(-x)), stable
    log_weight = 1 if pw is None else 1 + (pw - 1) * t
    unweighted = (1 - t) * x + log_weight * softplus_neg_x
    loss = unweighted if w is None else unweighted * w
    out, per_element = _reduce(xp, loss, reduction)
    parents = [p for p in (input, target, weight) if p is not None]

    def backward(g):
        ge = per_element(g.astype(cdt, copy=False))
        gw = ge if w is None else ge * w
        sigmoid_neg_x = 0.5 * (1 - xp.tanh(0.5 * x))
        d_input = gw * ((1 - t) - log_weight * sigmoid_neg_x)
        d_target = gw * (-x if pw is None else -x + (pw - 1) * softplus_neg_x)
        grads = [d_input.astype(input.data.dtype, copy=False), d_target.astype(target.data.dtype, copy=False)]
        if weight is not None:
            grads.append(unbroadcast(ge * unweighted, weight.shape).astype(weight.data.dtype, copy=False))
        return grads

    derivative = _bce_logits_derivative(input, target, weight, pos_weight, reduction)
    return from_op(out.astype(input.data.dtype, copy=False), parents, backward, op, derivative)


def _bce_logits_derivative(input: Tensor, target: Tensor, weight: Tensor | None, pos_weight: Tensor | None,
                           reduction: str):
    """binary_cross_entropy_with_logits' backward on Tensors (Frost's ops; pos_weight a constant, as in its
    backward)."""
    def tensor_backward(g: Tensor, out: Tensor) -> list:
        ge = _per_element(g, reduction, input.shape)
        gw = ge if weight is None else ge * weight
        log_weight = 1 if pos_weight is None else (pos_weight - 1) * target + 1
        grads = [(gw * ((1 - target) - log_weight * sigmoid(-input))).to(input.dtype) if input.requires_grad else None,
                 None]
        if target.requires_grad:
            shift = -input if pos_weight is None else (pos_weight - 1) * softplus(-input) - input
            grads[1] = (gw * shift).to(target.dtype)
        if weight is not None:
            unweighted = (1 - target) * input + log_weight * softplus(-input)
            grads.append(sum_to(ge * unweighted, weight.shape).to(weight.dtype) if weight.requires_grad else None)
        return grads
    return tensor_backward
