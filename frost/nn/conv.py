"""Conv2d: the 2-D convolution layer (zero padding)."""
from __future__ import annotations


from frost.nn import init
from frost.nn.module import Module, Parameter
from frost.ops.conv import conv2d
from frost.tensor import Tensor, empty

_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def _pair(value, what: str, one_allowed: bool = False) -> tuple:
    """An int as a pair; a tuple kept as given, as PyTorch keeps it (a one-element stride, padding or dilation
    stands for both dims: conv2d broadcasts it, so the attributes and repr stay PyTorch's)."""
    if isinstance(value, int):
        return value, value
    value = tuple(value)
    if len(value) != 2 and not (one_allowed and len(value) == 1):
        allowed = "an int, a one-element tuple or a pair of ints" if one_allowed else "an int or a pair of ints"
        raise ValueError(f"Conv2d: {what} must be {allowed}, got {value!r}")
    return value


class Conv2d(Module):
    """2-D convolution with PyTorch's signature, attributes and default initialization.

    weight: (out_channels, in_channels // groups, kh, kw) ~ kaiming_uniform_(a=sqrt(5));
    bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = in_channels // groups * kh * kw.
    Only padding_mode='zeros' is supported.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros", device=None, dtype=None) -> None:
        super().__init__()
        if groups <= 0:
            raise ValueError("groups must be a positive integer")
        if in_channels % groups != 0:
            raise ValueError("in_channels must be divisible by groups")
        if out_channels % groups != 0:
            raise ValueError("out_channels must be divisible by groups")
        if padding_mode not in _PADDING_MODES:
            raise ValueError(f"padding_mode must be one of {list(_PADDING_MODES)}, "
                             f"but got padding_mode='{padding_mode}'")
        if padding_mode != "zeros":
            raise NotImplementedError(f"Conv2d: padding_mode='{padding_mode}' is not supported in frost; only "
                                      f"'zeros' is (pad the input with frost.nn.functional.pad instead)")
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.stride = _pair(stride, "stride", one_allowed=True)
        self.dilation = _pair(dilation, "dilation", one_allowed=True)
        if isinstance(padding, str):
            if padding not in ("valid", "same"):
                raise ValueError(f"Invalid padding string '{padding}', should be one of ['valid', 'same']")
            if padding == "same" and any(s != 1 for s in self.stride):
                raise ValueError("padding='same' is not supported for strided convolutions")
            self.padding = padding
        else:
            self.padding = _pair(padding, "padding", one_allowed=True)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.groups = groups
        self.padding_mode = padding_mode
        self.transposed = False
        self.output_padding = (0, 0)
        self.weight = Parameter(empty((out_channels, in_channels // groups) + self.kernel_size,
                                      device=device, dtype=dtype))
        if bias:
            self.bias = Parameter(empty((out_channels,), device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.layer_default_(self.weight, self.bias)

    def forward(self, x: Tensor) -> Tensor:
        return conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0,) * len(self.padding):  # as PyTorch's: (0,) and (0, 0) are not printed
            s += f", padding={self.padding}"
        if self.dilation != (1,) * len(self.dilation):
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        return s
