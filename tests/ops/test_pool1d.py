"""Tests of frost/ops/pool1d.py and the 1-D / adaptive-max pooling layers against PyTorch (float64): values,
indices and gradients, batched and unbatched, and the errors."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import frost
import frost.nn.functional as F
from frost import nn


def _check(f_fn, t_fn, shape, seed: int = 0, device: str = "cpu") -> None:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    fx = frost.tensor(x, requires_grad=True, device=device)
    tx = torch.tensor(x, requires_grad=True)
    f_out, t_out = f_fn(fx), t_fn(tx)
    if isinstance(t_out, tuple):
        np.testing.assert_array_equal(f_out[1].numpy(), t_out[1].numpy())
        f_out, t_out = f_out[0], t_out[0]
    np.testing.assert_allclose(f_out.detach().numpy(), t_out.detach().numpy(), rtol=1e-12)
    g = rng.standard_normal(t_out.shape)
    f_out.backward(frost.tensor(g, device=device))
    t_out.backward(torch.tensor(g))
    np.testing.assert_allclose(fx.grad.numpy(), tx.grad.numpy(), rtol=1e-12, atol=1e-15)


POOL_CASES = [
    dict(kernel_size=3), dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=2, stride=1, ceil_mode=True),
    dict(kernel_size=(4,), stride=(3,), padding=(2,), ceil_mode=True),
]


@pytest.mark.parametrize("shape", [(2, 3, 11), (3, 10)])
@pytest.mark.parametrize("kwargs", POOL_CASES)
def test_max_pool1d_matches_torch(shape, kwargs):
    _check(lambda x: F.max_pool1d(x, return_indices=True, **kwargs),
           lambda x: TF.max_pool1d(x, return_indices=True, **kwargs), shape)
    _check(lambda x: F.max_pool1d(x, dilation=2, **kwargs), lambda x: TF.max_pool1d(x, dilation=2, **kwargs), shape)


@pytest.mark.parametrize("shape", [(2, 3, 11), (3, 10)])
@pytest.mark.parametrize("kwargs", POOL_CASES)
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_pool1d_matches_torch(shape, kwargs, count_include_pad):
    _check(lambda x: F.avg_pool1d(x, count_include_pad=count_include_pad, **kwargs),
           lambda x: TF.avg_pool1d(x, count_include_pad=count_include_pad, **kwargs), shape)


@pytest.mark.parametrize("shape", [(2, 3, 11), (3, 7)])
@pytest.mark.parametrize("size", [1, 4, 5, (7,)])
def test_adaptive_pool1d_matches_torch(shape, size):
    _check(lambda x: F.adaptive_avg_pool1d(x, size), lambda x: TF.adaptive_avg_pool1d(x, size), shape)
    _check(lambda x: F.adaptive_max_pool1d(x, size, return_indices=True),
           lambda x: TF.adaptive_max_pool1d(x, size, return_indices=True), shape)


@pytest.mark.parametrize("size", [2, (3, 4), (None, 2)])
def test_adaptive_max_pool2d_layer_matches_torch(size):
    _check(nn.AdaptiveMaxPool2d(size, return_indices=True), torch.nn.AdaptiveMaxPool2d(size, return_indices=True),
           (2, 3, 7, 6))


@pytest.mark.parametrize("f_layer, t_layer", [
    (nn.MaxPool1d(3, 2, 1), torch.nn.MaxPool1d(3, 2, 1)),
    (nn.AvgPool1d(4, 2, 2, ceil_mode=True), torch.nn.AvgPool1d(4, 2, 2, ceil_mode=True)),
    (nn.AdaptiveAvgPool1d(3), torch.nn.AdaptiveAvgPool1d(3)),
    (nn.AdaptiveMaxPool1d(3), torch.nn.AdaptiveMaxPool1d(3)),
])
def test_1d_layers_match_torch(f_layer, t_layer):
    _check(f_layer, t_layer, (2, 4, 9))


def test_max_pool1d_indices_feed_max_unpool1d():
    x = frost.tensor(np.random.default_rng(5).standard_normal((1, 2, 8)))
    out, idx = F.max_pool1d(x, 2, return_indices=True)
    back = F.max_unpool1d(out, idx, 2)
    t_out, t_idx = TF.max_pool1d(torch.tensor(x.numpy()), 2, return_indices=True)
    np.testing.assert_array_equal(back.numpy(), TF.max_unpool1d(t_out, t_idx, 2).numpy())


def test_bad_input_is_refused_with_the_op_name():
    with pytest.raises(RuntimeError, match=r"max_pool1d: expected a 2-D \(C, L\) or 3-D .*\(2, 3, 4, 5\)"):
        F.max_pool1d(frost.zeros(2, 3, 4, 5), 2)
    with pytest.raises(ValueError, match="avg_pool1d: kernel_size must be an int or a 1-tuple"):
        F.avg_pool1d(frost.zeros(2, 3, 4), (2, 2))
    with pytest.raises(RuntimeError, match="max_pool1d: padding 2 should be at most half"):
        F.max_pool1d(frost.zeros(2, 3, 8), 3, padding=2)
    with pytest.raises(RuntimeError, match="avg_pool1d: output length is too small"):
        F.avg_pool1d(frost.zeros(2, 3, 2), 3)
    with pytest.raises(RuntimeError, match="adaptive_avg_pool1d: output size must be positive"):
        F.adaptive_avg_pool1d(frost.zeros(2, 3, 4), 0)


@pytest.mark.cuda
@pytest.mark.parametrize("kwargs", POOL_CASES)
def test_1d_pools_on_cuda_match_torch(kwargs):
    _check(lambda x: F.max_pool1d(x, return_indices=True, **kwargs),
           lambda x: TF.max_pool1d(x, return_indices=True, **kwargs), (2, 3, 11), device="cuda")
    _check(lambda x: F.avg_pool1d(x, **kwargs), lambda x: TF.avg_pool1d(x, **kwargs), (2, 3, 11), device="cuda")
    _check(lambda x: F.adaptive_max_pool1d(x, 4), lambda x: TF.adaptive_max_pool1d(x, 4), (2, 3, 11),
           device="cuda")
