"""Probability distributions with sampling, log-densities and entropies, as torch.distributions: gradients flow
through log_prob, entropy and cdf to the parameters, and through rsample (reparameterized draws) where the
distribution has one (Normal, Uniform)."""
from frost.distributions.distribution import Distribution
from frost.distributions.bernoulli import Bernoulli
from frost.distributions.categorical import Categorical
from frost.distributions.normal import Normal
from frost.distributions.uniform import Uniform
from frost.distributions.kl import kl_divergence

__all__ = ["Distribution", "Bernoulli", "Categorical", "Normal", "Uniform", "kl_divergence"]
