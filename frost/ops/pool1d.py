"""1-D pooling (max, average, adaptive average and adaptive max) over (N, C, L) or (C, L) inputs: each is the 2-D
pool of frost.ops.pool on the input seen as a plane of height 1 (a window of height 1), on the CPU and on CUDA."""
from __future__ import annotations

import numpy as np

from frost.ops.pool import (_out_size, adaptive_avg_pool2d, adaptive_max_pool2d, avg_pool2d, max_pool2d)
from frost.tensor import Tensor


def _single(value, name: str, what: str) -> int:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, (tuple, list)) and len(value) == 1:
        return _single(value[0], name, what)
    raise ValueError(f"{name}: {what} must be an int or a 1-tuple of ints, got {value!r}")


def _check_input(x: Tensor, name: str) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a Tensor, got {type(x).__name__}")
    if x.ndim not in (2, 3):
        raise RuntimeError(f"{name}: expected a 2-D (C, L) or 3-D (N, C, L) input, got shape {x.shape}")


def _geometry(x: Tensor, name: str, kernel_size, stride, padding, dilation, ceil_mode: bool) -> tuple:
    """Kernel, stride, padding and dilation as the (1, n) pairs of the 2-D pools, checked with 1-D messages."""
    k = _single(kernel_size, name, "kernel_size")
    s = k if stride is None or stride == () or stride == [] else _single(stride, name, "stride")
    p, d = _single(padding, name, "padding"), _single(dilation, name, "dilation")
    if min(k, s, d) < 1 or p < 0:
        raise ValueError(f"{name}: kernel_size, stride and dilation must be positive and padding non-negative, got "
                         f"kernel_size={kernel_size!r} stride={stride!r} padding={padding!r} dilation={dilation!r}")
    if p > k // 2:
        raise RuntimeError(f"{name}: padding {p} should be at most half of the kernel size {k}")
    if _out_size(x.shape[-1], k, s, p, d, ceil_mode) <= 0:
        raise RuntimeError(f"{name}: output length is too small for input {x.shape} with kernel {k}, stride {s}, "
                           f"padding {p}, dilation {d}")
    return (1, k), (1, s), (0, p), (1, d)


def _squeezed(out):
    """The 2-D pool's result (and indices) without the height-1 dimension."""
    if isinstance(out, tuple):
        return tuple(o.squeeze(-2) for o in out)
    return out.squeeze(-2)


def max_pool1d(x: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
               return_indices: bool = False):
    """Max over each window, as torch.nn.functional.max_pool1d (indices: positions along L)."""
    _check_input(x, "max_pool1d")
    kernel, strd, pads, dil = _geometry(x, "max_pool1d", kernel_size, stride, padding, dilation, ceil_mode)
    return _squeezed(max_pool2d(x.unsqueeze(-2), kernel, strd, pads, dil, ceil_mode, return_indices))


def avg_pool1d(x: Tensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True) -> Tensor:
    """Mean over each window, as torch.nn.functional.avg_pool1d."""
    _check_input(x, "avg_pool1d")
    kernel, strd, pads, _ = _geometry(x, "avg_pool1d", kernel_size, stride, padding, 1, ceil_mode)
    return _squeezed(avg_pool2d(x.unsqueeze(-2), kernel, strd, pads, ceil_mode, count_include_pad))


def _adaptive_size(x: Tensor, output_size, name: str) -> int:
    _check_input(x, name)
    if x.shape[-1] == 0:
        raise RuntimeError(f"{name}(): Expected input to have non-zero size for non-batch dimensions, but input has "
                           f"sizes {list(x.shape)} with dimension {x.ndim - 1} being empty")
    size = _single(output_size, name, "output_size")
    if size <= 0:
        raise RuntimeError(f"{name}: output size must be positive, got {output_size!r} for input {x.shape}")
    return size


def adaptive_avg_pool1d(x: Tensor, output_size) -> Tensor:
    """Average over PyTorch's adaptive windows along L."""
    size = _adaptive_size(x, output_size, "adaptive_avg_pool1d")
    return _squeezed(adaptive_avg_pool2d(x.unsqueeze(-2), (1, size)))


def adaptive_max_pool1d(x: Tensor, output_size, return_indices: bool = False):
    """Max over PyTorch's adaptive windows along L (indices: positions along L)."""
    size = _adaptive_size(x, output_size, "adaptive_max_pool1d")
    return _squeezed(adaptive_max_pool2d(x.unsqueeze(-2), (1, size), return_indices))
