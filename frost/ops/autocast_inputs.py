"""The casts autocast makes at an op's inputs: matmuls and convolutions take the region's dtype (cast_inputs), losses
and softmax go back to float32 (float32_inputs). The region itself (which dtype, on which thread) is frost.autocast."""
from __future__ import annotations

from frost.autocast import current, kept_copy, weight_cast
from frost.autograd import grad_destination
from frost.dtype import float32
from frost.ops.elementwise import cast
from frost.tensor import Tensor


def cast_inputs(*tensors):
    """Under autocast, float32 tensors become the autocast dtype (others pass through); else unchanged.

    Parameters that live in an optimizer's flat buffer (frost.optim.flat) are cast with their whole buffer, once
    per autocast region (one launch for all weights of a step, as PyTorch's autocast caches its weight casts for
    the region): modifying those weights inside the region is not seen by later casts in it."""
    dt = current()
    if dt is None:
        return tensors
    out = []
    for t in tensors:
        if isinstance(t, Tensor) and t.dtype == float32:
            view = weight_cast(t.data, dt.np) if t._ctx is None and t.requires_grad else kept_copy(t, dt.np)
            t = cast(t, dt, out=view)
        out.append(t)
    return tuple(out)


def cast_source(t: Tensor) -> Tensor | None:
    """The float32 tensor that 16-bit tensor t was cast from (autocast's cast of a weight or of an activation), or
    None: a product's backward may write that tensor's gradient in float32 at once (a leaf's into its .grad), and the
    cast's backward passes it on uncast (a LayerNorm's backward then reads no 16-bit copy)."""
    node = t._ctx
    if node is None or node.name != "cast" or not node.parents or t.dtype.name not in ("bfloat16", "float16"):
        return None
    source = node.parents[0]
    return source if source.requires_grad and source.dtype == float32 else None


def gradient_out(t: Tensor, xp) -> tuple:
    """(out, claimed) for a backward that writes t's gradient as a product: claimed, t's zeroed .grad it may write
    into (grad_destination), or None; out, that claim, else for autocast's cast of a float32 tensor a leaf's claim or
    a new float32 array (the product taken in float32, not rounded to 16 bits and cast back), else None."""
    source = cast_source(t)
    claimed = grad_destination(t if source is None else source)
    if claimed is None and source is not None:
        return xp.empty(t.shape, dtype=source.data.dtype), None
    return claimed, claimed


def float32_dtype(t: Tensor):
    """The dtype float32_inputs gives t: float32 for a half-precision tensor under autocast, else t's own."""
    return float32 if current() is not None and t.dtype.name in ("bfloat16", "float16") else t.dtype


def float32_inputs(*tensors):
    """Under autocast, half-precision tensors go back to float32 (the losses, softmax and log_softmax call this: they
    want the range, and PyTorch's autocast runs them in float32); else unchanged (None passes through)."""
    return tuple(cast(t, float32_dtype(t)) if isinstance(t, Tensor) else t for t in tensors)
