"""frost.distributions.Normal against torch.distributions.Normal in float64: log_prob, cdf, entropy and their
gradients, rsample's gradient, sample statistics (5 standard errors, fixed seed) and argument checks."""
import math

import numpy as np
import pytest

import frost
from frost.distributions import Normal

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(1)
LOC = RNG.standard_normal((3, 1))
SCALE = RNG.uniform(0.3, 2.0, (4,))
VALUE = RNG.standard_normal((2, 3, 4)) * 2


@pytest.mark.parametrize("method", ["log_prob", "cdf"])
def test_log_prob_and_cdf_match_torch_with_gradients(against_torch, method):
    against_torch(lambda loc, scale, value: getattr(Normal(loc, scale), method)(value),
                  lambda loc, scale, value: getattr(torch.distributions.Normal(loc, scale), method)(value),
                  {"loc": LOC, "scale": SCALE, "value": VALUE})


def test_entropy_mean_and_stddev_match_torch(against_torch):
    against_torch(lambda loc, scale: Normal(loc, scale).entropy(),
                  lambda loc, scale: torch.distributions.Normal(loc, scale).entropy(), {"loc": LOC, "scale": SCALE})
    against_torch(lambda loc, scale: Normal(loc, scale).variance,
                  lambda loc, scale: torch.distributions.Normal(loc, scale).variance, {"loc": LOC, "scale": SCALE})


def test_numbers_as_parameters_and_values():
    normal = Normal(0.0, 2.0)
    assert normal.batch_shape == () and normal.loc.dtype == frost.float32
    expected = torch.distributions.Normal(0.0, 2.0).log_prob(torch.tensor(1.5)).item()
    assert math.isclose(normal.log_prob(1.5).item(), expected, rel_tol=1e-6)


def test_rsample_is_loc_plus_scale_times_noise_and_differentiable():
    loc = frost.tensor([1.0, -2.0], dtype=frost.float64, requires_grad=True)
    scale = frost.tensor([0.5, 3.0], dtype=frost.float64, requires_grad=True)
    frost.manual_seed(0)
    draws = Normal(loc, scale).rsample((5,))
    frost.manual_seed(0)
    noise = frost.randn(5, 2, dtype=frost.float64).numpy()
    assert draws.shape == (5, 2)
    np.testing.assert_allclose(draws.detach().numpy(), loc.detach().numpy() + noise * scale.detach().numpy())
    draws.sum().backward()
    np.testing.assert_allclose(loc.grad.numpy(), [5.0, 5.0])
    np.testing.assert_allclose(scale.grad.numpy(), noise.sum(0))


def test_sample_has_no_gradient_and_the_right_moments():
    loc = frost.tensor([10.0, -1.0], dtype=frost.float64, requires_grad=True)
    frost.manual_seed(2)
    draws = Normal(loc, frost.tensor([2.0, 0.1], dtype=frost.float64)).sample((40000,))
    assert not draws.requires_grad and draws.shape == (40000, 2)
    for column, (mean, std) in enumerate(((10.0, 2.0), (-1.0, 0.1))):
        values = draws.numpy()[:, column]
        assert abs(values.mean() - mean) < 5 * std / math.sqrt(values.size)
        assert abs(values.std() - std) < 5 * std / math.sqrt(2 * values.size)


def test_invalid_parameters_are_refused_with_the_distribution_named():
    with pytest.raises(ValueError, match=r"Expected parameter scale \(Tensor of shape \(2,\)\) of distribution "
                                         r"Normal\(loc: \(2,\), scale: \(2,\)\).*GreaterThan"):
        Normal(frost.zeros(2), frost.tensor([1.0, 0.0]))
    Normal(frost.zeros(2), frost.tensor([1.0, 0.0]), validate_args=False)  # no check asked for
    with pytest.raises(TypeError, match="distribution parameters must be tensors or numbers, got str"):
        Normal("0", 1.0)


@pytest.mark.cuda
def test_normal_on_cuda_matches_the_cpu():
    loc, scale, value = (frost.tensor(a, dtype=frost.float64) for a in (LOC, SCALE, VALUE))
    on_cpu = Normal(loc, scale)
    on_gpu = Normal(loc.to("cuda"), scale.to("cuda"))
    for method in ("log_prob", "cdf"):
        np.testing.assert_allclose(getattr(on_gpu, method)(value.to("cuda")).numpy(),
                                   getattr(on_cpu, method)(value).numpy(), atol=1e-12)
    assert on_gpu.rsample((3,)).device.type == "cuda"
