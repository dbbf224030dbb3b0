"""Pooling layers: MaxPool1d/2d, AvgPool1d/2d, AdaptiveAvgPool1d/2d, AdaptiveMaxPool1d/2d.

Each 1-D and 2-D pair shares one base (as PyTorch's _MaxPoolNd and friends do); a subclass names only its op.
"""
from __future__ import annotations

from typing import Callable, ClassVar

from frost.nn.module import Module
from frost.ops.pool import adaptive_avg_pool2d, adaptive_max_pool2d, avg_pool2d, max_pool2d
from frost.ops.pool1d import adaptive_avg_pool1d, adaptive_max_pool1d, avg_pool1d, max_pool1d
from frost.tensor import Tensor


class _MaxPoolNd(Module):
    _pool: ClassVar[Callable]

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices: bool = False,
                 ceil_mode: bool = False) -> None:
        super().__init__()
        self.kernel_size, self.padding, self.dilation = kernel_size, padding, dilation
        self.stride = stride if stride is not None else kernel_size
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    def forward(self, x: Tensor) -> Tensor:
        return self._pool(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                          self.return_indices)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class _AvgPoolNd(Module):
    _pool: ClassVar[Callable]

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
                 count_include_pad: bool = True) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding = padding
        self.ceil_mode = ceil_mode
        self.count_include_pad = count_include_pad

    def forward(self, x: Tensor) -> Tensor:
        return self._pool(x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class _AdaptivePoolNd(Module):
    _pool: ClassVar[Callable]

    def __init__(self, output_size) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, x: Tensor) -> Tensor:
        return self._pool(x, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class _AdaptiveMaxPoolNd(_AdaptivePoolNd):
    def __init__(self, output_size, return_indices: bool = False) -> None:
        super().__init__(output_size)
        self.return_indices = return_indices

    def forward(self, x: Tensor) -> Tensor:
        return self._pool(x, self.output_size, self.return_indices)


class MaxPool2d(_MaxPoolNd):
    """The maximum over kernel_size windows; stride defaults to kernel_size. With return_indices, forward also
    gives each maximum's flat index in its input plane (for MaxUnpool2d)."""

    _pool = staticmethod(max_pool2d)


class AvgPool2d(_AvgPoolNd):
    """The mean over kernel_size windows; stride defaults to kernel_size. divisor_override is not supported."""

    _pool = staticmethod(avg_pool2d)

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True,
                 divisor_override: int | None = None) -> None:
        if divisor_override is not None:
            raise NotImplementedError("AvgPool2d: divisor_override is not supported in frost")
        super().__init__(kernel_size, stride, padding, ceil_mode, count_include_pad)
        self.divisor_override = divisor_override


class AdaptiveAvgPool2d(_AdaptivePoolNd):
    """Average pooling to a fixed output size (an int, a pair, or None in a pair for 'keep this size')."""

    _pool = staticmethod(adaptive_avg_pool2d)


class MaxPool1d(_MaxPoolNd):
    """The maximum over kernel_size windows along L; stride defaults to kernel_size. With return_indices, forward
    also gives each maximum's position along L (for MaxUnpool1d)."""

    _pool = staticmethod(max_pool1d)


class AvgPool1d(_AvgPoolNd):
    """The mean over kernel_size windows along L; stride defaults to kernel_size."""

    _pool = staticmethod(avg_pool1d)


class AdaptiveAvgPool1d(_AdaptivePoolNd):
    """Average pooling along L to a fixed output length."""

    _pool = staticmethod(adaptive_avg_pool1d)


class AdaptiveMaxPool1d(_AdaptiveMaxPoolNd):
    """Max pooling along L to a fixed output length; with return_indices, also the positions of the maxima."""

    _pool = staticmethod(adaptive_max_pool1d)


class AdaptiveMaxPool2d(_AdaptiveMaxPoolNd):
    """Max pooling to a fixed output size (an int, a pair, or None in a pair for 'keep this size'); with
    return_indices, also each maximum's flat index in its input plane."""

    _pool = staticmethod(adaptive_max_pool2d)
