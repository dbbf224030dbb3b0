"""Scaled dot-product attention, composed from frost ops (matmul, masking, softmax, dropout) so autograd is free."""
from __future__ import annotations

import math

import numpy as np

from frost import dispatch
from frost.ops.elementwise import cast, where
from frost.ops.matmul import matmul
from frost.ops.random import dropout
from frost.ops.reduce import normalize_dims
from frost.ops.shape import expand, reshape, transpose, unsqueeze
from frost.tensor import Tensor, from_op


def _check(query: Tensor, key: Tensor, value: Tensor, attn_mask, is_causal: bool, enable_gqa: bool) -> None:
    op = "scaled_dot_product_attention"
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: {name} must be a Tensor, got {type(t).__name__}")
        if t.ndim < 2:
            raise RuntimeError(f"{op}: {name} must have at least 2 dims (..., L, E), got shape {t.shape}")
    if query.shape[-1] != key.shape[-1]:
        raise RuntimeError(f"{op}: query of shape {query.shape} and key of shape {key.shape} must have the same "
                           f"embedding size (last dim)")
    if key.shape[-2] != value.shape[-2]:
        raise RuntimeError(f"{op}: key of shape {key.shape} and value of shape {value.shape} must have the same "
                           f"sequence length (dim -2)")
    if is_causal and attn_mask is not None:
        raise RuntimeError(f"{op}: an explicit attn_mask must not be given when is_causal=True")
    if attn_mask is not None and attn_mask.dtype.name != "bool" and not attn_mask.dtype.is_floating_point:
        # an integer 0/1 mask would be added to the scores, not applied as keep/drop: refuse it, as PyTorch
        raise RuntimeError(f"{op}: attn_mask must be bool (True = attend) or floating point (added to the "
                           f"scores), got attn_mask of dtype {attn_mask.dtype!r} and shape {attn_mask.shape}; "
                           f"convert a 0/1 mask with mask.bool()")
    if enable_gqa and (query.ndim < 3 or key.shape[-3] == 0 or query.shape[-3] % key.shape[-3]
                       or key.shape[-3] != value.shape[-3]):
        raise RuntimeError(f"{op}: with enable_gqa the query heads (dim -3 of {query.shape}) must be a multiple "
                           f"of the key/value heads (dim -3 of {key.shape} and {value.shape})")


def _repeat_heads(t: Tensor, times: int) -> Tensor:
    """Repeat each head (dim -3) `times` times in place, as torch.repeat_interleave(times, dim=-3)."""
    if times == 1:
        return t
    *batch, heads, length, dim = t.shape
    grown = expand(unsqueeze(t, -3), tuple(batch) + (heads, times, length, dim))
    return reshape(grown, tuple(batch) + (heads * times, length, dim))


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Tensor:
    """softmax(query @ key^T * scale + mask) @ value over shapes (..., L, E), (..., S, E), (..., S, Ev).

    A boolean attn_mask marks the positions that may be attended (True = keep); a float mask is added to the
    scores. is_causal masks the upper triangle (top-left aligned, as PyTorch). Rows where every position is
    masked give zeros, as PyTorch's math backend.
    """
    _check(query, key, value, attn_mask, is_causal, enable_gqa)
    # the acceleration layer's fused kernels where they apply (frost/accel/flash_attention.py): no L x S matrix
    fast = dispatch.lookup("scaled_dot_product_attention", query, key, value, attn_mask=attn_mask,
                           dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    if fast is not None:
        return fast(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if enable_gqa:
        key = _repeat_heads(key, query.shape[-3] // key.shape[-3])
        value = _repeat_heads(value, query.shape[-3] // value.shape[-3])
    L, S = query.shape[-2], key.shape[-2]
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = matmul(query, transpose(key, -2, -1)) * scale
    if is_causal:
        allowed = query.xp.tril(query.xp.ones((L, S), dtype=bool))
        scores = where(Tensor(allowed), scores, float("-inf"))
    elif attn_mask is not None:
        if attn_mask.dtype.name == "bool":
            scores = where(attn_mask, scores, float("-inf"))
        else:
            # an additive mask must not widen the scores' dtype (PyTorch refuses a mismatch; frost casts)
            scores = scores + (attn_mask if attn_mask.dtype == scores.dtype else cast(attn_mask, scores.dtype))
    weights = safe_softmax(scores, -1)
    if dropout_p > 0.0:
        weights = dropout(weights, dropout_p, training=True)
    return matmul(weights, value)


def safe_softmax(x: Tensor, dim: int) -> Tensor:
    """Softmax that gives 0 (not NaN) on slices where every input is -inf (fully masked attention rows)."""
    xp = x.xp
    (axis,) = normalize_dims(dim, x.ndim, "safe_softmax")
    if x.shape[axis] == 0:
        # nothing to normalize (attention over zero keys): max() has no identity, the result is empty anyway
        return from_op(xp.empty_like(x.data), (x,), lambda g: (xp.zeros_like(x.data),), "safe_softmax")
    m = x.data.max(axis=axis, keepdims=True)
    m = xp.where(xp.isfinite(m), m, 0)
    e = xp.exp(x.data - m)
    total = e.sum(axis=axis, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = xp.where(total > 0, e / total, 0).astype(x.data.dtype, copy=False)

    def backward(g):
        return ((out * (g - (g * out).sum(axis=axis, keepdims=True))).astype(x.data.dtype, copy=False),)

    return from_op(out, (x,), backward, "safe_softmax")
