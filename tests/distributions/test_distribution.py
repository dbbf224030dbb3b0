"""The shared behaviour of frost.distributions: broadcasting of parameters, sample shapes, argument validation
switched off and on, and what a distribution without a formula says."""
import numpy as np
import pytest

import frost
from frost.distributions import Categorical, Distribution, Normal, Uniform
from frost.distributions.distribution import broadcast_all


def test_broadcast_all_turns_numbers_into_tensors_of_the_first_tensors_dtype():
    a, b, c = broadcast_all(frost.zeros(3, 1, dtype=frost.float64), 2.0, frost.ones(4, dtype=frost.float64))
    assert a.shape == b.shape == c.shape == (3, 4) and b.dtype == frost.float64
    assert broadcast_all(1.0, 2)[0].dtype == frost.float32


def test_sample_shapes_follow_sample_batch_and_event_shapes():
    normal = Normal(frost.zeros(2, 3), 1.0)
    assert normal.batch_shape == (2, 3) and normal.event_shape == ()
    assert normal.sample().shape == (2, 3) and normal.sample(4).shape == (4, 2, 3)
    assert normal.rsample((5, 1)).shape == (5, 1, 2, 3)
    assert Uniform(0.0, 1.0).sample((7,)).shape == (7,)


def test_validation_can_be_switched_off_for_all_distributions():
    try:
        Distribution.set_default_validate_args(False)
        Normal(0.0, -1.0)  # accepted without checks
    finally:
        Distribution.set_default_validate_args(True)
    with pytest.raises(ValueError, match="scale"):
        Normal(0.0, -1.0)


def test_stddev_perplexity_and_missing_formulas():
    normal = Normal(frost.tensor([0.0]), frost.tensor([2.0]))
    np.testing.assert_allclose(normal.stddev.numpy(), [2.0])
    np.testing.assert_allclose(normal.perplexity().numpy(), np.exp(normal.entropy().numpy()), rtol=1e-6)
    with pytest.raises(NotImplementedError, match="Categorical has no reparameterized sample"):
        Categorical(logits=frost.zeros(3)).rsample()
    assert not Categorical.has_rsample and Normal.has_rsample
