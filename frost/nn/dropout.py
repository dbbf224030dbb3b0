"""Dropout: zero activations at random in training mode, identity in eval mode."""
from __future__ import annotations

from frost.nn.activation import apply_inplace
from frost.nn.module import Module
from frost.ops.random import dropout
from frost.tensor import Tensor


class Dropout(Module):
    """Zero each element with probability p while training, scaling survivors by 1/(1-p).

    inplace=True overwrites and returns x unless x needs a gradient (see frost.nn.activation.apply_inplace).
    """

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        if p < 0 or p > 1:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p
        self.inplace = inplace

    def forward(self, x: Tensor) -> Tensor:
        return apply_inplace(lambda t: dropout(t, self.p, self.training), x, self.inplace)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"
