"""Tensors of random draws from Frost's generators (CPU: NumPy's PCG64; CUDA: Philox, see frost.accel.philox), or from
a frost.Generator given as `generator=`: randn, rand, randint, randperm and the in-place uniform_ and normal_."""
from __future__ import annotations

import numpy as np

from frost.backend import Device
from frost.dtype import DType, default_float_dtype, to_dtype
from frost.generator import engine
from frost.tensor import Tensor, _resolve, _shape_args


def _draw_dtype(dt: DType):
    # draw float64 directly when asked for it; every other float type is drawn in float32 and cast
    return np.float64 if dt.name == "float64" else np.float32


def _random_normal(shape, device: Device, dtype=np.float32, generator=None, who: str = "randn"):
    return engine(generator, device, who).standard_normal(shape, dtype=dtype)


def _random_uniform(shape, low, high, device: Device, dtype=np.float32, generator=None, who: str = "rand"):
    return engine(generator, device, who).random(shape, dtype=dtype) * (high - low) + low


def _floating(name: str, dt: DType) -> DType:
    if not dt.is_floating_point:
        raise TypeError(f"{name}: draws floating-point numbers, so the dtype must be a floating one, got {dt}; use "
                        f"randint for integers")
    return dt


def randn(*shape, generator=None, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    dev, dt = _resolve(device, dtype, default_float_dtype())
    dt = _floating("randn", dt)
    out = _random_normal(_shape_args(shape), dev, _draw_dtype(dt), generator)
    return Tensor(out.astype(dt.np, copy=False), requires_grad=requires_grad)


def rand(*shape, generator=None, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    dev, dt = _resolve(device, dtype, default_float_dtype())
    dt = _floating("rand", dt)
    out = _random_uniform(_shape_args(shape), 0.0, 1.0, dev, _draw_dtype(dt), generator)
    return Tensor(out.astype(dt.np, copy=False), requires_grad=requires_grad)


def randint(low: int, high: int | None = None, size=(), *, generator=None, dtype=None, device=None) -> Tensor:
    """Integers in [low, high); like PyTorch also randint(high, size)."""
    if isinstance(high, (tuple, list)):
        low, high, size = 0, low, high
    elif high is None:
        low, high = 0, low
    dev, dt = _resolve(device, dtype, to_dtype("int64"))
    if high <= low:
        raise RuntimeError(f"randint: high ({high}) must be larger than low ({low})")
    if dt.np.kind in "iu" and not (np.iinfo(dt.np).min <= low and high - 1 <= np.iinfo(dt.np).max):
        raise RuntimeError(f"randint: [{low}, {high}) does not fit {dt} (values would wrap)")
    return Tensor(engine(generator, dev, "randint").integers(low, high, size=tuple(size)).astype(dt.np))


def randperm(n: int, *, generator=None, dtype=None, device=None) -> Tensor:
    """A random permutation of range(n), drawn on the device from frost's generator."""
    if n < 0:
        raise RuntimeError(f"randperm: n must be non-negative, got {n}")
    dev, dt = _resolve(device, dtype, to_dtype("int64"))
    g = engine(generator, dev, "randperm")
    if hasattr(g, "permutation"):
        return Tensor(g.permutation(n).astype(dt.np, copy=False))
    return Tensor(g.random(n).argsort().astype(dt.np))  # a generator without permutation(): sort uniform draws


def randn_like(t: Tensor, dtype=None, requires_grad: bool = False) -> Tensor:
    return randn(t.shape, dtype=dtype or t.dtype, device=t.device, requires_grad=requires_grad)


def rand_like(t: Tensor, dtype=None, requires_grad: bool = False) -> Tensor:
    return rand(t.shape, dtype=dtype or t.dtype, device=t.device, requires_grad=requires_grad)


def uniform_(self: Tensor, a: float = 0.0, b: float = 1.0, *, generator=None) -> Tensor:
    """self filled in place with draws from U(a, b) (Tensor.uniform_, as nn.init uses it)."""
    _floating("uniform_", self.dtype)  # floats drawn into integers would be truncated
    self._inplace_check("uniform_")
    draws = _random_uniform(self.shape, a, b, self.device, np.float32, generator, "uniform_")
    self.data[...] = draws.astype(self.data.dtype)
    return self


def normal_(self: Tensor, mean: float = 0.0, std: float = 1.0, *, generator=None) -> Tensor:
    """self filled in place with draws from N(mean, std**2) (Tensor.normal_)."""
    _floating("normal_", self.dtype)
    self._inplace_check("normal_")
    draws = _random_normal(self.shape, self.device, np.float32, generator, "normal_")
    self.data[...] = (draws * std + mean).astype(self.data.dtype)
    return self
