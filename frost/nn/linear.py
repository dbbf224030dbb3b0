"""Identity, Linear and Flatten layers."""
from __future__ import annotations


from frost.nn import init
from frost.nn.module import Module, Parameter
from frost.ops.matmul import linear
from frost.ops.shape import flatten
from frost.tensor import Tensor, empty


class Identity(Module):
    """Returns its input; accepts and ignores any constructor arguments (as PyTorch's)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__()

    def forward(self, x):
        return x


class Linear(Module):
    """y = x @ weight.T + bias, weight of shape (out_features, in_features).

    Initialized as PyTorch's: weight ~ kaiming_uniform_(a=sqrt(5)), i.e. U(-1/sqrt(in), 1/sqrt(in)),
    bias ~ U(-1/sqrt(in), 1/sqrt(in)).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(empty((out_features, in_features), device=device, dtype=dtype))
        self.register_parameter("bias", Parameter(empty((out_features,), device=device, dtype=dtype)) if bias else None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.layer_default_(self.weight, self.bias)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1:] != (self.in_features,):
            raise RuntimeError(f"Linear: input of shape {x.shape} has {x.shape[-1] if x.ndim else 0} features "
                               f"in its last dim but the layer expects in_features={self.in_features}")
        return linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class NonDynamicallyQuantizableLinear(Linear):
    """MultiheadAttention's output projection: a Linear under the class name PyTorch prints for it."""


class Flatten(Module):
    """Flattens dims start_dim..end_dim into one (by default all but the batch dim)."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim = start_dim
        self.end_dim = end_dim

    def forward(self, x: Tensor) -> Tensor:
        return flatten(x, self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"
