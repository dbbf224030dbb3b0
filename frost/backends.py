"""Global backend switches, PyTorch-style: frost.backends.allow_tf32 and deterministic, also under PyTorch's names
frost.backends.cuda.matmul.allow_tf32, frost.backends.cudnn.allow_tf32 / deterministic / benchmark and
frost.set_float32_matmul_precision.

Frost has one TF32 switch for matmuls and convolutions together: setting either of PyTorch's two flags sets both
(PyTorch's defaults differ: matmuls off, convolutions on; frost's is on for both).
"""
from __future__ import annotations

import importlib.util
import sys

# TF32 tensor cores for float32 matmuls and convolutions on the GPU (as PyTorch does for convolutions).
allow_tf32 = True

# Only deterministic algorithms (cuDNN plans without atomics), so that two runs give identical bits.
deterministic = False

_PRECISIONS = ("highest", "high", "medium")


class _Switch:
    """A module switch under another name: reading or setting the attribute reads or sets frost.backends.<name>."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj, objtype=None) -> bool:
        return getattr(sys.modules[__name__], self.name)

    def __set__(self, obj, value: bool) -> None:
        setattr(sys.modules[__name__], self.name, bool(value))


class _Matmul:
    allow_tf32 = _Switch("allow_tf32")
    # float16 and bfloat16 products always accumulate in float32 on frost's paths; the flags are PyTorch's surface
    allow_fp16_reduced_precision_reduction = False
    allow_bf16_reduced_precision_reduction = False


class _Cuda:
    matmul = _Matmul()


class _Cudnn:
    allow_tf32 = _Switch("allow_tf32")
    deterministic = _Switch("deterministic")
    benchmark = False  # frost picks and remembers its plans itself (frost.backend.remembered); accepted, ignored
    enabled = True

    @staticmethod
    def is_available() -> bool:
        # whether the cuDNN frontend is installed; frost.backend.cudnn reads these switches, so this module must not
        # import it (a circle)
        return importlib.util.find_spec("cudnn") is not None


cuda = _Cuda()
cudnn = _Cudnn()


def set_float32_matmul_precision(precision: str) -> None:
    """PyTorch's switch: "highest" turns TF32 off (plain float32 products), "high" and "medium" turn it on (frost has
    no bfloat16-based float32 mode, so "medium" is TF32 as "high")."""
    global allow_tf32
    if precision not in _PRECISIONS:
        raise ValueError(f"set_float32_matmul_precision: precision must be one of {list(_PRECISIONS)}, got "
                         f"{precision!r}")
    allow_tf32 = precision != "highest"


def get_float32_matmul_precision() -> str:
    """"high" while TF32 is on (frost's default), "highest" while it is off."""
    return "high" if allow_tf32 else "highest"
