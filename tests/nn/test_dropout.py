"""Tests of frost/nn/dropout.py: train/eval behaviour, scaling, gradient, repr."""
import numpy as np
import pytest
import torch

import frost
from frost import nn


def test_dropout_is_identity_in_eval_mode():
    d = nn.Dropout(0.5).eval()
    x = frost.randn(4, 5, requires_grad=True)
    np.testing.assert_array_equal(d(x).detach().numpy(), x.detach().numpy())


def test_dropout_zeroes_about_p_and_scales_survivors():
    frost.manual_seed(0)
    d = nn.Dropout(0.3)
    x = frost.ones(200, 500, requires_grad=True)
    y = d(x)
    kept = y.detach().numpy() != 0
    assert abs(kept.mean() - 0.7) < 0.01
    np.testing.assert_allclose(y.detach().numpy()[kept], 1 / 0.7, rtol=1e-6)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), y.detach().numpy(), rtol=1e-6)  # same mask, same scale


def test_dropout_repr_and_bad_p():
    assert repr(nn.Dropout(0.25)) == repr(torch.nn.Dropout(0.25))
    with pytest.raises(ValueError, match="between 0 and 1"):
        nn.Dropout(1.5)


@pytest.mark.parametrize("p", [0.3, 1.0])
def test_dropout_inplace_without_gradient_overwrites_its_input(p):
    # inplace=True used to be ignored; without a gradient to keep it now writes into the input, as PyTorch's
    frost.manual_seed(0)
    x = frost.ones(50, 40)
    version = x._version
    out = nn.Dropout(p, inplace=True)(x)
    assert out is x and x._version > version
    kept = x.numpy() != 0
    np.testing.assert_allclose(x.numpy()[kept], 1 / (1 - p) if p < 1 else 0, rtol=1e-6)
    if p == 1.0:  # deterministic: compare with torch's in-place result exactly
        t = torch.ones(50, 40)
        assert torch.nn.Dropout(p, inplace=True)(t) is t
        np.testing.assert_array_equal(x.numpy(), t.numpy())


def test_dropout_inplace_in_eval_mode_returns_the_input_untouched():
    x = frost.randn(4, 5)
    version = x._version
    assert nn.Dropout(0.5, inplace=True).eval()(x) is x
    assert x._version == version


def test_dropout_inplace_with_gradient_matches_torch_out_of_place():
    # an input that needs a gradient keeps its values and gets a new tensor (frost records no in-place op);
    # p=1 makes both masks the same, so the float64 values and gradients can be compared with torch's
    x = np.random.default_rng(2).standard_normal((3, 4))
    f_leaf, t_leaf = frost.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    f_in, t_in = f_leaf * 1.5, t_leaf * 1.5
    f_out, t_out = nn.Dropout(1.0, inplace=True)(f_in), torch.nn.Dropout(1.0, inplace=True)(t_in)
    assert f_out is not f_in
    np.testing.assert_array_equal(f_in.detach().numpy(), 1.5 * x)
    np.testing.assert_array_equal(f_out.detach().numpy(), t_out.detach().numpy())
    f_out.sum().backward()
    t_out.sum().backward()
    np.testing.assert_array_equal(f_leaf.grad.numpy(), t_leaf.grad.numpy())
