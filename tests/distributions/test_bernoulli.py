"""frost.distributions.Bernoulli against torch.distributions.Bernoulli in float64: log_prob, entropy, mean and
variance with gradients, from probs and from logits; sample frequencies (5 standard errors, fixed seed); checks."""
import math

import numpy as np
import pytest

import frost
from frost.distributions import Bernoulli

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(4)
PROBS = RNG.uniform(0.01, 0.99, (3, 4))
LOGITS = RNG.standard_normal((3, 4)) * 30  # large logits: log_prob must not overflow
VALUE = RNG.integers(0, 2, (2, 3, 4)).astype(float)


@pytest.mark.parametrize("given", ["probs", "logits"])
def test_log_prob_entropy_and_moments_match_torch_with_gradients(against_torch, given):
    params = {given: PROBS if given == "probs" else LOGITS}
    value = torch.tensor(VALUE)
    against_torch(lambda **p: Bernoulli(**p).log_prob(frost.tensor(VALUE, dtype=frost.float64)),
                  lambda **p: torch.distributions.Bernoulli(**p).log_prob(value), params)
    against_torch(lambda **p: Bernoulli(**p).entropy(), lambda **p: torch.distributions.Bernoulli(**p).entropy(),
                  params)
    against_torch(lambda **p: Bernoulli(**p).variance, lambda **p: torch.distributions.Bernoulli(**p).variance,
                  params)


def test_sample_frequencies_and_shapes():
    frost.manual_seed(5)
    p = np.array([0.0, 0.2, 0.7, 1.0])
    draws = Bernoulli(probs=frost.tensor(p)).sample((30000,))
    assert draws.shape == (30000, 4) and not draws.requires_grad
    values = draws.numpy()
    assert (values[:, 0] == 0).all() and (values[:, 3] == 1).all()
    for j in (1, 2):
        assert abs(values[:, j].mean() - p[j]) < 5 * math.sqrt(p[j] * (1 - p[j]) / values.shape[0])


def test_invalid_arguments_are_refused():
    with pytest.raises(ValueError, match="Bernoulli: give either probs or logits"):
        Bernoulli(probs=0.5, logits=0.0)
    with pytest.raises(ValueError, match=r"Expected parameter probs \(Tensor of shape \(2,\)\).*Interval"):
        Bernoulli(probs=frost.tensor([0.5, 1.5]))
    with pytest.raises(ValueError, match=r"Expected parameter value.*Boolean"):
        Bernoulli(probs=0.5).log_prob(frost.tensor([0.5]))


@pytest.mark.cuda
def test_bernoulli_on_cuda_matches_the_cpu():
    logits = frost.tensor(LOGITS, dtype=frost.float64)
    value = frost.tensor(VALUE, dtype=frost.float64)
    np.testing.assert_allclose(Bernoulli(logits=logits.to("cuda")).log_prob(value.to("cuda")).numpy(),
                               Bernoulli(logits=logits).log_prob(value).numpy(), atol=1e-12)
