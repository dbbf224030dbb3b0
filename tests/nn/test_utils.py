"""Tests of frost/nn/utils.py: gradient clipping (vs PyTorch) and parameter/vector conversion."""
import math

import numpy as np
import pytest
import torch

import frost
import frost.nn.utils
from frost import nn

rng = np.random.default_rng(0)
SHAPES = [(3, 4), (5,), (2, 2, 2)]


def _params_with_grads(scale: float):
    values = [rng.standard_normal(s) for s in SHAPES]
    grads = [rng.standard_normal(s) * scale for s in SHAPES]
    fp = [nn.Parameter(frost.tensor(v)) for v in values]
    tp = [torch.nn.Parameter(torch.tensor(v)) for v in values]
    for f, t, g in zip(fp, tp, grads):
        f.grad, t.grad = frost.tensor(g.copy()), torch.tensor(g.copy())
    return fp, tp


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf, -math.inf, 0.0])
@pytest.mark.parametrize("scale", [0.01, 10.0])
def test_clip_grad_norm_matches_torch(norm_type, scale):
    fp, tp = _params_with_grads(scale)
    fn = frost.nn.utils.clip_grad_norm_(fp, max_norm=1.5, norm_type=norm_type)
    tn = torch.nn.utils.clip_grad_norm_(tp, max_norm=1.5, norm_type=norm_type)
    assert isinstance(fn, frost.Tensor) and fn.shape == () and fn.dtype == frost.float64
    np.testing.assert_allclose(fn.item(), tn.item(), rtol=1e-12)
    for f, t in zip(fp, tp):
        np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy(), rtol=1e-12, atol=1e-15)


def test_clip_grad_norm_skips_params_without_grads_and_accepts_one_tensor():
    p, q = nn.Parameter(frost.ones(4)), nn.Parameter(frost.ones(2))
    p.grad = frost.full((4,), 3.0)
    total = frost.nn.utils.clip_grad_norm_([p, q], 1.0)
    assert total.item() == pytest.approx(6.0)
    np.testing.assert_allclose(p.grad.numpy(), 3.0 * 1.0 / (6.0 + 1e-6), rtol=1e-6)
    assert q.grad is None
    assert frost.nn.utils.clip_grad_norm_(p, 10.0).item() == pytest.approx(1.0, rel=1e-5)
    assert frost.nn.utils.clip_grad_norm_([q], 1.0).item() == 0.0


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # inf * 0, as in PyTorch
def test_clip_grad_norm_nonfinite():
    p = nn.Parameter(frost.ones(2))
    p.grad = frost.tensor([1.0, float("inf")])
    with pytest.raises(RuntimeError, match="non-finite"):
        frost.nn.utils.clip_grad_norm_([p], 1.0, error_if_nonfinite=True)
    assert math.isinf(frost.nn.utils.clip_grad_norm_([p], 1.0).item())


def test_clip_grad_value_matches_torch():
    fp, tp = _params_with_grads(2.0)
    frost.nn.utils.clip_grad_value_(fp, 0.7)
    torch.nn.utils.clip_grad_value_(tp, 0.7)
    for f, t in zip(fp, tp):
        np.testing.assert_array_equal(f.grad.numpy(), t.grad.numpy())


def test_parameters_to_vector_and_back():
    lin = nn.Linear(3, 2)
    vec = frost.nn.utils.parameters_to_vector(lin.parameters())
    assert vec.shape == (8,)
    np.testing.assert_array_equal(vec.detach().numpy(),
                                  np.concatenate([lin.weight.detach().numpy().ravel(), lin.bias.detach().numpy()]))
    (vec * frost.arange(8, dtype="float32")).sum().backward()  # differentiable w.r.t. the parameters
    np.testing.assert_array_equal(lin.weight.grad.numpy().ravel(), np.arange(6))
    frost.nn.utils.vector_to_parameters(frost.arange(8, dtype="float32"), lin.parameters())
    np.testing.assert_array_equal(lin.weight.detach().numpy(), np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(lin.bias.detach().numpy(), [6, 7])
    with pytest.raises(TypeError, match="expected frost.Tensor"):
        frost.nn.utils.vector_to_parameters(np.zeros(8), lin.parameters())
    with pytest.raises(RuntimeError, match="does not hold the 8 values"):
        frost.nn.utils.vector_to_parameters(frost.zeros(7), lin.parameters())
