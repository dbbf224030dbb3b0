"""Float64 oracles and tolerances shared by the attention tests (the flash kernels', cuDNN's graphs'). Imported by
name: pytest puts each test folder on sys.path."""
import ml_dtypes
import numpy as np
import torch
import torch.nn.functional as F

# Unit roundoff of the 16-bit types. O = sum_j P_j V_j with every P_j rounded to the input type (relative error u
# each) and O rounded once more: |O - O64| <= ~2u max|V|; the gradients are sums of products of one or two rounded
# factors (P or dS) with the inputs, then rounded: a few u of their own size. ERR_UNITS is that allowance.
UNIT = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}
DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
ERR_UNITS = 4


def inputs(rng, b, hq, hkv, lq, lk, d, dtype):
    make = lambda *shape: rng.standard_normal(shape).astype(DTYPES[dtype])   # noqa: E731
    return make(b, hq, lq, d), make(b, hkv, lk, d), make(b, hkv, lk, d), make(b, hq, lq, d)


def reference(q, k, v, do, causal, group, mask):
    """PyTorch float64 on the same 16-bit values: (O, log-sum-exp, dQ, dK, dV)."""
    tq, tk, tv = (torch.tensor(a.astype(np.float64), requires_grad=True) for a in (q, k, v))
    lq, lk = q.shape[2], k.shape[2]
    keep = torch.ones(lq, lk, dtype=torch.bool).tril() if causal else torch.ones(lq, lk, dtype=torch.bool)
    if mask is not None:
        keep = keep & torch.tensor(mask)[:, None, None, :]
    out = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=keep, enable_gqa=group > 1)
    scores = tq @ tk.repeat_interleave(group, dim=1).transpose(-1, -2) / np.sqrt(q.shape[-1])
    lse = torch.logsumexp(scores.masked_fill(~keep, -np.inf), dim=-1)
    out.backward(torch.tensor(do.astype(np.float64)))
    return [t.detach().numpy() for t in (out, lse, tq.grad, tk.grad, tv.grad)]


def assert_close(name, got, want, composed, unit):
    """got within ERR_UNITS u of the values' size of the float64 reference, and no worse than twice the composed
    path's own error (plus one u)."""
    got = got.astype(np.float64)
    size = max(np.abs(want).max(), 1.0)
    err = np.abs(got - want).max()
    assert np.isfinite(got).all(), f"{name}: non-finite values"
    assert err <= ERR_UNITS * unit * size, f"{name}: error {err:.3g} > {ERR_UNITS} u x {size:.3g}"
    if composed is not None:
        assert err <= 2 * np.abs(composed - want).max() + unit * size, f"{name}: error {err:.3g} vs composed"


def reference_with_dropout(q, k, v, do, causal, group, keep):
    """float64 attention with dropout multipliers `keep` (B, H, Lq, Lk) on the weights: (O, dQ, dK, dV), the
    gradients by the chain rule written out (dropout's mask is not PyTorch's, so no PyTorch oracle here)."""
    q, k, v, do = (a.astype(np.float64) for a in (q, k, v, do))
    kr, vr = (np.repeat(a, group, axis=1) for a in (k, v))
    scale = 1 / np.sqrt(q.shape[-1])
    scores = q @ kr.transpose(0, 1, 3, 2) * scale
    if causal:
        scores = np.where(np.tri(q.shape[2], k.shape[2], dtype=bool), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    dropped = weights * keep
    out = dropped @ vr
    dv = (dropped.transpose(0, 1, 3, 2) @ do).reshape(v.shape[0], v.shape[1], group, *v.shape[2:]).sum(2)
    dweights = (do @ vr.transpose(0, 1, 3, 2)) * keep
    dscores = weights * (dweights - (do * out).sum(-1, keepdims=True))
    dq = dscores @ kr * scale
    dk = (dscores.transpose(0, 1, 3, 2) @ q * scale).reshape(k.shape[0], k.shape[1], group, *k.shape[2:]).sum(2)
    return out, dq, dk, dv
