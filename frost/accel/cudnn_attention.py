"""Attention through cuDNN's fused SDPA graphs (the cuDNN frontend), registered for scaled_dot_product_attention on
CUDA ahead of Frost's own flash kernels (frost/accel/flash_attention.py) where both apply.

Why first: on an H100 at 16 x 12 x 1024 x 64 (bf16), cuDNN's forward takes 0.135 ms and forward + backward 0.543
against the flash kernels' 0.488 and 1.627 (benchmarks/flash_attention.py --quick, results/flash_attention_quick_
h100_7f449ca.json): until Frost's kernels catch up, the GPT trains on cuDNN's. FROST_CUDNN_ATTENTION=0 (read at each
call) hands every call to the flash kernels, or to the composed path where they decline.

It takes what the flash kernels take (problem(): bf16 or f16, head dim 64 or 128, causal top-left aligned,
grouped-query heads, dropout) except masks, which stay the flash kernels'. The layouts are those of the flash
kernels too: q, k and v are read where they lie (heads sliced out of one projection), O is written (B, L, H, D), and
the gradients of q, k and v sliced out of one tensor share one block (gradients_like).

Dropout draws cuDNN's own mask (Philox, its counter scheme) from a snapshot of Frost's CUDA generator: seed = the
generator's key (a stream apart: STREAM xor-ed into its high word), offset = its counter, then the generator moves
past B x H x Lq x Lk counters (one per weight, as PyTorch reserves for cuDNN). The backward regenerates the mask
from the same snapshot; a captured step draws a new one on each replay. The mask is not the flash kernels' one
(dropout_keep_numpy), so the two paths agree in distribution, not element by element.
"""
import os

from frost import backends, dispatch, layout
from frost.accel.flash_attention import DTYPES, gradients_like, output_blhd, problem
from frost.backend import cuda, cudnn
from frost.kernel.compile import has_mma
from frost.tensor import Tensor, from_op

STREAM = 0x6344_6E6E   # xor-ed into the key's high word: cuDNN's draws are a stream apart from the generator's own
MAX_RESERVED = (1 << 32) - 1   # philox_reserve takes a 32-bit count


_checked: dict = {}   # call signature -> whether cuDNN builds its forward and backward graphs


def _readable(a) -> bool:
    """Whether cuDNN reads a where it lies: the head dim dense, every other stride a whole number of 16-byte vectors
    from a 16-byte aligned start."""
    return a.strides[3] == a.itemsize and layout.data_ptr(a) % 16 == 0 and all(
        s > 0 and s % 16 == 0 for s, n in zip(a.strides[:3], a.shape[:3]) if n > 1)


def _dense_rows(cp, a):
    """a, or a C-order copy where cuDNN cannot read it (_readable)."""
    return a if _readable(a) else cp.ascontiguousarray(a)


def _signature(tensors: tuple, p) -> tuple:
    """What decides whether cuDNN builds a call's graphs: shapes, the layouts it reads, dtype, mask, dropout."""
    layouts = tuple((t.shape, t.data.strides if _readable(t.data) else None) for t in tensors)
    return layouts, tensors[0].dtype.name, p.causal, p.dropout_p, backends.deterministic


def _cudnn_builds(tensors: tuple, p) -> bool:
    """Whether cuDNN builds both graphs of this call (asked once per signature, on arrays laid out as the call's
    will be: its cost is a few allocations and graph builds, which the first call would pay anyway)."""
    signature = _signature(tensors, p)
    if signature not in _checked:
        cp = tensors[0].xp
        q, k, v = (_dense_rows(cp, t.data) for t in tensors)
        o = output_blhd(cp, p, q.dtype)
        lse = cp.empty((p.batch, p.heads, p.lq, 1), "float32")
        dq, dk, dv = gradients_like(cp, (q, k, v))
        # dO: the gradient of O arrives laid out as O (the (B, L, H x D) input of the output projection)
        _checked[signature] = cudnn.attention_supported(q, k, v, o, lse, o, dq, dk, dv, p.scale, p.causal,
                                                        p.dropout_p)
    return _checked[signature]


def cudnn_attention(query: Tensor, key: Tensor, value: Tensor, is_causal: bool = False, scale: float | None = None,
                    enable_gqa: bool = False, dropout_p: float = 0.0) -> Tensor:
    """dropout(softmax(query @ key^T * scale)) @ value by cuDNN's fused graphs, forward and backward (CUDA tensors:
    query (B, H, Lq, D), key and value (B, H // group, Lk, D), bf16 or f16, D 64 or 128)."""
    p = problem(query, key, value, is_causal, scale, enable_gqa, False, dropout_p, op="cudnn_attention")
    cp = query.xp
    q, k, v = (_dense_rows(cp, t.data) for t in (query, key, value))
    o = output_blhd(cp, p, q.dtype)
    lse = cp.empty((p.batch, p.heads, p.lq, 1), "float32")
    rng = None
    if p.dropout_p > 0.0:
        rng = cuda.generator().reserve(min(p.batch * p.heads * p.lq * p.lk, MAX_RESERVED), STREAM)
    cudnn.attention_forward(q, k, v, o, lse, p.scale, p.causal, p.dropout_p, rng)

    def backward(g):
        dq, dk, dv = gradients_like(cp, (q, k, v))
        cudnn.attention_backward(q, k, v, o, _dense_rows(cp, g), lse, dq, dk, dv, p.scale, p.causal, p.dropout_p,
                                 rng)
        return dq, dk, dv

    backward.fresh_gradients = True   # gradients_like's new arrays: a leaf keeps them as they are
    return from_op(o, (query, key, value), backward, "cudnn_attention")


def supported(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0,
              is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> bool:
    """Whether cudnn_attention computes this scaled_dot_product_attention call: CUDA tensors on a GPU with bf16
    tensor cores, the cuDNN frontend installed, no mask, dropout_p below 1, problem()'s rules, and cuDNN building
    the call's graphs (else the flash kernels take it). FROST_CUDNN_ATTENTION=0 (read at each call) switches it
    off."""
    if os.environ.get("FROST_CUDNN_ATTENTION", "1") == "0" or attn_mask is not None or not 0.0 <= dropout_p < 1.0:
        return False
    tensors = (query, key, value)
    if any(not isinstance(t, Tensor) or t.device.type != "cuda" or t.ndim != 4 for t in tensors):
        return False
    try:
        p = problem(query, key, value, is_causal, None, enable_gqa, False, dropout_p)
    except ValueError:
        return False
    return has_mma(query.data) and cudnn.available() and _cudnn_builds(tensors, p)


@dispatch.register("scaled_dot_product_attention", device="cuda", dtypes=DTYPES, applies=supported, priority=1)
def scaled_dot_product_attention_cudnn(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                       dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                       enable_gqa: bool = False) -> Tensor:
    """scaled_dot_product_attention by cuDNN's fused graphs (no attn_mask: `supported` has checked)."""
    return cudnn_attention(query, key, value, is_causal, scale, enable_gqa, dropout_p)
