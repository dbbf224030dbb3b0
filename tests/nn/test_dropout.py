"""Tests of frost/nn/dropout.py: train/eval behaviour, scaling, gradient, repr."""
import numpy as np
import pytest
import torch

import frost
from frost import nn


def test_dropout_is_identity_in_eval_mode():
    d = nn.Dropout(0.5).eval()
    x = frost.randn(4, 5, requires_grad=True)
    np.testing.assert_array_equal(d(x).numpy(), x.numpy())


def test_dropout_zeroes_about_p_and_scales_survivors():
    frost.manual_seed(0)
    d = nn.Dropout(0.3)
    x = frost.ones(200, 500, requires_grad=True)
    y = d(x)
    kept = y.numpy() != 0
    assert abs(kept.mean() - 0.7) < 0.01
    np.testing.assert_allclose(y.numpy()[kept], 1 / 0.7, rtol=1e-6)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), y.numpy(), rtol=1e-6)  # same mask, same scale


def test_dropout_repr_and_bad_p():
    assert repr(nn.Dropout(0.25)) == repr(torch.nn.Dropout(0.25))
    with pytest.raises(ValueError, match="between 0 and 1"):
        nn.Dropout(1.5)
