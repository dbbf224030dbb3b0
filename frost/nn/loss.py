"""Loss layers: CrossEntropyLoss, NLLLoss, MSELoss, L1Loss, BCEWithLogitsLoss, BCELoss, KLDivLoss, SmoothL1Loss,
HuberLoss, MarginRankingLoss."""
from __future__ import annotations

import warnings

from frost.nn.module import Module
from frost.ops import loss as L, loss_functions
from frost.tensor import Tensor


def _legacy_reduction(size_average, reduce) -> str:
    """PyTorch's deprecated size_average/reduce flags, as a reduction string."""
    warnings.warn("size_average and reduce args will be deprecated, please use reduction='mean' (or 'sum', "
                  "'none') instead.", stacklevel=3)
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    if not reduce:
        return "none"
    return "mean" if size_average else "sum"


class _Loss(Module):
    reductions: tuple = ("mean", "sum", "none")

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean") -> None:
        super().__init__()
        if size_average is not None or reduce is not None:
            reduction = _legacy_reduction(size_average, reduce)
        if reduction not in self.reductions:
            raise ValueError(f"{type(self).__name__}: reduction must be one of {self.reductions}, got {reduction!r}")
        self.reduction = reduction


class _WeightedLoss(_Loss):
    """A loss with an optional per-class `weight`, kept as a buffer (saved in the state dict, as PyTorch)."""

    def __init__(self, weight: Tensor | None = None, size_average=None, reduce=None, reduction: str = "mean") -> None:
        super().__init__(size_average, reduce, reduction)
        self.register_buffer("weight", weight)


class CrossEntropyLoss(_WeightedLoss):
    """Log-softmax over the class dim (1) then negative log-likelihood; targets are indices or probabilities."""

    def __init__(self, weight: Tensor | None = None, size_average=None, ignore_index: int = -100, reduce=None,
                 reduction: str = "mean", label_smoothing: float = 0.0) -> None:
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return L.cross_entropy(input, target, self.weight, self.ignore_index, self.reduction, self.label_smoothing)


class NLLLoss(_WeightedLoss):
    """Negative log-likelihood of class indices, given log-probabilities."""

    def __init__(self, weight: Tensor | None = None, size_average=None, ignore_index: int = -100, reduce=None,
                 reduction: str = "mean") -> None:
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index = ignore_index

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return L.nll_loss(input, target, self.weight, self.ignore_index, self.reduction)


class MSELoss(_Loss):
    """Mean (or sum) of squared differences."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return L.mse_loss(input, target, self.reduction)


class L1Loss(_Loss):
    """Mean (or sum) of absolute differences."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return L.l1_loss(input, target, self.reduction)


class BCEWithLogitsLoss(_Loss):
    """Sigmoid and binary cross-entropy in one numerically stable op; pos_weight weighs the positive term."""

    def __init__(self, weight: Tensor | None = None, size_average=None, reduce=None, reduction: str = "mean",
                 pos_weight: Tensor | None = None) -> None:
        super().__init__(size_average, reduce, reduction)
        self.register_buffer("weight", weight)
        self.register_buffer("pos_weight", pos_weight)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return L.binary_cross_entropy_with_logits(input, target, self.weight, self.reduction, self.pos_weight)


class BCELoss(_WeightedLoss):
    """Binary cross-entropy of probabilities in [0, 1] (each log clamped at -100); weight weighs each element."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return loss_functions.binary_cross_entropy(input, target, self.weight, self.reduction)


class KLDivLoss(_Loss):
    """KL divergence of the target from exp(input) (input holds log-probabilities); reduction='batchmean' gives
    the true KL divergence per sample."""

    reductions = ("mean", "batchmean", "sum", "none")

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean", log_target: bool = False) -> None:
        super().__init__(size_average, reduce, reduction)
        self.log_target = log_target

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return loss_functions.kl_div(input, target, self.reduction, self.log_target)


class SmoothL1Loss(_Loss):
    """Squared error below beta (halved, divided by beta), absolute error above."""

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean", beta: float = 1.0) -> None:
        super().__init__(size_average, reduce, reduction)
        self.beta = beta

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return loss_functions.smooth_l1_loss(input, target, self.reduction, self.beta)


class HuberLoss(_Loss):
    """Halved squared error below delta, delta-scaled absolute error above."""

    def __init__(self, reduction: str = "mean", delta: float = 1.0) -> None:
        super().__init__(reduction=reduction)
        self.delta = delta

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return loss_functions.huber_loss(input, target, self.reduction, self.delta)


class MarginRankingLoss(_Loss):
    """max(0, -target * (input1 - input2) + margin)."""

    def __init__(self, margin: float = 0.0, size_average=None, reduce=None, reduction: str = "mean") -> None:
        super().__init__(size_average, reduce, reduction)
        self.margin = margin

    def forward(self, input1: Tensor, input2: Tensor, target: Tensor) -> Tensor:
        return loss_functions.margin_ranking_loss(input1, input2, target, self.margin, self.reduction)
