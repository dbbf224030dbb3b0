"""Tests of frost/nn/pool.py: MaxPool2d, AvgPool2d, AdaptiveAvgPool2d against PyTorch."""
import numpy as np
import pytest
import torch

from frost import nn

from .helpers import compare_layer

rng = np.random.default_rng(0)


@pytest.mark.parametrize("name,kwargs", [
    ("MaxPool2d", dict(kernel_size=2)),
    ("MaxPool2d", dict(kernel_size=3, stride=2, padding=1)),
    ("MaxPool2d", dict(kernel_size=(2, 3), stride=1, dilation=2, ceil_mode=True)),
    ("AvgPool2d", dict(kernel_size=2)),
    ("AvgPool2d", dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)),
    ("AvgPool2d", dict(kernel_size=3, stride=2, ceil_mode=True)),
    ("AdaptiveAvgPool2d", dict(output_size=1)),
    ("AdaptiveAvgPool2d", dict(output_size=(3, 2))),
    ("AdaptiveAvgPool2d", dict(output_size=(None, 4))),
])
def test_pool_matches_torch(name, kwargs):
    f, t = getattr(nn, name)(**kwargs), getattr(torch.nn, name)(**kwargs)
    compare_layer(f, t, rng.standard_normal((2, 3, 9, 8)))
    assert repr(f) == repr(t)


def test_unsupported_pool_options_are_refused():
    with pytest.raises(NotImplementedError, match="divisor_override"):
        nn.AvgPool2d(2, divisor_override=3)
