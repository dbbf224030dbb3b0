"""The public op names, PyTorch-style (`import frost.nn.functional as F`): re-exported from frost.ops."""
from __future__ import annotations

from frost.ops.activation import (celu, elu, glu, hardsigmoid, hardswish, hardtanh, logsigmoid, mish, prelu, relu6,
                                  selu, softsign, tanhshrink)
from frost.ops.attention import scaled_dot_product_attention
from frost.ops.conv import conv2d
from frost.ops.conv_nd import conv1d, conv3d, conv_transpose1d, conv_transpose2d, conv_transpose3d
from frost.ops.elementwise import gelu, leaky_relu, relu, sigmoid, silu, softplus, tanh
from frost.ops.embedding import embedding
from frost.ops.head import avg_pool_linear
from frost.ops.loss import (binary_cross_entropy_with_logits, cross_entropy, l1_loss, mse_loss, nll_loss)
from frost.ops.loss_functions import (binary_cross_entropy, cosine_similarity, huber_loss, kl_div, margin_ranking_loss,
                                      normalize, pairwise_distance, smooth_l1_loss)
from frost.ops.matmul import linear
from frost.ops.norm import batch_norm, layer_norm, rms_norm
from frost.ops.pool import adaptive_avg_pool2d, adaptive_max_pool2d, avg_pool2d, max_pool2d
from frost.ops.pool1d import adaptive_avg_pool1d, adaptive_max_pool1d, avg_pool1d, max_pool1d
from frost.ops.random import dropout
from frost.ops.reduce import log_softmax, softmax
from frost.ops.resample import (fold, interpolate, max_unpool1d, max_unpool2d, pixel_shuffle, pixel_unshuffle,
                                 unfold)
from frost.ops.shape import pad
from frost.tensor import Tensor

__all__ = [
    "adaptive_avg_pool2d", "avg_pool2d", "avg_pool_linear", "batch_norm", "binary_cross_entropy_with_logits", "conv2d",
    "conv1d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "cross_entropy", "dropout", "embedding", "gelu", "l1_loss", "layer_norm", "leaky_relu", "linear",
    "log_softmax", "max_pool2d", "mse_loss", "nll_loss", "one_hot", "pad", "relu", "rms_norm",
    "scaled_dot_product_attention", "sigmoid", "silu", "softmax", "softplus", "tanh",
    "celu", "elu", "glu", "hardsigmoid", "hardswish", "hardtanh", "logsigmoid", "mish", "prelu", "relu6", "selu",
    "softsign", "tanhshrink",
    "binary_cross_entropy", "cosine_similarity", "huber_loss", "kl_div", "margin_ranking_loss", "normalize",
    "pairwise_distance", "smooth_l1_loss",
    "fold", "interpolate", "max_unpool1d", "max_unpool2d", "pixel_shuffle", "pixel_unshuffle", "unfold",
    "adaptive_avg_pool1d", "adaptive_max_pool1d", "adaptive_max_pool2d", "avg_pool1d", "max_pool1d",
]


def one_hot(tensor: Tensor, num_classes: int = -1) -> Tensor:
    """An int64 tensor of shape (*tensor.shape, num_classes) with a 1 at each index (no gradient).

    num_classes=-1 means max(tensor) + 1, which reads the values back to the host.
    """
    if tensor.dtype.is_floating_point or tensor.dtype.name == "bool":
        raise RuntimeError(f"one_hot is only applicable to index tensor, got dtype {tensor.dtype!r}")
    xp = tensor.xp
    idx = tensor.data
    if num_classes == -1:
        if idx.size == 0:
            # max() of nothing: PyTorch refuses rather than guess 0 classes
            raise RuntimeError(f"one_hot: Can not infer total number of classes from empty tensor of shape "
                               f"{tensor.shape}; pass num_classes explicitly")
        num_classes = int(idx.max()) + 1
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= num_classes):
        raise RuntimeError(f"one_hot: class values must be in [0, {num_classes}), got values from "
                           f"{int(idx.min())} to {int(idx.max())}")
    return Tensor((idx[..., None] == xp.arange(num_classes)).astype("int64"))
