"""Tests of frost/nn/init.py: gains and fans as PyTorch, distributions within statistical bounds."""
import math

import numpy as np
import pytest
import torch

import frost
from frost import nn
from frost.nn import init


@pytest.mark.parametrize("name,param", [("linear", None), ("conv2d", None), ("sigmoid", None), ("tanh", None),
                                        ("relu", None), ("leaky_relu", None), ("leaky_relu", 0.2),
                                        ("leaky_relu", math.sqrt(5)), ("selu", None)])
def test_calculate_gain_matches_torch(name, param):
    assert init.calculate_gain(name, param) == pytest.approx(torch.nn.init.calculate_gain(name, param))


def test_calculate_gain_errors():
    with pytest.raises(ValueError, match="Unsupported nonlinearity"):
        init.calculate_gain("swish")
    with pytest.raises(ValueError, match="not a valid number"):
        init.calculate_gain("leaky_relu", True)


@pytest.mark.parametrize("shape", [(7, 5), (6, 4, 3, 3), (2, 3, 5)])
def test_fans_match_torch(shape):
    assert init._calculate_fan_in_and_fan_out(frost.zeros(shape)) == \
        torch.nn.init._calculate_fan_in_and_fan_out(torch.zeros(shape))


def test_fans_need_two_dims():
    with pytest.raises(ValueError, match="fewer than 2 dimensions"):
        init.xavier_uniform_(frost.zeros(5))


def _param(*shape):
    return nn.Parameter(frost.zeros(shape))


def test_in_place_on_parameters_and_returns_the_same_tensor():
    p = _param(200, 300)
    assert init.uniform_(p, -2, 3) is p and p.requires_grad
    a = p.detach().numpy()
    assert a.min() >= -2 and a.max() <= 3 and abs(a.mean() - 0.5) < 0.05
    assert init.normal_(p, 1.0, 2.0) is p
    assert abs(p.detach().numpy().mean() - 1) < 0.03 and abs(p.detach().numpy().std() - 2) < 0.03
    init.constant_(p, 0.25)
    assert np.all(p.detach().numpy() == 0.25)
    init.zeros_(p)
    assert np.all(p.detach().numpy() == 0)
    init.ones_(p)
    assert np.all(p.detach().numpy() == 1)
    e = _param(3, 4)
    init.eye_(e)
    np.testing.assert_array_equal(e.detach().numpy(), np.eye(3, 4))
    with pytest.raises(ValueError, match="2 dimensions"):
        init.eye_(_param(2, 2, 2))


def test_xavier_uniform_and_normal():
    p = _param(300, 200)
    bound = math.sqrt(6 / 500) * 2.0
    init.xavier_uniform_(p, gain=2.0)
    a = p.detach().numpy()
    assert np.abs(a).max() <= bound and np.abs(a).max() > 0.99 * bound
    assert abs(a.std() - bound / math.sqrt(3)) < 0.01 * bound
    init.xavier_normal_(p)
    assert abs(p.detach().numpy().std() - math.sqrt(2 / 500)) < 0.01 * math.sqrt(2 / 500)


def test_kaiming_uniform_and_normal_with_modes():
    p = _param(64, 32, 3, 3)  # fan_in 288, fan_out 576
    init.kaiming_uniform_(p, a=math.sqrt(5))
    assert np.abs(p.detach().numpy()).max() <= 1 / math.sqrt(288)
    init.kaiming_normal_(p, mode="fan_out", nonlinearity="relu")
    std = math.sqrt(2) / math.sqrt(576)
    assert abs(p.detach().numpy().std() - std) < 0.02 * std
    init.kaiming_uniform_(p, nonlinearity="relu")
    bound = math.sqrt(3) * math.sqrt(2) / math.sqrt(288)
    values = p.detach().numpy()
    assert np.abs(values).max() <= bound and abs(values.std() - bound / math.sqrt(3)) < 0.02 * bound
    with pytest.raises(ValueError, match="Mode fan_avg not supported"):
        init.kaiming_normal_(p, mode="fan_avg")


def test_trunc_normal_stays_inside_and_has_the_truncated_spread():
    p = _param(400, 250)
    init.trunc_normal_(p, mean=0.5, std=1.0, a=-1.5, b=2.5)
    a = p.detach().numpy()
    assert a.min() >= -1.5 and a.max() <= 2.5
    # N(0.5, 1) cut at +-2 standard deviations: mean 0.5, std 0.8796
    assert abs(a.mean() - 0.5) < 0.01 and abs(a.std() - 0.8796) < 0.01
    init.trunc_normal_(p, std=0.02)
    assert abs(p.detach().numpy().std() - 0.02) < 0.001


@pytest.mark.parametrize("shape", [(6, 10), (10, 6), (4, 2, 3, 3)])
def test_orthogonal_rows_or_columns_are_orthonormal(shape):
    p = _param(*shape)
    init.orthogonal_(p, gain=2.0)
    m = p.detach().numpy().reshape(shape[0], -1).astype(np.float64) / 2.0
    small = m @ m.T if m.shape[0] <= m.shape[1] else m.T @ m
    np.testing.assert_allclose(small, np.eye(small.shape[0]), atol=1e-5)


def test_manual_seed_makes_init_reproducible():
    frost.manual_seed(123)
    a = nn.Linear(10, 10).weight.detach().numpy().copy()
    frost.manual_seed(123)
    b = nn.Linear(10, 10).weight.detach().numpy()
    np.testing.assert_array_equal(a, b)
