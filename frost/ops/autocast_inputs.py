"""The casts autocast makes at an op's inputs: matmuls and convolutions take the region's dtype (cast_inputs), losses
and softmax go back to float32 (float32_inputs). The region itself (which dtype, on which thread) is frost.autocast."""
from __future__ import annotations

from frost.autocast import current, weight_cast
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
            view = weight_cast(t.data, dt.np) if t._ctx is None and t.requires_grad else None
            t = cast(t, dt, out=view)
        out.append(t)
    return tuple(out)


def float32_dtype(t: Tensor):
    """The dtype float32_inputs gives t: float32 for a half-precision tensor under autocast, else t's own."""
    return float32 if current() is not None and t.dtype.name in ("bfloat16", "float16") else t.dtype


def float32_inputs(*tensors):
    """Under autocast, half-precision tensors go back to float32 (the losses, softmax and log_softmax call this: they
    want the range, and PyTorch's autocast runs them in float32); else unchanged (None passes through)."""
    return tuple(cast(t, float32_dtype(t)) if isinstance(t, Tensor) else t for t in tensors)
