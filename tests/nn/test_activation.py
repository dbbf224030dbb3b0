"""Tests of frost/nn/activation.py against PyTorch: values, gradients, repr."""
import numpy as np
import pytest
import torch

from frost import nn

from .helpers import compare_layer

rng = np.random.default_rng(0)

CASES = [
    ("ReLU", (), {}), ("ReLU", (), dict(inplace=True)), ("GELU", (), {}), ("GELU", (), dict(approximate="tanh")),
    ("SiLU", (), {}), ("Sigmoid", (), {}), ("Tanh", (), {}), ("LeakyReLU", (), {}), ("LeakyReLU", (0.2,), {}),
    ("Softplus", (), dict(beta=2.0, threshold=5.0)), ("Softmax", (), dict(dim=1)), ("Softmax", (-1,), {}),
    ("LogSoftmax", (), dict(dim=1)),
]


@pytest.mark.parametrize("name,args,kwargs", CASES)
def test_activation_matches_torch(name, args, kwargs):
    f, t = getattr(nn, name)(*args, **kwargs), getattr(torch.nn, name)(*args, **kwargs)
    x = rng.standard_normal((3, 4, 5)) * 4
    if name == "ReLU":
        x[0, 0, :2] = [0.0, 1e-300]  # the kink
    inplace = kwargs.get("inplace", False)
    if inplace:
        t.inplace = False  # torch refuses an in-place op on a leaf input; frost never works in place
    compare_layer(f, t, x)
    if inplace:
        t.inplace = True
    assert repr(f) == repr(t)


def test_softmax_without_dim_picks_pytorchs_legacy_dim():
    x = rng.standard_normal((2, 3))
    with pytest.warns(UserWarning, match="Implicit dimension"):
        compare_layer(nn.Softmax(), torch.nn.Softmax(), x)


def test_gelu_rejects_unknown_approximation():
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        nn.GELU("fast")
