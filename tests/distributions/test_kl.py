"""frost.distributions.kl_divergence against torch.distributions.kl_divergence in float64, values (including the
infinite cases) and gradients with respect to both distributions' parameters."""
import numpy as np
import pytest

import frost
from frost import distributions as fd

torch = pytest.importorskip("torch")
td = torch.distributions

RNG = np.random.default_rng(9)


def test_normal_normal(against_torch):
    params = {"a": RNG.standard_normal((3, 1)), "s": RNG.uniform(0.5, 2, (4,)), "b": RNG.standard_normal((4,)),
              "t": RNG.uniform(0.5, 2, (3, 4))}
    against_torch(lambda a, s, b, t: fd.kl_divergence(fd.Normal(a, s), fd.Normal(b, t)),
                  lambda a, s, b, t: td.kl_divergence(td.Normal(a, s), td.Normal(b, t)), params)


def test_categorical_categorical_with_impossible_classes():
    p = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    q = np.array([[0.2, 0.8, 0.0], [0.0, 0.5, 0.5]])  # row 1: q rules out a class p allows: +inf
    ours = fd.kl_divergence(fd.Categorical(probs=frost.tensor(p, dtype=frost.float64)),
                            fd.Categorical(probs=frost.tensor(q, dtype=frost.float64))).numpy()
    expected = td.kl_divergence(td.Categorical(probs=torch.tensor(p)), td.Categorical(probs=torch.tensor(q)))
    np.testing.assert_allclose(ours, expected.numpy(), atol=1e-12)
    assert np.isinf(ours[1])


def test_categorical_categorical_gradients(against_torch):
    params = {"p": RNG.standard_normal((2, 5)), "q": RNG.standard_normal((5,))}
    against_torch(lambda p, q: fd.kl_divergence(fd.Categorical(logits=p), fd.Categorical(logits=q)),
                  lambda p, q: td.kl_divergence(td.Categorical(logits=p), td.Categorical(logits=q)), params)


def test_bernoulli_bernoulli(against_torch):
    params = {"p": RNG.uniform(0.05, 0.95, (3, 4)), "q": RNG.uniform(0.05, 0.95, (3, 4))}  # torch's masks: no
    # broadcasting between p and q
    against_torch(lambda p, q: fd.kl_divergence(fd.Bernoulli(probs=p), fd.Bernoulli(probs=q)),
                  lambda p, q: td.kl_divergence(td.Bernoulli(probs=p), td.Bernoulli(probs=q)), params)
    edges = np.array([0.0, 1.0, 0.3, 0.3])
    others = np.array([0.5, 0.5, 0.0, 1.0])
    ours = fd.kl_divergence(fd.Bernoulli(probs=frost.tensor(edges)), fd.Bernoulli(probs=frost.tensor(others)))
    expected = td.kl_divergence(td.Bernoulli(probs=torch.tensor(edges)), td.Bernoulli(probs=torch.tensor(others)))
    np.testing.assert_allclose(ours.numpy(), expected.numpy(), rtol=1e-6)


def test_uniform_uniform(against_torch):
    params = {"a": np.array([0.0, -1.0]), "b": np.array([1.0, 2.0]), "c": np.array([-0.5, 0.0]),
              "d": np.array([2.0, 3.0])}  # the second pair: p leaves q's interval, +inf
    against_torch(lambda a, b, c, d: fd.kl_divergence(fd.Uniform(a, b), fd.Uniform(c, d)),
                  lambda a, b, c, d: td.kl_divergence(td.Uniform(a, b), td.Uniform(c, d)), params)


def test_unknown_pairs_are_refused():
    with pytest.raises(NotImplementedError, match=r"kl_divergence: no closed form for \(Normal, Uniform\)"):
        fd.kl_divergence(fd.Normal(0.0, 1.0), fd.Uniform(0.0, 1.0))
