"""Mixed precision: `with frost.autocast(frost.bfloat16):` runs matmuls and convolutions in bf16 (fp32 accumulate)."""
from __future__ import annotations

import contextlib
import threading

from frost.dtype import DType, float32, to_dtype

_state = threading.local()


def current() -> DType | None:
    """The autocast dtype in force on this thread, or None."""
    return getattr(_state, "dtype", None)


class autocast(contextlib.ContextDecorator):
    """Matmul, linear and conv2d cast float32 inputs to `dtype` (bf16 or fp16) and return `dtype` outputs.

    Weights stay float32 (the master copy); the cast is recorded by autograd, so their gradients
    arrive in float32. On the GPU the products run on tensor cores with fp32 accumulation; on the CPU
    inputs are rounded to `dtype` and multiplied in fp32, which gives the same rounding of the operands.
    """

    def __init__(self, dtype=None, enabled: bool = True) -> None:
        from frost.dtype import bfloat16
        self.dtype = to_dtype(dtype) if dtype is not None else bfloat16
        if self.dtype.name not in ("bfloat16", "float16"):
            raise ValueError(f"autocast: dtype must be bfloat16 or float16, got {self.dtype!r}")
        self.enabled = enabled

    def __enter__(self):
        self.prev, self.prev_casts = current(), getattr(_state, "casts", None)
        _state.dtype = self.dtype if self.enabled else None
        _state.casts = {}  # the whole flat parameter buffers cast in this region (frost.optim.flat.cast_in_one)
        return self

    def __exit__(self, *exc) -> bool:
        _state.dtype, _state.casts = self.prev, self.prev_casts
        return False


def cast_inputs(*tensors):
    """Under autocast, float32 tensors become the autocast dtype (others pass through); else unchanged.

    Parameters that live in an optimizer's flat buffer (frost.optim.flat) are cast with their whole buffer, once
    per autocast region (one launch for all weights of a step, as PyTorch's autocast caches its weight casts for
    the region): modifying those weights inside the region is not seen by later casts in it."""
    dt = current()
    if dt is None:
        return tensors
    from frost.ops.elementwise import cast
    from frost.optim.flat import cast_in_one
    from frost.tensor import Tensor
    out = []
    for t in tensors:
        if isinstance(t, Tensor) and t.dtype == float32:
            view = cast_in_one(t.data, dt.np, _state.casts) if t._ctx is None and t.requires_grad else None
            t = cast(t, dt, out=view)
        out.append(t)
    return tuple(out)


def float32_inputs(*tensors):
    """Under autocast, half-precision tensors go back to float32 (the losses, softmax and log_softmax call this: they
    want the range, and PyTorch's autocast runs them in float32); else unchanged (None passes through)."""
    if current() is None:
        return tensors
    from frost.ops.elementwise import cast
    from frost.tensor import Tensor
    return tuple(cast(t, float32) if isinstance(t, Tensor) and t.dtype.name in ("bfloat16", "float16") else t
                 for t in tensors)
