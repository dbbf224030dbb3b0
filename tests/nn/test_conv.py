"""Tests of frost/nn/conv.py: Conv2d against PyTorch."""
import math

import numpy as np
import pytest
import torch

import frost
from frost import nn

from .helpers import compare_layer

rng = np.random.default_rng(0)


@pytest.mark.parametrize("kwargs", [
    dict(kernel_size=3),
    dict(kernel_size=3, stride=2, padding=1, bias=False),
    dict(kernel_size=(3, 1), padding=(1, 0), dilation=(2, 1)),
    dict(kernel_size=3, padding="same", groups=2),
    dict(kernel_size=1, padding="valid"),
    dict(kernel_size=3, padding=(1,)),  # one-element tuples used to be refused by the module (not by F.conv2d)
    dict(kernel_size=3, stride=(2,), padding=[1], dilation=(2,)),
    dict(kernel_size=3, padding="same", dilation=(2,)),
])
def test_conv2d_matches_torch(kwargs):
    compare_layer(nn.Conv2d(4, 6, **kwargs), torch.nn.Conv2d(4, 6, **kwargs), rng.standard_normal((2, 4, 7, 8)))


@pytest.mark.parametrize("kwargs", [
    dict(kernel_size=3),
    dict(kernel_size=(3, 5), stride=(2, 1), padding=(1, 2), dilation=2, groups=2, bias=False),
    dict(kernel_size=3, padding="same"),
    dict(kernel_size=3, stride=(2,), padding=(1,), dilation=(2,)),
    dict(kernel_size=3, padding=(0,)),
])
def test_conv2d_repr_and_attributes_match_torch(kwargs):
    f, t = nn.Conv2d(4, 6, **kwargs), torch.nn.Conv2d(4, 6, **kwargs)
    assert repr(f) == repr(t)
    for name in ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups",
                 "padding_mode", "output_padding", "transposed"):
        assert getattr(f, name) == getattr(t, name), name
    assert f.weight.shape == tuple(t.weight.shape)


def test_conv2d_default_init_bounds():
    frost.manual_seed(1)
    conv = nn.Conv2d(16, 32, 3)
    fan_in = 16 * 9
    bound = 1 / math.sqrt(fan_in)
    w = conv.weight.detach().numpy()
    assert np.abs(w).max() <= bound and np.abs(conv.bias.detach().numpy()).max() <= bound
    assert abs(w.std() - bound / math.sqrt(3)) < 0.03 * bound


def test_conv2d_rejects_unsupported_padding_modes_and_bad_groups():
    with pytest.raises(NotImplementedError, match="padding_mode='reflect' is not supported"):
        nn.Conv2d(3, 3, 3, padding_mode="reflect")
    with pytest.raises(ValueError, match="padding_mode must be one of"):
        nn.Conv2d(3, 3, 3, padding_mode="mirror")
    with pytest.raises(ValueError, match=r"Conv2d: in_channels \(3\) must be divisible by groups \(2\)"):
        nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match="strided"):
        nn.Conv2d(3, 3, 3, stride=2, padding="same")
    with pytest.raises(ValueError, match="Conv2d: invalid padding string"):
        nn.Conv2d(3, 3, 3, padding="full")
    with pytest.raises(ValueError, match="strided"):
        nn.Conv2d(3, 3, 3, stride=(2,), padding="same")
    with pytest.raises(ValueError, match=r"Conv2d: padding must be an int, a one-element tuple or a tuple of 2 ints, "
                                         r"got \(1, 2, 3\)"):
        nn.Conv2d(3, 3, 3, padding=(1, 2, 3))
    with pytest.raises(ValueError, match=r"Conv2d: kernel_size must be an int or a tuple of 2 ints, got \(3,\)"):
        nn.Conv2d(3, 3, (3,))  # PyTorch builds a 3-D weight here and fails in forward


def test_conv2d_reports_channel_mismatch():
    with pytest.raises(RuntimeError, match="conv2d"):
        nn.Conv2d(3, 4, 3)(frost.randn(1, 5, 8, 8))
