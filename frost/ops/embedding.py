"""Embedding lookup: rows of a weight matrix picked by integer indices; the backward scatter-adds into the rows."""
from __future__ import annotations

import numpy as np

from frost.tensor import Tensor, from_op, can_read_values


def _check(input: Tensor, weight: Tensor, padding_idx: int | None) -> int | None:
    """Validate the lookup; return padding_idx made non-negative (or None)."""
    if not isinstance(input, Tensor) or not isinstance(weight, Tensor):
        raise TypeError(f"embedding: input and weight must be Tensors, got {type(input).__name__} "
                        f"and {type(weight).__name__}")
    if weight.ndim != 2:
        raise RuntimeError(f"embedding: weight must be 2-D (num_embeddings, embedding_dim), got shape {weight.shape}")
    if input.dtype.is_floating_point or input.dtype.name == "bool":
        raise RuntimeError(f"embedding: indices must have an integer dtype, got {input.dtype.name} "
                           f"(input of shape {input.shape})")
    if input.device != weight.device:
        raise RuntimeError(f"embedding: indices of shape {input.shape} are on {input.device} but weight of shape "
                           f"{weight.shape} is on {weight.device}")
    num = weight.shape[0]
    if padding_idx is not None:
        if not -num <= padding_idx < num:
            raise ValueError(f"embedding: padding_idx {padding_idx} must be within num_embeddings {num}")
        padding_idx %= num
    if input.numel() and can_read_values(input):
        lo, hi = int(input.data.min()), int(input.data.max())
        if lo < 0 or hi >= num:
            bad = lo if lo < 0 else hi
            raise IndexError(f"embedding: index {bad} is out of range for num_embeddings {num} "
                             f"(valid: 0..{num - 1}; max index in input {hi}, input of shape {input.shape}, "
                             f"weight of shape {weight.shape})")
    return padding_idx


def scatter_add_rows(xp, target, indices, rows) -> None:
    """target[indices[i]] += rows[i], accumulating over repeated indices."""
    try:
        xp.add.at(target, indices, rows)
    except (AttributeError, NotImplementedError):  # older CuPy has no ufunc.at
        import cupyx
        cupyx.scatter_add(target, indices, rows)


def embedding(input: Tensor, weight: Tensor, padding_idx: int | None = None, max_norm: float | None = None,
              norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False) -> Tensor:
    """weight[input]: an (*input.shape, embedding_dim) tensor; the padding_idx row gets no gradient."""
    if max_norm is not None or scale_grad_by_freq or sparse:
        raise NotImplementedError("embedding: max_norm, scale_grad_by_freq and sparse are not supported")
    padding_idx = _check(input, weight, padding_idx)
    xp = weight.xp
    idx = input.data.reshape(-1)
    dim = weight.shape[1]
    out = xp.take(weight.data, idx, axis=0).reshape(input.shape + (dim,))

    def backward(g):
        # accumulate in float32 at least: many repeated indices in half precision would lose updates
        acc_dtype = np.float32 if g.dtype.itemsize < 4 else g.dtype
        gw = xp.zeros(weight.shape, dtype=acc_dtype)
        scatter_add_rows(xp, gw, idx, g.reshape(-1, dim).astype(acc_dtype, copy=False))
        if padding_idx is not None:
            gw[padding_idx] = 0
        return (gw.astype(weight.data.dtype, copy=False),)

    return from_op(out, (weight,), backward, "embedding")
