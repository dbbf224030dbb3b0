"""Public CUDA utilities under PyTorch's names: frost.cuda.is_available(), device_count(), is_bf16_supported(),
synchronize(), memory_allocated(), max_memory_allocated(), reset_peak_memory_stats(), empty_cache(),
get_rng_state() and set_rng_state() (a GPU's Philox seed and offset: frost.random).

Without CUDA (no CuPy, no GPU) they answer as PyTorch's do on such a machine: no devices, no bf16, 0 bytes, and
synchronize() and empty_cache() do nothing, so that scripts written for both kinds of machine run on either.
Memory is counted in CuPy's default memory pool (frost.jit's graphs keep private pools, not counted here).
"""
from __future__ import annotations

from frost.backend import cuda as _backend
from frost.backend.cuda import CudaUnavailableError, is_available, device_name  # noqa: F401
from frost.random import get_cuda_rng_state as get_rng_state, set_cuda_rng_state as set_rng_state  # noqa: F401

_BF16_MAJOR = 8  # bfloat16 tensor cores (and frost's bf16 kernels) need compute capability 8.0 (Ampere) or newer


def device_count() -> int:
    """The number of GPUs CUDA sees; 0 without CUDA."""
    return _backend.cupy().cuda.runtime.getDeviceCount() if is_available() else 0


def is_bf16_supported() -> bool:
    """True when the current GPU computes in bfloat16 natively (compute capability 8.0 or newer); False without
    CUDA."""
    if not is_available():
        return False
    return int(_backend.cupy().cuda.Device().compute_capability) // 10 >= _BF16_MAJOR


def synchronize(device: int | None = None) -> None:
    """Wait for all work queued on the GPU (`device`, default the current one); nothing to wait for without CUDA."""
    if not is_available():
        return
    with _backend.cupy().cuda.Device(_index(device)):
        _backend.synchronize()


def memory_allocated(device: int | None = None) -> int:
    """Bytes in use by tensors on the GPU (`device`, default the current one); 0 without CUDA."""
    if not is_available():
        return 0
    with _backend.cupy().cuda.Device(_index(device)):
        return _backend.memory_allocated()


def max_memory_allocated(device: int | None = None) -> int:
    """The most bytes held for tensors on the GPU since the start or the last reset_peak_memory_stats(); 0 without
    CUDA. CuPy's pool keeps no peak of its used bytes, so this is the peak of what the pool holds (used plus cached
    free blocks; PyTorch's max_memory_reserved): an upper bound of PyTorch's max_memory_allocated."""
    if not is_available():
        return 0
    cp = _backend.cupy()
    with cp.cuda.Device(_index(device)):
        return cp.get_default_memory_pool().total_bytes()


def reset_peak_memory_stats(device: int | None = None) -> None:
    """Start max_memory_allocated() again from the bytes in use now: the pool gives its cached free blocks back to
    the GPU (as empty_cache() does), since what it holds is the peak it reports."""
    empty_cache(device)


def empty_cache(device: int | None = None) -> None:
    """Give the memory pool's cached free blocks back to the GPU; nothing to do without CUDA."""
    if not is_available():
        return
    cp = _backend.cupy()
    with cp.cuda.Device(_index(device)):
        cp.get_default_memory_pool().free_all_blocks()


def _index(device) -> int:
    """A device argument (None, an index, 'cuda:N' or a Device) as the GPU's index."""
    if device is None:
        return _backend.cupy().cuda.runtime.getDevice()
    if isinstance(device, int):
        return device
    text = str(device)
    if not text.startswith("cuda"):
        raise ValueError(f"frost.cuda: expected a CUDA device (an index, 'cuda' or 'cuda:N'), got {device!r}")
    return int(text.partition(":")[2] or 0)
