"""The convolution layers (zero padding): Conv1d, Conv2d, Conv3d and ConvTranspose1d/2d/3d."""
from __future__ import annotations

from frost.nn import init
from frost.nn.module import Module, Parameter
from frost.ops.conv import conv2d
from frost.ops.conv_nd import conv1d, conv3d, conv_transpose1d, conv_transpose2d, conv_transpose3d
from frost.tensor import Tensor, empty

_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def _ntuple(value, dims: int, what: str, layer: str, one_allowed: bool = True) -> tuple:
    """An int as `dims` copies; a tuple kept as given, as PyTorch keeps it (a one-element stride, padding, dilation
    or output_padding stands for all dims: the functional op broadcasts it, so the attributes and repr stay
    PyTorch's)."""
    if isinstance(value, int):
        return (value,) * dims
    value = tuple(value)
    if len(value) != dims and not (one_allowed and len(value) == 1):
        allowed = f"an int{', a one-element tuple' if one_allowed else ''} or a tuple of {dims} ints"
        raise ValueError(f"{layer}: {what} must be {allowed}, got {value!r}")
    return value


class _ConvNd(Module):
    """What the N-d convolution layers share: PyTorch's checks, attributes, parameter shapes, default init, repr.

    weight: (out_channels, in_channels // groups, *kernel_size), or (in_channels, out_channels // groups,
    *kernel_size) when transposed, ~ kaiming_uniform_(a=sqrt(5)); bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with
    fan_in = weight.shape[1] * prod(kernel_size). Only padding_mode='zeros' is supported.
    """

    _dims: int
    _transposed: bool

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride, padding, dilation, groups: int,
                 bias: bool, padding_mode: str, output_padding, device, dtype) -> None:
        super().__init__()
        layer, dims = type(self).__name__, self._dims
        _check_channels(layer, in_channels, out_channels, groups)
        self._check_padding_mode(padding_mode)
        self.kernel_size = _ntuple(kernel_size, dims, "kernel_size", layer, one_allowed=False)
        self.stride = _ntuple(stride, dims, "stride", layer)
        self.dilation = _ntuple(dilation, dims, "dilation", layer)
        self.padding = self._padding(padding)
        self.output_padding = _ntuple(output_padding, dims, "output_padding", layer)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.groups = groups
        self.padding_mode = padding_mode
        self.transposed = self._transposed
        shape = (in_channels, out_channels // groups) if self._transposed else (out_channels, in_channels // groups)
        self.weight = Parameter(empty(shape + self.kernel_size, device=device, dtype=dtype))
        self.register_parameter("bias", Parameter(empty((out_channels,), device=device, dtype=dtype)) if bias else None)
        self.reset_parameters()

    def _check_padding_mode(self, padding_mode: str) -> None:
        layer = type(self).__name__
        if self._transposed and padding_mode != "zeros":
            raise ValueError(f'{layer}: only "zeros" padding mode is supported, got padding_mode={padding_mode!r}')
        if padding_mode not in _PADDING_MODES:
            raise ValueError(f"{layer}: padding_mode must be one of {list(_PADDING_MODES)}, "
                             f"but got padding_mode='{padding_mode}'")
        if padding_mode != "zeros":
            raise NotImplementedError(f"{layer}: padding_mode='{padding_mode}' is not supported in frost; only "
                                      f"'zeros' is (pad the input with frost.nn.functional.pad instead)")

    def _padding(self, padding):
        layer = type(self).__name__
        if not isinstance(padding, str):
            return _ntuple(padding, self._dims, "padding", layer)
        if self._transposed:
            raise ValueError(f"{layer}: padding must be an int or a tuple of ints, got {padding!r} (transposed "
                             f"convolutions take no 'same' or 'valid')")
        if padding not in ("valid", "same"):
            raise ValueError(f"{layer}: invalid padding string '{padding}', should be one of ['valid', 'same']")
        if padding == "same" and any(s != 1 for s in self.stride):
            raise ValueError(f"{layer}: padding='same' is not supported for strided convolutions "
                             f"(stride={self.stride})")
        return padding

    def reset_parameters(self) -> None:
        init.layer_default_(self.weight, self.bias)

    def extra_repr(self) -> str:
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0,) * len(self.padding):  # as PyTorch's: (0,) and 'valid' compare unequal, 'same' too
            s += f", padding={self.padding}"
        if self.dilation != (1,) * len(self.dilation):
            s += f", dilation={self.dilation}"
        if self.output_padding != (0,) * len(self.output_padding):
            s += f", output_padding={self.output_padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        return s


def _check_channels(layer: str, in_channels: int, out_channels: int, groups: int) -> None:
    if groups <= 0:
        raise ValueError(f"{layer}: groups must be a positive integer, got {groups}")
    if in_channels % groups != 0:
        raise ValueError(f"{layer}: in_channels ({in_channels}) must be divisible by groups ({groups})")
    if out_channels % groups != 0:
        raise ValueError(f"{layer}: out_channels ({out_channels}) must be divisible by groups ({groups})")


class _Conv(_ConvNd):
    _transposed = False

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros", device=None, dtype=None) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, 0, device, dtype)


class Conv1d(_Conv):
    """1-D convolution over (N, C, L) or (C, L) with PyTorch's signature, attributes and default initialization."""
    _dims = 1

    def forward(self, x: Tensor) -> Tensor:
        return conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class Conv2d(_Conv):
    """2-D convolution with PyTorch's signature, attributes and default initialization.

    weight: (out_channels, in_channels // groups, kh, kw) ~ kaiming_uniform_(a=sqrt(5));
    bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = in_channels // groups * kh * kw.
    Only padding_mode='zeros' is supported.
    """
    _dims = 2

    def forward(self, x: Tensor) -> Tensor:
        return conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class Conv3d(_Conv):
    """3-D convolution over (N, C, D, H, W) or (C, D, H, W) with PyTorch's signature, attributes and default
    initialization."""
    _dims = 3

    def forward(self, x: Tensor) -> Tensor:
        return conv3d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


def _expanded(values: tuple, dims: int) -> tuple:
    """A one-element tuple attribute as `dims` values (what the functional op makes of it)."""
    return values * dims if len(values) == 1 else values


class _ConvTranspose(_ConvNd):
    _transposed = True

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, output_padding=0,
                 groups: int = 1, bias: bool = True, dilation=1, padding_mode: str = "zeros", device=None,
                 dtype=None) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, output_padding, device, dtype)

    def _output_padding(self, x: Tensor, output_size) -> tuple:
        """self.output_padding, or the one that makes the output `output_size` (spatial sizes, or the whole shape),
        as PyTorch's ConvTranspose forward(input, output_size)."""
        if output_size is None:
            return self.output_padding
        dims, layer = self._dims, type(self).__name__
        output_size = tuple(output_size)
        if len(output_size) == x.ndim:
            output_size = output_size[x.ndim - dims:]
        if len(output_size) != dims:
            raise ValueError(f"{layer}: output_size must have {dims} or {x.ndim} elements (got {len(output_size)})")
        stride, padding, dilation = (_expanded(v, dims) for v in (self.stride, self.padding, self.dilation))
        smallest = [(x.shape[x.ndim - dims + i] - 1) * stride[i] - 2 * padding[i]
                    + dilation[i] * (self.kernel_size[i] - 1) + 1 for i in range(dims)]
        for i, (wanted, low) in enumerate(zip(output_size, smallest)):
            if not low <= wanted < low + stride[i]:
                raise ValueError(f"{layer}: requested an output size of {output_size}, but valid sizes range from "
                                 f"{tuple(smallest)} to {tuple(m + s - 1 for m, s in zip(smallest, stride))} (for an "
                                 f"input of {x.shape[x.ndim - dims:]})")
        return tuple(wanted - low for wanted, low in zip(output_size, smallest))


class ConvTranspose1d(_ConvTranspose):
    """1-D transposed convolution with PyTorch's signature, attributes and default initialization."""
    _dims = 1

    def forward(self, x: Tensor, output_size=None) -> Tensor:
        return conv_transpose1d(x, self.weight, self.bias, self.stride, self.padding,
                                self._output_padding(x, output_size), self.groups, self.dilation)


class ConvTranspose2d(_ConvTranspose):
    """2-D transposed convolution with PyTorch's signature, attributes and default initialization."""
    _dims = 2

    def forward(self, x: Tensor, output_size=None) -> Tensor:
        return conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding,
                                self._output_padding(x, output_size), self.groups, self.dilation)


class ConvTranspose3d(_ConvTranspose):
    """3-D transposed convolution with PyTorch's signature, attributes and default initialization."""
    _dims = 3

    def forward(self, x: Tensor, output_size=None) -> Tensor:
        return conv_transpose3d(x, self.weight, self.bias, self.stride, self.padding,
                                self._output_padding(x, output_size), self.groups, self.dilation)
