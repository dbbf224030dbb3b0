"""Tests for frost/ops/random.py: dropout statistics, exact scaling, gradients, seeding; Bernoulli sampling."""
import numpy as np
import pytest

import frost
from frost.ops.random import bernoulli, dropout, dropout2d


def _ones(shape, dtype="float32", grad=True):
    return frost.ones(*shape, dtype=dtype, requires_grad=grad)


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.9])
def test_dropout_keeps_about_one_minus_p(p):
    frost.manual_seed(0)
    out = dropout(_ones((200, 500)), p)
    kept = (out.detach().numpy() != 0).mean()
    # 100k Bernoulli draws: the standard deviation of the mean is below 0.0016
    assert abs(kept - (1 - p)) < 0.01
    assert abs(out.detach().numpy().mean() - 1.0) < 0.03  # inverted dropout keeps the expectation


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_dropout_scaling_is_exact_and_gradient_is_mask_times_scale(dtype):
    frost.manual_seed(1)
    p = 0.3
    x_np = np.random.default_rng(0).standard_normal((50, 40)).astype(dtype)
    x = frost.Tensor(x_np.copy(), requires_grad=True)
    out = dropout(x, p)
    assert out.dtype.name == dtype
    kept = out.detach().numpy() != 0
    scale = np.asarray(1 / (1 - p), dtype=dtype)
    np.testing.assert_array_equal(out.detach().numpy()[kept], x_np[kept] * scale)
    np.testing.assert_allclose(out.detach().numpy()[kept].astype(np.float64), x_np[kept].astype(np.float64) / (1 - p),
                               rtol=2e-3 if dtype == "float16" else 1e-6)
    assert (out.detach().numpy()[~kept] == 0).all()
    g = np.random.default_rng(1).standard_normal((50, 40)).astype(dtype)
    out.backward(frost.Tensor(g))
    np.testing.assert_array_equal(x.grad.numpy(), np.where(kept, g * scale, 0).astype(dtype))


def test_dropout_mask_comes_from_frost_cpu_generator():
    p = 0.25
    frost.manual_seed(42)
    out = dropout(_ones((7, 9), grad=False), p)
    frost.manual_seed(42)
    keep = frost.backend.cpu.generator().random((7, 9), dtype=np.float32) >= p
    np.testing.assert_array_equal(out.numpy() != 0, keep)


def test_dropout_same_seed_same_mask_different_seed_different_mask():
    x = _ones((64, 64), grad=False)
    frost.manual_seed(7)
    a = dropout(x, 0.5).numpy()
    b = dropout(x, 0.5).numpy()
    frost.manual_seed(7)
    c = dropout(x, 0.5).numpy()
    frost.manual_seed(8)
    d = dropout(x, 0.5).numpy()
    np.testing.assert_array_equal(a, c)
    assert not np.array_equal(a, b)  # the generator advances between calls
    assert not np.array_equal(a, d)


def test_dropout_identity_cases():
    x = frost.randn(3, 4, requires_grad=True)
    assert dropout(x, 0.5, training=False) is x
    assert dropout(x, 0.0) is x


def test_dropout_p_one_zeroes_everything_and_its_gradient():
    x = frost.randn(3, 4, requires_grad=True)
    out = dropout(x, 1.0)
    assert (out.detach().numpy() == 0).all()
    out.sum().backward()
    assert (x.grad.numpy() == 0).all()


def test_dropout_errors():
    x = frost.randn(3, 4)
    with pytest.raises(ValueError, match=r"dropout: dropout probability has to be between 0 and 1, but got 1.5"):
        dropout(x, 1.5)
    with pytest.raises(ValueError, match=r"dropout: dropout probability has to be between 0 and 1, but got -0.1"):
        dropout(x, -0.1)
    with pytest.raises(TypeError, match=r"dropout: needs a floating-point tensor, got frost.int64"):
        dropout(frost.tensor([1, 2]), 0.5)


def test_dropout2d_zeroes_whole_channels():
    frost.manual_seed(3)
    x = frost.randn(4, 16, 5, 5, requires_grad=True)
    out = dropout2d(x, 0.5)
    per_channel = out.detach().numpy().reshape(4, 16, -1)
    zero = (per_channel == 0).all(axis=2)
    kept = np.isclose(per_channel, x.detach().numpy().reshape(4, 16, -1) * 2).all(axis=2)
    assert (zero | kept).all() and zero.any() and kept.any()
    out.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy().reshape(4, 16, -1)[:, :, 0], np.where(zero, 0, 2))
    with pytest.raises(RuntimeError, match=r"dropout2d: expected a 3-D .* got shape \(4, 5\)"):
        dropout2d(frost.randn(4, 5))


def test_bernoulli_mean_and_seed():
    probs = frost.full((100, 1000), 0.2)
    frost.manual_seed(5)
    a = bernoulli(probs)
    frost.manual_seed(5)
    b = bernoulli(probs)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert set(np.unique(a.numpy())) <= {0.0, 1.0}
    assert abs(a.numpy().mean() - 0.2) < 0.01
    edge = bernoulli(frost.tensor([0.0, 1.0] * 50))
    np.testing.assert_array_equal(edge.numpy(), [0.0, 1.0] * 50)


@pytest.mark.cuda
def test_dropout_cuda_uses_the_cuda_generator():
    p = 0.3
    x = frost.ones(256, 256, device="cuda", requires_grad=True)
    frost.manual_seed(4)
    out = dropout(x, p)
    frost.manual_seed(4)
    keep = frost.backend.cuda.generator().random((256, 256), dtype="float32") >= p
    assert out.device.type == "cuda"
    values = out.detach().cpu().numpy()
    np.testing.assert_array_equal(values != 0, frost.backend.cuda.to_host(keep))
    assert abs((values != 0).mean() - (1 - p)) < 0.01
    out.sum().backward()
    np.testing.assert_array_equal(x.grad.cpu().numpy(), values)
