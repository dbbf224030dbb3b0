"""Tests of frost/nn/linear.py: Linear, Identity, Flatten against PyTorch."""
import math

import numpy as np
import pytest
import torch

import frost
from frost import nn

from .helpers import compare_layer

rng = np.random.default_rng(0)


@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_torch(bias):
    compare_layer(nn.Linear(5, 3, bias=bias), torch.nn.Linear(5, 3, bias=bias), rng.standard_normal((4, 2, 5)))


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
def test_linear_without_input_features_gives_the_bias_like_torch():
    compare_layer(nn.Linear(0, 4), torch.nn.Linear(0, 4), rng.standard_normal((2, 3, 0)))


def test_linear_attributes_and_repr():
    lin = nn.Linear(5, 3, bias=False)
    assert (lin.in_features, lin.out_features, lin.weight.shape, lin.bias) == (5, 3, (3, 5), None)
    assert repr(lin) == repr(torch.nn.Linear(5, 3, bias=False))
    assert repr(nn.Linear(5, 3)) == repr(torch.nn.Linear(5, 3))


def test_linear_default_init_bounds_and_spread():
    frost.manual_seed(0)
    lin = nn.Linear(400, 300)
    bound = 1 / math.sqrt(400)  # kaiming_uniform_(a=sqrt(5)) gives U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    w, b = lin.weight.detach().numpy(), lin.bias.detach().numpy()
    assert np.abs(w).max() <= bound and np.abs(b).max() <= bound
    assert abs(w.std() - bound / math.sqrt(3)) < 0.01 * bound  # std of U(-a, a) is a/sqrt(3)
    assert abs(w.mean()) < 0.01 * bound
    assert np.abs(w).max() > 0.99 * bound


def test_linear_dtype_argument_and_wrong_input():
    lin = nn.Linear(3, 2, dtype="float64")
    assert lin.weight.dtype == frost.float64 and lin.bias.dtype == frost.float64
    with pytest.raises(RuntimeError, match=r"Linear: input of shape \(2, 4\) has 4 features.*in_features=3"):
        nn.Linear(3, 2)(frost.ones(2, 4))


def test_identity_and_flatten():
    x = frost.randn(2, 3, 4, 5)
    assert nn.Identity(54, unused="x")(x) is x
    assert nn.Flatten()(x).shape == (2, 60)
    assert nn.Flatten(0, 2)(x).shape == (24, 5)
    assert repr(nn.Flatten()) == repr(torch.nn.Flatten())
    assert repr(nn.Identity()) == repr(torch.nn.Identity())
    compare_layer(nn.Flatten(1, 2), torch.nn.Flatten(1, 2), rng.standard_normal((2, 3, 4, 5)))
