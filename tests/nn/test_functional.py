"""Tests of frost/nn/functional.py: every public name is there, and one_hot matches PyTorch."""
import numpy as np
import pytest
import torch

import frost
import frost.nn.functional as F
from frost.ops import conv, elementwise, loss, norm

NAMES = ["relu", "gelu", "silu", "sigmoid", "tanh", "leaky_relu", "softplus", "softmax", "log_softmax",
         "cross_entropy", "nll_loss", "mse_loss", "binary_cross_entropy_with_logits", "conv2d", "max_pool2d",
         "avg_pool2d", "adaptive_avg_pool2d", "batch_norm", "layer_norm", "rms_norm", "dropout", "linear",
         "scaled_dot_product_attention", "embedding", "pad", "one_hot"]


def test_every_public_name_exists():
    for name in NAMES:
        assert callable(getattr(F, name)), name
    assert set(NAMES) <= set(F.__all__)


def test_names_are_the_ops_themselves():
    assert F.relu is elementwise.relu and F.conv2d is conv.conv2d
    assert F.cross_entropy is loss.cross_entropy and F.batch_norm is norm.batch_norm


def test_functional_gelu_tanh_matches_torch():
    x = np.linspace(-4, 4, 11)
    np.testing.assert_allclose(F.gelu(frost.tensor(x), approximate="tanh").numpy(),
                               torch.nn.functional.gelu(torch.tensor(x), approximate="tanh").numpy(), rtol=1e-12,
                               atol=1e-15)


def test_one_hot_matches_torch():
    idx = np.array([[0, 3], [2, 1]])
    np.testing.assert_array_equal(F.one_hot(frost.tensor(idx)).numpy(),
                                  torch.nn.functional.one_hot(torch.tensor(idx)).numpy())
    out = F.one_hot(frost.tensor(idx), num_classes=6)
    assert out.shape == (2, 2, 6) and out.dtype == frost.int64
    with pytest.raises(RuntimeError, match="index tensor"):
        F.one_hot(frost.tensor([0.0, 1.0]))
    with pytest.raises(RuntimeError, match=r"\[0, 3\)"):
        F.one_hot(frost.tensor([0, 3]), num_classes=3)


def test_one_hot_of_empty_tensor_follows_torch():
    # num_classes=-1 on an empty tensor used to give (0, 0); PyTorch refuses to guess
    empty = np.zeros((0,), dtype=np.int64)
    with pytest.raises(RuntimeError, match="Can not infer total number of classes from empty tensor"):
        torch.nn.functional.one_hot(torch.tensor(empty))
    with pytest.raises(RuntimeError, match=r"one_hot: Can not infer total number of classes from empty tensor of "
                                           r"shape \(0,\); pass num_classes"):
        F.one_hot(frost.tensor(empty))
    out = F.one_hot(frost.tensor(empty.reshape(2, 0)), num_classes=3)
    assert out.shape == tuple(torch.nn.functional.one_hot(torch.tensor(empty.reshape(2, 0)), 3).shape) == (2, 0, 3)
