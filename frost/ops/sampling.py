"""Random sampling: multinomial, bernoulli, normal and the in-place draws (exponential_, bernoulli_, cauchy_,
log_normal_, geometric_), each with PyTorch's `generator=` (a frost.Generator; None draws from the global one).

The draws carry no gradient, as PyTorch's: a differentiable sample is a reparameterized one
(frost.distributions.Normal.rsample). Uniform draws are float64 for float64 results, else float32 (as frost.rand).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from frost.dtype import default_float_dtype, to_dtype
from frost.generator import engine
from frost.tensor import Tensor, _resolve, _shape_args, can_read_values

_MAX_CATEGORIES = 1 << 24  # PyTorch's limit: float32 draws cannot tell more categories apart


def _uniform(eng: Any, shape: tuple, dtype) -> Any:
    """Uniform draws in [0, 1), float64 for a float64 result, else float32."""
    return eng.random(shape, dtype=np.float64 if np.dtype(dtype) == np.float64 else np.float32)


def _exponential(xp, eng: Any, shape: tuple, dtype) -> Any:
    """Exp(1) draws: -log(1 - u), finite since u < 1."""
    return -xp.log1p(-_uniform(eng, shape, dtype))


# ---------------------------------------------------------------- multinomial
def multinomial(input: Tensor, num_samples: int, replacement: bool = False, *, generator=None) -> Tensor:
    """Category indices (int64) drawn with probabilities proportional to the rows of `input` (1-D or 2-D, floating,
    non-negative, not all zero): shape (num_samples,) or (rows, num_samples). Without replacement each row's draws
    are distinct (PyTorch's method: the largest p / Exp(1) draws)."""
    _check_multinomial(input, num_samples, replacement)
    xp = input.xp
    eng = engine(generator, input.device, "multinomial")
    probs = input.detach().data.reshape(-1, input.shape[-1]).astype(np.float64)
    if replacement and num_samples > 1:
        picks = _with_replacement(xp, eng, probs, num_samples)
    else:
        with np.errstate(divide="ignore", invalid="ignore"):  # an Exp(1) draw of 0: the key is inf (or NaN, last)
            keys = probs / _exponential(xp, eng, probs.shape, np.float64)
        picks = xp.argsort(-keys, axis=-1, kind="stable")[:, :num_samples]
    return Tensor(picks.astype(np.int64).reshape(input.shape[:-1] + (num_samples,)))


def _check_multinomial(input: Tensor, num_samples: int, replacement: bool) -> None:
    if not isinstance(input, Tensor):
        raise TypeError(f"multinomial: input must be a Tensor, got {type(input).__name__}")
    if input.ndim not in (1, 2):
        raise RuntimeError(f"multinomial: prob_dist must be 1 or 2 dim, got shape {input.shape}")
    if not input.dtype.is_floating_point:
        raise RuntimeError(f"multinomial: only supports floating-point dtypes for input, got {input.dtype}")
    categories = input.shape[-1]
    if categories == 0 or categories > _MAX_CATEGORIES:
        raise RuntimeError(f"multinomial: the number of categories must be in [1, 2^24], got {categories} "
                           f"(shape {input.shape})")
    if num_samples <= 0:
        raise RuntimeError(f"multinomial: cannot sample n_sample <= 0 samples, got {num_samples}")
    if not replacement and num_samples > categories:
        raise RuntimeError(f"multinomial: cannot sample n_sample > prob_dist.size(-1) samples without replacement "
                           f"({num_samples} > {categories}, shape {input.shape})")
    if can_read_values(input):
        p = input.detach().data
        if not bool((input.xp.isfinite(p) & (p >= 0)).all()):
            raise RuntimeError(f"multinomial: probability tensor contains either `inf`, `nan` or element < 0 "
                               f"(shape {input.shape})")
        if not bool((p.reshape(-1, categories).sum(axis=-1) > 0).all()):
            raise RuntimeError(f"multinomial: invalid multinomial distribution (sum of probabilities <= 0) "
                               f"(shape {input.shape})")


def _with_replacement(xp, eng, probs, num_samples: int):
    """Inverse-CDF draws for every row in one search: row r's normalized CDF is shifted by 2r, so that all rows'
    CDFs sort as one array. The uniform draws are float32 so that u + 2r is exact in float64 (r < 2^28): a category
    of zero probability (an empty CDF step) is then never picked."""
    rows, categories = probs.shape
    cdf = xp.cumsum(probs, axis=-1)
    cdf /= cdf[:, -1:]
    shift = 2.0 * xp.arange(rows, dtype=np.float64)[:, None]
    u = eng.random((rows, num_samples), dtype=np.float32).astype(np.float64)
    found = xp.searchsorted((cdf + shift).reshape(-1), (u + shift).reshape(-1), side="right")
    picks = found.reshape(rows, num_samples) - categories * xp.arange(rows)[:, None]
    return xp.minimum(picks, categories - 1)  # a guard only: row r's last key is 2r + 1 exactly, above u + 2r


# ---------------------------------------------------------------- bernoulli
def bernoulli(input: Tensor, p: float | None = None, *, generator=None) -> Tensor:
    """0/1 draws of input's shape and dtype: with probabilities `input` (in [0, 1]), or with probability `p`."""
    if not isinstance(input, Tensor):
        raise TypeError(f"bernoulli: input must be a Tensor, got {type(input).__name__}")
    if p is None:
        probs = input.detach().data
        if not input.dtype.is_floating_point:
            raise RuntimeError(f"bernoulli: the probabilities must be floating point, got {input.dtype} "
                               f"(shape {input.shape})")
        if can_read_values(input) and not bool(((probs >= 0) & (probs <= 1)).all()):
            raise RuntimeError(f"bernoulli: expects every probability in [0, 1], got a value outside "
                               f"(shape {input.shape})")
    else:
        probs = _check_probability(p, "bernoulli")
    u = _uniform(engine(generator, input.device, "bernoulli"), input.shape, input.data.dtype)
    return Tensor((u < probs).astype(input.data.dtype))


def _check_probability(p: float, who: str) -> float:
    if not 0.0 <= p <= 1.0:
        raise RuntimeError(f"{who}: expects p to be in [0, 1], but got p={p}")
    return p


def bernoulli_(self: Tensor, p: float | Tensor = 0.5, *, generator=None) -> Tensor:
    """Fill self with 0/1 draws, 1 with probability p (a number, or a tensor broadcasting to self's shape)."""
    probs = p.detach().data if isinstance(p, Tensor) else _check_probability(p, "bernoulli_")
    u = _uniform(engine(generator, self.device, "bernoulli_"), self.shape, self.data.dtype)
    return _fill(self, "bernoulli_", u < probs)


# ---------------------------------------------------------------- normal
def normal(mean: Tensor | float, std: Tensor | float = 1.0, size: Sequence[int] | None = None, *, generator=None,
           dtype=None, device=None) -> Tensor:
    """Normal draws with the given means and standard deviations (tensors broadcast together; with two numbers,
    `size` gives the shape). No gradient flows to mean or std: use frost.distributions.Normal.rsample for one."""
    tensors = [t for t in (mean, std) if isinstance(t, Tensor)]
    if tensors:
        if size is not None:
            raise RuntimeError("normal: size is only for a float mean and std; with tensors the shape is theirs")
        like = tensors[0]
        dt = to_dtype(np.result_type(*[t.data.dtype for t in tensors]))
        if not dt.is_floating_point:
            raise RuntimeError(f"normal: mean and std must be floating point, got {[str(t.dtype) for t in tensors]}")
        shape = np.broadcast_shapes(*[t.shape for t in tensors])
        dev = like.device
    else:
        if size is None:
            raise RuntimeError("normal: with a float mean and std, give the shape as size=")
        dev, dt = _resolve(device, dtype, default_float_dtype())
        shape = _shape_args((size,) if isinstance(size, int) else tuple(size))
    std_values = std.detach().data if isinstance(std, Tensor) else std
    if (not isinstance(std, Tensor) or can_read_values(std)) and not bool(np.all(_host(std_values) >= 0)):
        raise RuntimeError(f"normal: expects all elements of std >= 0.0, got {_describe(std)}")
    z = engine(generator, dev, "normal").standard_normal(shape, dtype=np.float64 if dt.np == np.float64 else
                                                         np.float32)
    mean_values = mean.detach().data if isinstance(mean, Tensor) else mean
    return Tensor((z * std_values + mean_values).astype(dt.np, copy=False))


def _host(a: Any) -> Any:
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else a


def _describe(value: Any) -> str:
    return f"a tensor of shape {value.shape}" if isinstance(value, Tensor) else repr(value)


# ---------------------------------------------------------------- in-place draws
def _fill(self: Tensor, who: str, values: Any) -> Tensor:
    self._inplace_check(who)
    self.data[...] = values
    return self


def _floating(self: Tensor, who: str) -> None:
    if not self.dtype.is_floating_point:
        raise RuntimeError(f"{who}: draws floating-point numbers, got a tensor of {self.dtype} (shape {self.shape})")


def exponential_(self: Tensor, lambd: float = 1.0, *, generator=None) -> Tensor:
    """Fill self with Exponential(rate lambd) draws."""
    _floating(self, "exponential_")
    if not lambd > 0:
        raise RuntimeError(f"exponential_: expects lambda > 0.0, but found lambda={lambd}")
    draws = _exponential(self.xp, engine(generator, self.device, "exponential_"), self.shape, self.data.dtype)
    return _fill(self, "exponential_", draws / lambd)


def cauchy_(self: Tensor, median: float = 0.0, sigma: float = 1.0, *, generator=None) -> Tensor:
    """Fill self with Cauchy(median, sigma) draws: median + sigma * tan(pi * (u - 1/2))."""
    _floating(self, "cauchy_")
    u = _uniform(engine(generator, self.device, "cauchy_"), self.shape, self.data.dtype)
    return _fill(self, "cauchy_", median + sigma * self.xp.tan(math.pi * (u - 0.5)))


def log_normal_(self: Tensor, mean: float = 1.0, std: float = 2.0, *, generator=None) -> Tensor:
    """Fill self with exp(N(mean, std^2)) draws."""
    _floating(self, "log_normal_")
    if not std > 0:
        raise RuntimeError(f"log_normal_: expects std > 0.0, but found std={std}")
    z = engine(generator, self.device, "log_normal_").standard_normal(self.shape, dtype=_draw_dtype(self))
    return _fill(self, "log_normal_", self.xp.exp(z * std + mean))


def geometric_(self: Tensor, p: float, *, generator=None) -> Tensor:
    """Fill self with the number of Bernoulli(p) trials up to the first success (1, 2, ...)."""
    if not 0 < p < 1:
        raise RuntimeError(f"geometric_: expects p in (0, 1), but got p={p}")
    u = _uniform(engine(generator, self.device, "geometric_"), self.shape, np.float64)
    return _fill(self, "geometric_", self.xp.ceil(self.xp.log1p(-u) / math.log1p(-p)).clip(1, None))


def _draw_dtype(self: Tensor):
    return np.float64 if self.data.dtype == np.float64 else np.float32
