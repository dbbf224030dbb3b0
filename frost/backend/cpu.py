"""The CPU backend: NumPy arrays and Frost's CPU random generator."""
from __future__ import annotations

import ctypes
import sys

import numpy as np

_generator = np.random.default_rng(0)


def _reuse_freed_memory() -> None:
    """Keep freed large arrays in glibc's heap instead of unmapping them: every training step allocates
    the same big temporaries (im2col columns, activations), and fresh pages cost a page fault each, which
    made CPU convolutions up to 2x slower. Opt out with FROST_KEEP_MALLOC=1."""
    import os
    if not sys.platform.startswith("linux") or os.environ.get("FROST_KEEP_MALLOC"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 256 << 20)  # M_MMAP_THRESHOLD: blocks below 256 MiB come from the heap
        libc.mallopt(-1, 1 << 30)    # M_TRIM_THRESHOLD: keep up to 1 GiB free at the top of the heap
    except (OSError, AttributeError):  # not glibc (musl, ...): keep the defaults
        pass


_reuse_freed_memory()


def generator() -> np.random.Generator:
    """The global CPU random generator (reseeded by frost.manual_seed)."""
    return _generator


def manual_seed(seed: int) -> None:
    global _generator
    _generator = np.random.default_rng(seed)
