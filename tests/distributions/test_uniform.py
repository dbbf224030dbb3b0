"""frost.distributions.Uniform against torch.distributions.Uniform in float64: log_prob (inside and outside the
support), cdf, icdf, entropy with gradients; rsample's gradient and moments (5 standard errors, fixed seed)."""
import math

import numpy as np
import pytest

import frost
from frost.distributions import Uniform

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(6)
LOW = RNG.uniform(-2, 0, (3, 1))
HIGH = RNG.uniform(0.5, 3, (4,))
VALUE = RNG.uniform(-3, 4, (2, 3, 4))  # some outside [low, high): log_prob -inf there, as torch's


@pytest.mark.parametrize("method", ["log_prob", "cdf"])
def test_log_prob_and_cdf_match_torch_with_gradients(against_torch, method):
    against_torch(lambda low, high, value: getattr(Uniform(low, high), method)(value),
                  lambda low, high, value: getattr(torch.distributions.Uniform(low, high, validate_args=False),
                                                   method)(value),
                  {"low": LOW, "high": HIGH, "value": VALUE})


def test_icdf_and_entropy_match_torch_with_gradients(against_torch):
    params = {"low": LOW, "high": HIGH}
    against_torch(lambda low, high: Uniform(low, high).entropy(),
                  lambda low, high: torch.distributions.Uniform(low, high).entropy(), params)
    quantiles = RNG.uniform(0, 1, (3, 4))
    against_torch(lambda low, high: Uniform(low, high).icdf(frost.tensor(quantiles)),
                  lambda low, high: torch.distributions.Uniform(low, high).icdf(torch.tensor(quantiles)), params)


def test_rsample_is_differentiable_and_uniform():
    low = frost.tensor([1.0], dtype=frost.float64, requires_grad=True)
    high = frost.tensor([3.0], dtype=frost.float64, requires_grad=True)
    frost.manual_seed(7)
    draws = Uniform(low, high).rsample((40000,))
    values = draws.detach().numpy()
    assert values.min() >= 1.0 and values.max() < 3.0
    assert abs(values.mean() - 2.0) < 5 * (2 / math.sqrt(12)) / math.sqrt(values.size)
    draws.sum().backward()  # d/dlow (low + u (high - low)) = 1 - u, d/dhigh = u
    u = (values - 1.0) / 2.0
    np.testing.assert_allclose(low.grad.numpy(), [(1 - u).sum()], rtol=1e-9)
    np.testing.assert_allclose(high.grad.numpy(), [u.sum()], rtol=1e-9)


def test_low_must_be_below_high():
    with pytest.raises(ValueError, match=r"Expected parameter low \(Tensor of shape \(2,\)\) of distribution "
                                         r"Uniform.*LessThan\(high\)"):
        Uniform(frost.tensor([0.0, 2.0]), frost.tensor([1.0, 2.0]))


@pytest.mark.cuda
def test_uniform_on_cuda_matches_the_cpu():
    low, high, value = (frost.tensor(a, dtype=frost.float64) for a in (LOW, HIGH, VALUE))
    np.testing.assert_allclose(Uniform(low.to("cuda"), high.to("cuda")).cdf(value.to("cuda")).numpy(),
                               Uniform(low, high).cdf(value).numpy(), atol=1e-12)
