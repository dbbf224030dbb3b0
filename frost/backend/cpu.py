"""The CPU backend: NumPy arrays and Frost's CPU random generator."""
from __future__ import annotations

import contextlib
import ctypes
import sys
import threading
from typing import Iterator

import numpy as np

_generator = np.random.default_rng(0)
_this_thread = threading.local()  # .generator: the generator this thread draws from instead (a loader's batch)


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
    """The CPU random generator: the global one (reseeded by frost.manual_seed), or the one `use_generator` set for
    the calling thread."""
    own = getattr(_this_thread, "generator", None)
    return _generator if own is None else own


@contextlib.contextmanager
def use_generator(rng: np.random.Generator) -> Iterator[np.random.Generator]:
    """Make the calling thread draw from `rng` inside the block (other threads keep theirs): a DataLoader builds
    each batch under a generator of its own, so that random augmentation depends on the seed and the batch,
    never on which worker thread ran first."""
    previous = getattr(_this_thread, "generator", None)
    _this_thread.generator = rng
    try:
        yield rng
    finally:
        _this_thread.generator = previous


def manual_seed(seed: int) -> None:
    global _generator
    _generator = np.random.default_rng(seed)
