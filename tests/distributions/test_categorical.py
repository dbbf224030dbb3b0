"""frost.distributions.Categorical against torch.distributions.Categorical in float64: log_prob and entropy with
gradients (from probs and from logits), sample shapes and frequencies (chi-square, fixed seed), argument checks."""
import math

import numpy as np
import pytest

import frost
from frost.distributions import Categorical

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(2)
LOGITS = RNG.standard_normal((2, 3, 5))
PROBS = RNG.uniform(0.1, 1.0, (3, 5))  # unnormalized: both normalize along the last dimension
VALUE = RNG.integers(0, 5, (4, 2, 3))


@pytest.mark.parametrize("given", ["logits", "probs"])
def test_log_prob_and_entropy_match_torch_with_gradients(against_torch, given):
    params = {given: LOGITS if given == "logits" else PROBS}
    value = torch.tensor(VALUE)
    against_torch(lambda **p: Categorical(**p).log_prob(frost.tensor(VALUE)),
                  lambda **p: torch.distributions.Categorical(**p).log_prob(value), params)
    against_torch(lambda **p: Categorical(**p).entropy(), lambda **p: torch.distributions.Categorical(**p).entropy(),
                  params)
    against_torch(lambda **p: Categorical(**p).probs, lambda **p: torch.distributions.Categorical(**p).probs, params)


def test_entropy_with_impossible_classes_is_finite_as_torchs():
    logits = np.array([[0.0, -np.inf, 1.0], [-np.inf, -np.inf, 2.0]])
    ours = Categorical(logits=frost.tensor(logits, dtype=frost.float64)).entropy().numpy()
    np.testing.assert_allclose(ours, torch.distributions.Categorical(logits=torch.tensor(logits)).entropy().numpy())


def test_sample_shapes_and_frequencies():
    probs = np.array([0.1, 0.2, 0.3, 0.15, 0.25])
    frost.manual_seed(3)
    dist = Categorical(probs=frost.tensor(np.stack([probs, probs[::-1]])))
    assert dist.batch_shape == (2,) and dist.sample().shape == (2,)
    draws = dist.sample((20000,))
    assert draws.shape == (20000, 2) and draws.dtype == frost.int64
    for column, p in enumerate((probs, probs[::-1])):
        counts = np.bincount(draws.numpy()[:, column], minlength=5)
        expected = counts.sum() * p
        half = float(((counts - expected) ** 2 / expected).sum()) / 2  # chi-square with 4 degrees of freedom
        assert math.exp(-half) * (1 + half) > 1e-6
    assert dist.sample((0, 3)).shape == (0, 3, 2)


def test_enumerate_support_mode_and_param_shape():
    dist = Categorical(logits=frost.tensor(LOGITS))
    assert dist.param_shape == (2, 3, 5) and dist.enumerate_support().shape == (5, 2, 3)
    np.testing.assert_array_equal(dist.mode.numpy(), LOGITS.argmax(-1))


def test_invalid_arguments_are_refused():
    with pytest.raises(ValueError, match="Categorical: give either probs or logits, not both and not neither"):
        Categorical()
    with pytest.raises(ValueError, match=r"Expected parameter probs \(Tensor of shape \(2,\)\).*Simplex"):
        Categorical(probs=frost.tensor([0.5, -0.5]))
    with pytest.raises(ValueError, match="Categorical: probs must be a floating-point tensor with at least one "
                                         "dimension, got a tensor of frost.int64"):
        Categorical(probs=frost.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"Expected parameter value \(Tensor of shape \(1,\)\).*IntegerInterval"):
        Categorical(logits=frost.zeros(3)).log_prob(frost.tensor([3]))


@pytest.mark.cuda
def test_categorical_on_cuda_matches_the_cpu():
    logits = frost.tensor(LOGITS, dtype=frost.float64)
    on_gpu = Categorical(logits=logits.to("cuda"))
    np.testing.assert_allclose(on_gpu.log_prob(frost.tensor(VALUE, device="cuda")).numpy(),
                               Categorical(logits=logits).log_prob(frost.tensor(VALUE)).numpy(), atol=1e-12)
    draws = on_gpu.sample((100,)).numpy()
    assert draws.shape == (100, 2, 3) and draws.min() >= 0 and draws.max() < 5
