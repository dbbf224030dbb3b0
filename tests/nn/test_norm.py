"""Tests of frost/nn/norm.py: BatchNorm1d/2d (train and eval), LayerNorm, RMSNorm against PyTorch."""
import numpy as np
import pytest
import torch

import frost
from frost import nn

from .helpers import assert_close, compare_layer, copy_weights

rng = np.random.default_rng(0)


def _randomize_affine(t_module):
    with torch.no_grad():
        for p in t_module.parameters():
            p.uniform_(0.5, 1.5)
    return t_module


@pytest.mark.parametrize("kwargs", [{}, dict(affine=False), dict(momentum=None), dict(track_running_stats=False),
                                    dict(bias=False), dict(eps=1e-3, momentum=0.3)])
@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 5)])
def test_batchnorm1d_training_matches_torch_including_running_stats(kwargs, shape):
    f, t = nn.BatchNorm1d(3, **kwargs), _randomize_affine(torch.nn.BatchNorm1d(3, **kwargs))
    compare_layer(f, t, rng.standard_normal(shape) * 2 + 1)
    for name, tb in t.named_buffers():
        assert_close(dict(f.named_buffers())[name], tb, what=name)


def test_batchnorm2d_several_steps_then_eval_match_torch():
    for momentum in (0.1, None):
        f, t = nn.BatchNorm2d(4, momentum=momentum), _randomize_affine(torch.nn.BatchNorm2d(4, momentum=momentum))
        t.double()
        f.double()
        copy_weights(t, f)
        for step in range(3):
            x = rng.standard_normal((3, 4, 5, 5)) * (step + 1) + step
            assert_close(f(frost.tensor(x)), t(torch.tensor(x)), what=f"train step {step}")
        assert f.num_batches_tracked.item() == 3
        for name, tb in t.named_buffers():
            assert_close(dict(f.named_buffers())[name], tb, what=name)
        f.eval()
        t.eval()
        compare_layer(f, t, rng.standard_normal((2, 4, 3, 3)))
        assert f.num_batches_tracked.item() == 3  # eval does not count batches


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("shape", [(0, 4, 3, 3), (2, 4, 0, 3)])
def test_batchnorm2d_on_empty_batch_in_training_matches_torch(shape, momentum):
    # an empty batch used to raise; PyTorch returns it empty, keeps the running statistics and counts the batch
    f, t = nn.BatchNorm2d(4, momentum=momentum), _randomize_affine(torch.nn.BatchNorm2d(4, momentum=momentum))
    compare_layer(f, t, rng.standard_normal(shape))
    assert f.num_batches_tracked.item() == t.num_batches_tracked.item() == 1
    compare_layer(f, t, rng.standard_normal((3, 4, 2, 2)), copy=False)  # the next real batch's update agrees too
    for name, tb in t.named_buffers():
        assert_close(dict(f.named_buffers())[name], tb, what=name)


def test_batchnorm_eval_uses_running_stats_and_leaves_them_alone():
    bn = nn.BatchNorm2d(2)
    bn.running_mean.data[...] = [1.0, -1.0]
    bn.running_var.data[...] = [4.0, 1.0]
    bn.eval()
    x = frost.randn(3, 2, 4, 4)
    y = bn(x).detach().numpy()
    expected = (x.numpy() - np.array([1.0, -1.0]).reshape(1, 2, 1, 1)) / np.sqrt(
        np.array([4.0, 1.0]).reshape(1, 2, 1, 1) + 1e-5)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(bn.running_mean.numpy(), [1.0, -1.0])
    bn.train()
    bn(x)
    assert not np.allclose(bn.running_mean.numpy(), [1.0, -1.0])
    # training mode normalizes with batch statistics: per-channel mean 0, variance 1
    z = bn(x).detach().numpy()
    np.testing.assert_allclose(z.mean(axis=(0, 2, 3)), 0, atol=1e-5)


def test_batchnorm_without_running_stats_uses_batch_stats_in_eval():
    f, t = nn.BatchNorm2d(3, track_running_stats=False), torch.nn.BatchNorm2d(3, track_running_stats=False)
    f.eval()
    t.eval()
    compare_layer(f, t, rng.standard_normal((4, 3, 2, 2)))
    assert list(f.state_dict()) == list(t.state_dict()) == ["weight", "bias"]


def test_batchnorm_state_dict_repr_and_input_checks():
    f, t = nn.BatchNorm2d(5), torch.nn.BatchNorm2d(5)
    assert list(f.state_dict()) == list(t.state_dict())
    assert f.state_dict()["num_batches_tracked"].dtype == frost.int64
    for kwargs in ({}, dict(momentum=None, affine=False), dict(bias=False)):
        assert repr(nn.BatchNorm1d(5, **kwargs)) == repr(torch.nn.BatchNorm1d(5, **kwargs))
    with pytest.raises(ValueError, match=r"expected 4D input \(got 3D input"):
        f(frost.randn(2, 5, 3))
    with pytest.raises(ValueError, match=r"expected 2D or 3D input \(got 4D input"):
        nn.BatchNorm1d(5)(frost.randn(2, 5, 3, 3))


@pytest.mark.parametrize("kwargs", [{}, dict(elementwise_affine=False), dict(bias=False), dict(eps=1e-3)])
def test_layer_norm_matches_torch(kwargs):
    f, t = nn.LayerNorm((4, 5), **kwargs), _randomize_affine(torch.nn.LayerNorm((4, 5), **kwargs))
    compare_layer(f, t, rng.standard_normal((3, 4, 5)) * 3 + 2)
    assert repr(f) == repr(t)
    assert nn.LayerNorm(7).normalized_shape == (7,)


@pytest.mark.parametrize("kwargs", [{}, dict(eps=1e-4), dict(elementwise_affine=False)])
def test_rms_norm_matches_torch(kwargs):
    f, t = nn.RMSNorm(6, **kwargs), _randomize_affine(torch.nn.RMSNorm(6, **kwargs))
    compare_layer(f, t, rng.standard_normal((2, 3, 6)))
    assert repr(f) == repr(t)
