"""MultiheadAttention, with PyTorch's parameter layout (in_proj_weight, in_proj_bias, out_proj)."""
from __future__ import annotations

import math

from frost.nn import init
from frost.nn.linear import NonDynamicallyQuantizableLinear
from frost.nn.module import Module, Parameter
from frost.ops.attention import scaled_dot_product_attention
from frost.ops.matmul import linear, matmul
from frost.ops.random import dropout
from frost.ops.reduce import softmax
from frost.tensor import Tensor, empty


class MultiheadAttention(Module):
    """Multi-head attention as torch.nn.MultiheadAttention; its state dicts load across by name.

    Inputs are (L, N, E) (or (N, L, E) with batch_first=True, or unbatched (L, E)). Masks follow PyTorch:
    a bool attn_mask / key_padding_mask is True where attention is NOT allowed, a float one is added to
    the scores. is_causal=True without attn_mask builds the causal mask (PyTorch requires the mask).
    With need_weights=False the attention runs through scaled_dot_product_attention and the returned
    weights are None. add_bias_kv and add_zero_attn are not supported.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = False, device=None, dtype=None) -> None:
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be greater than 0, got embed_dim={embed_dim} "
                             f"and num_heads={num_heads} instead")
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        if add_bias_kv or add_zero_attn:
            raise NotImplementedError("MultiheadAttention: add_bias_kv and add_zero_attn are not supported in frost")
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        kw, same = dict(device=device, dtype=dtype), self._qkv_same_embed_dim
        for name, shape, wanted in (("in_proj_weight", (3 * embed_dim, embed_dim), same),
                                    ("q_proj_weight", (embed_dim, embed_dim), not same),
                                    ("k_proj_weight", (embed_dim, self.kdim), not same),
                                    ("v_proj_weight", (embed_dim, self.vdim), not same),
                                    ("in_proj_bias", (3 * embed_dim,), bias)):
            self.register_parameter(name, Parameter(empty(shape, **kw)) if wanted else None)
        self.out_proj = NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias, **kw)
        self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            init.xavier_uniform_(self.q_proj_weight)
            init.xavier_uniform_(self.k_proj_weight)
            init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            init.zeros_(self.in_proj_bias)
            init.zeros_(self.out_proj.bias)

    def _project(self, query: Tensor, key: Tensor, value: Tensor):
        E = self.embed_dim
        b = self.in_proj_bias
        bq, bk, bv = (None, None, None) if b is None else (b[:E], b[E:2 * E], b[2 * E:])
        if self._qkv_same_embed_dim:
            if query is key and key is value:  # self-attention: one matmul for q, k and v
                return linear(query, self.in_proj_weight, b).chunk(3, dim=-1)
            w = self.in_proj_weight
            wq, wk, wv = w[:E], w[E:2 * E], w[2 * E:]
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        return linear(query, wq, bq), linear(key, wk, bk), linear(value, wv, bv)

    def _additive_mask(self, attn_mask, key_padding_mask, is_causal: bool, N: int, L: int, S: int, like: Tensor):
        """One float mask broadcastable to (N, H, L, S) (or None) from PyTorch's mask conventions."""
        xp, dt = like.xp, like.data.dtype

        def as_float(mask: Tensor):
            m = mask.data
            if m.dtype == bool:
                return xp.where(m, xp.asarray(-math.inf, dtype=dt), xp.asarray(0, dtype=dt))
            if m.dtype.kind != "f" and str(m.dtype) != "bfloat16":
                raise TypeError(f"MultiheadAttention: masks must be bool or floating point, got {mask.dtype!r}")
            return m.astype(dt, copy=False)

        total = None
        if attn_mask is None and is_causal:
            total = xp.triu(xp.full((L, S), -math.inf, dtype=dt), k=1)
        elif attn_mask is not None:
            total = as_float(attn_mask)
            if total.shape == (L, S):
                pass
            elif total.shape == (N * self.num_heads, L, S):
                total = total.reshape(N, self.num_heads, L, S)
            else:
                raise RuntimeError(f"MultiheadAttention: attn_mask of shape {tuple(total.shape)} should be "
                                   f"({L}, {S}) or ({N * self.num_heads}, {L}, {S})")
        if key_padding_mask is not None:
            if tuple(key_padding_mask.shape) != (N, S):
                raise RuntimeError(f"MultiheadAttention: key_padding_mask of shape {key_padding_mask.shape} "
                                   f"should be ({N}, {S})")
            kpm = as_float(key_padding_mask).reshape(N, 1, 1, S)
            total = kpm if total is None else total + kpm
        return None if total is None else Tensor(total)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor | None = None,
                need_weights: bool = True, attn_mask: Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False):
        batched = query.ndim == 3
        if query.ndim not in (2, 3) or key.ndim != query.ndim or value.ndim != query.ndim:
            raise RuntimeError(f"MultiheadAttention: query, key and value must all be 2-D (unbatched) or 3-D, got "
                               f"shapes {query.shape}, {key.shape}, {value.shape}")
        if query.shape[-1] != self.embed_dim:
            raise RuntimeError(f"MultiheadAttention: query of shape {query.shape} should have embed_dim="
                               f"{self.embed_dim} features")
        if not batched:
            query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif not self.batch_first:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        N, L, _ = query.shape
        S = key.shape[1]
        H, D = self.num_heads, self.head_dim
        q, k, v = self._project(query, key, value)
        q = q.reshape(N, L, H, D).transpose(1, 2)
        k = k.reshape(N, S, H, D).transpose(1, 2)
        v = v.reshape(N, S, H, D).transpose(1, 2)
        p = self.dropout if self.training else 0.0
        weights = None
        if need_weights:
            mask = self._additive_mask(attn_mask, key_padding_mask, is_causal, N, L, S, q)
            scores = matmul(q * (1.0 / math.sqrt(D)), k.transpose(-2, -1))
            if mask is not None:
                scores = scores + mask
            weights = dropout(softmax(scores, -1), p, training=p > 0)
            out = matmul(weights, v)
            if average_attn_weights:
                weights = weights.mean(1)
            if not batched:
                weights = weights.squeeze(0)
        elif attn_mask is None and key_padding_mask is None and is_causal:
            out = scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            mask = self._additive_mask(attn_mask, key_padding_mask, is_causal, N, L, S, q)
            out = scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        out = self.out_proj(out.transpose(1, 2).reshape(N, L, self.embed_dim))
        if not batched:
            out = out.squeeze(0)
        elif not self.batch_first:
            out = out.transpose(0, 1)
        return out, weights
