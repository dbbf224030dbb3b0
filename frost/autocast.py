"""Mixed precision: `with frost.autocast(frost.bfloat16):` runs matmuls and convolutions in bf16 (fp32 accumulate)."""
from __future__ import annotations

import contextlib
import threading
from typing import Callable

from frost.dtype import DType, to_dtype

_state = threading.local()


def current() -> DType | None:
    """The autocast dtype in force on this thread, or None."""
    return getattr(_state, "dtype", None)


# the dtype PyTorch's autocast picks when none is given, by device type; frost's own call form defaults to bfloat16
_DEFAULT_DTYPES = {"cuda": "float16", "cpu": "bfloat16", None: "bfloat16"}


class autocast(contextlib.ContextDecorator):
    """Matmul, linear and conv2d cast float32 inputs to `dtype` (bf16 or fp16) and return `dtype` outputs.

    Weights stay float32 (the master copy); the cast is recorded by autograd, so their gradients
    arrive in float32. On the GPU the products run on tensor cores with fp32 accumulation; on the CPU
    inputs are rounded to `dtype` and multiplied in fp32, which gives the same rounding of the operands.

    Takes frost's form `autocast(frost.bfloat16)` and PyTorch's `autocast("cuda", dtype=frost.float16,
    enabled=True, cache_enabled=None)`. The device type only picks the default dtype, as in PyTorch (float16 for
    "cuda", bfloat16 for "cpu"): frost's region covers whichever device the tensors are on. cache_enabled is
    accepted and ignored (frost always reuses a region's weight casts, see cast_inputs).
    """

    def __init__(self, device_type=None, dtype=None, enabled: bool = True, cache_enabled: bool | None = None) -> None:
        kind = device_type.split(":")[0] if isinstance(device_type, str) else None
        if device_type is not None and kind not in ("cuda", "cpu"):
            if dtype is not None:
                raise ValueError(f"autocast: device_type must be 'cuda' or 'cpu', got {device_type!r}")
            kind, dtype = None, _autocast_dtype(device_type)  # frost's form: the dtype comes first
        self.device_type = kind or "cuda"
        self.dtype = to_dtype(dtype if dtype is not None else _DEFAULT_DTYPES[kind])
        if self.dtype.name not in ("bfloat16", "float16"):
            raise ValueError(f"autocast: dtype must be bfloat16 or float16, got {self.dtype!r}")
        self.enabled = bool(enabled)

    def __enter__(self):
        self.prev, self.prev_casts = current(), getattr(_state, "casts", None)
        _state.dtype = self.dtype if self.enabled else None
        _state.casts = {}  # the whole flat parameter buffers cast in this region (frost.optim.flat.cast_in_one)
        return self

    def __exit__(self, *exc) -> bool:
        _state.dtype, _state.casts = self.prev, self.prev_casts
        return False


def _autocast_dtype(first) -> DType:
    """The first argument of frost's form autocast(dtype), which is neither 'cuda' nor 'cpu'."""
    try:
        return to_dtype(first)
    except TypeError:
        raise ValueError(f"autocast: {first!r} is neither a device type ('cuda', 'cpu') nor a dtype") from None


# frost.optim.flat's cast of a whole flat parameter buffer (a layer above: it registers itself here)
_weight_cast: Callable | None = None


def register_weight_cast(cast: Callable | None) -> None:
    """Install `cast(array, dtype, casts) -> view or None`: a weight's cast as a view of one cast of the flat buffer it
    lies in, made once per region (`casts`, the region's dict); None when the array is in no such buffer."""
    global _weight_cast
    _weight_cast = cast


def weight_cast(array, dtype):
    """The registered whole-buffer cast's view of `array` in `dtype` for this region, or None (cast it alone)."""
    cast = _weight_cast
    return None if cast is None else cast(array, dtype, _state.casts)


def keep_copy(t, array) -> None:
    """Remember `array`, t's values already in a 16-bit dtype (a fast path wrote them beside t's: LayerNorm's output,
    which the next linear layer casts), for cast_inputs to take instead of casting t; unused once t changes."""
    t.__dict__["_autocast_copy"] = (t.data, t._version, array)


def kept_copy(t, dtype):
    """The copy keep_copy remembered for t when it is in `dtype` (a NumPy dtype) and t is unchanged since, else None."""
    kept = t.__dict__.get("_autocast_copy")
    fresh = kept is not None and kept[0] is t.data and kept[1] == t._version and kept[2].dtype == dtype
    return kept[2] if fresh else None
