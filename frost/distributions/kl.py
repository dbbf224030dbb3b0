"""kl_divergence(p, q): the Kullback-Leibler divergence KL(p || q) in closed form, for the pairs of distributions
that have one here (as torch.distributions.kl_divergence, whose formulas these are); differentiable in both."""
from __future__ import annotations

import math
from typing import Callable

from frost.distributions.bernoulli import Bernoulli
from frost.distributions.categorical import Categorical
from frost.distributions.distribution import Distribution
from frost.distributions.normal import Normal
from frost.distributions.uniform import Uniform
from frost.ops.elementwise import softplus, where
from frost.tensor import Tensor

__all__ = ["kl_divergence"]


def _kl_normal_normal(p: Normal, q: Normal) -> Tensor:
    var_ratio = (p.scale / q.scale) ** 2
    gap = ((p.loc - q.loc) / q.scale) ** 2
    return 0.5 * (var_ratio + gap - 1 - var_ratio.log())


def _kl_categorical_categorical(p: Categorical, q: Categorical) -> Tensor:
    """sum p (log p - log q): +inf where q rules out a class p allows, 0 terms where p rules it out."""
    terms = p.probs * (p.logits - q.logits)
    terms = where((q.probs == 0).expand(*terms.shape), math.inf, terms)
    return where((p.probs == 0).expand(*terms.shape), 0.0, terms).sum(-1)


def _kl_bernoulli_bernoulli(p: Bernoulli, q: Bernoulli) -> Tensor:
    ones = p.probs * (softplus(-q.logits) - softplus(-p.logits))
    ones = where(p.probs == 0, 0.0, where(q.probs == 0, math.inf, ones))
    zeros = (1 - p.probs) * (softplus(q.logits) - softplus(p.logits))
    zeros = where(p.probs == 1, 0.0, where(q.probs == 1, math.inf, zeros))
    return ones + zeros


def _kl_uniform_uniform(p: Uniform, q: Uniform) -> Tensor:
    """log(q's width / p's width), +inf where p's interval leaves q's."""
    result = ((q.high - q.low) / (p.high - p.low)).log()
    return where((q.low > p.low) | (q.high < p.high), math.inf, result)


_KL: dict[tuple[type, type], Callable[[Distribution, Distribution], Tensor]] = {
    (Normal, Normal): _kl_normal_normal,
    (Categorical, Categorical): _kl_categorical_categorical,
    (Bernoulli, Bernoulli): _kl_bernoulli_bernoulli,
    (Uniform, Uniform): _kl_uniform_uniform,
}


def kl_divergence(p: Distribution, q: Distribution) -> Tensor:
    """KL(p || q) over the broadcast batch shape."""
    formula = _KL.get((type(p), type(q)))
    if formula is None:
        known = ", ".join(f"({a.__name__}, {b.__name__})" for a, b in _KL)
        raise NotImplementedError(f"kl_divergence: no closed form for ({type(p).__name__}, {type(q).__name__}); "
                                  f"known pairs: {known}")
    return formula(p, q)
