"""Tensor's methods that are ops (x + y, x.sum(), x.view(...), x.to(...)): each forwards to its op in frost/ops.

Why they live apart from frost/tensor.py: the ops build Tensors, so they import frost.tensor; were Tensor's class
body to call them, frost.tensor would import the ops too, a circle. This module sits above both and adds these
methods to Tensor when frost is imported (frost/__init__.py imports it right after frost.tensor), so `import
frost` gives the whole Tensor, and the core's import graph stays a tree (tests/test_layers.py).
"""
from __future__ import annotations

import operator

from frost import autograd, dlpack, numpy_interop
from frost.backend import Device
from frost.dtype import to_dtype
from frost.ops import draws, elementwise, matmul, reduce, sampling, scan, spectral
from frost.ops import index as index_ops  # the scatter and index family
from frost.ops import math as math_ops  # aliased: `math` is Python's
from frost.ops import shape as shape_ops  # aliased: `shape` is a Tensor property
from frost.tensor import Tensor, _shape_args, share_version


class TensorMethods:
    """The methods install() adds to Tensor; never instantiated."""

    @property
    def T(self) -> "Tensor":
        return shape_ops.permute(self, tuple(range(self.ndim - 1, -1, -1)))

    @property
    def mT(self) -> "Tensor":
        return shape_ops.transpose(self, -2, -1)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        return dlpack.to_dlpack(self, stream, max_version, dl_device, copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        return dlpack.dlpack_device(self)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """np.exp(t), np.add(t, 1), ndarray + t: Frost's op where it has one (see frost.numpy_interop)."""
        return numpy_interop.array_ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        """np.sum(t), np.concatenate([t, u]), ...: Frost's op where it has one (see frost.numpy_interop)."""
        return numpy_interop.array_function(func, types, args, kwargs)

    def to(self, *args, dtype=None, device=None, non_blocking: bool = False, memory_format=None) -> "Tensor":
        """This tensor on `device`, as `dtype`, in `memory_format` (frost.channels_last for 4-D tensors)."""
        for a in args:
            if isinstance(a, Tensor):  # x.to(other): other's dtype and device, as PyTorch
                dtype, device = a.dtype, a.device
            elif isinstance(a, (Device,)) or (isinstance(a, str) and a.split(":")[0] in ("cpu", "cuda")):
                device = a
            else:
                dtype = a
        out = self
        if device is not None:
            out = elementwise.to_device(out, Device(device))
        if dtype is not None:
            out = elementwise.cast(out, to_dtype(dtype))
        if memory_format is not None:
            out = shape_ops.contiguous(out, memory_format)
        return out

    def add_(self, other, alpha=1) -> "Tensor":
        return self._update("add_", operator.iadd, elementwise.add, other, alpha)

    def sub_(self, other, alpha=1) -> "Tensor":
        return self._update("sub_", operator.isub, elementwise.sub, other, alpha)

    def mul_(self, other) -> "Tensor":
        return self._update("mul_", operator.imul, elementwise.mul, other)

    def div_(self, other) -> "Tensor":
        return self._update("div_", operator.itruediv, elementwise.div, other)

    def clamp_(self, min=None, max=None) -> "Tensor":
        return self._assign_result("clamp_", lambda x, lo, hi: elementwise.clamp(x, lo, hi), min, max)

    def uniform_(self, a: float = 0.0, b: float = 1.0, *, generator=None) -> "Tensor":
        return draws.uniform_(self, a, b, generator=generator)

    def normal_(self, mean: float = 0.0, std: float = 1.0, *, generator=None) -> "Tensor":
        return draws.normal_(self, mean, std, generator=generator)

    def exponential_(self, lambd=1.0, *, generator=None): return sampling.exponential_(self, lambd, generator=generator)
    def bernoulli_(self, p=0.5, *, generator=None): return sampling.bernoulli_(self, p, generator=generator)
    def cauchy_(self, median=0.0, sigma=1.0, *, generator=None):
        return sampling.cauchy_(self, median, sigma, generator=generator)
    def log_normal_(self, mean=1.0, std=2.0, *, generator=None):
        return sampling.log_normal_(self, mean, std, generator=generator)
    def geometric_(self, p, *, generator=None): return sampling.geometric_(self, p, generator=generator)
    def bernoulli(self, p=None, *, generator=None): return sampling.bernoulli(self, p, generator=generator)
    def multinomial(self, num_samples, replacement=False, *, generator=None):
        return sampling.multinomial(self, num_samples, replacement, generator=generator)
    def stft(self, n_fft, *args, **kwargs): return spectral.stft(self, n_fft, *args, **kwargs)
    def istft(self, n_fft, *args, **kwargs): return spectral.istft(self, n_fft, *args, **kwargs)

    # ------------------------------------------------------------ arithmetic
    def __add__(self, o): return elementwise.add(self, o)
    def __radd__(self, o): return elementwise.add(o, self)
    def __sub__(self, o): return elementwise.sub(self, o)
    def __rsub__(self, o): return elementwise.sub(o, self)
    def __mul__(self, o): return elementwise.mul(self, o)
    def __rmul__(self, o): return elementwise.mul(o, self)
    def __truediv__(self, o): return elementwise.div(self, o)
    def __rtruediv__(self, o): return elementwise.div(o, self)
    def __pow__(self, o): return elementwise.pow(self, o)
    def __rpow__(self, o): return elementwise.pow(o, self)
    def __neg__(self): return elementwise.neg(self)
    def __abs__(self): return elementwise.abs(self)
    def __matmul__(self, o): return matmul.matmul(self, o)
    def __rmatmul__(self, o): return matmul.matmul(o, self)
    def __floordiv__(self, o): return elementwise.floor_divide(self, o)
    def __rfloordiv__(self, o): return elementwise.floor_divide(o, self)
    def __mod__(self, o): return elementwise.remainder(self, o)
    def __rmod__(self, o): return elementwise.remainder(o, self)
    def __eq__(self, o): return elementwise.eq(self, o)  # type: ignore[override]
    def __ne__(self, o): return elementwise.ne(self, o)  # type: ignore[override]
    def __lt__(self, o): return elementwise.lt(self, o)
    def __le__(self, o): return elementwise.le(self, o)
    def __gt__(self, o): return elementwise.gt(self, o)
    def __ge__(self, o): return elementwise.ge(self, o)
    def __invert__(self): return elementwise.bitwise_not(self)
    def __and__(self, o): return elementwise.bitwise_and(self, o)
    def __rand__(self, o): return elementwise.bitwise_and(o, self)
    def __or__(self, o): return elementwise.bitwise_or(self, o)
    def __ror__(self, o): return elementwise.bitwise_or(o, self)
    def __xor__(self, o): return elementwise.bitwise_xor(self, o)
    def __rxor__(self, o): return elementwise.bitwise_xor(o, self)

    def __iadd__(self, o): return self._augmented("+=", elementwise.add, o, operator.iadd)
    def __isub__(self, o): return self._augmented("-=", elementwise.sub, o, operator.isub)
    def __imul__(self, o): return self._augmented("*=", elementwise.mul, o, operator.imul)
    def __itruediv__(self, o): return self._augmented("/=", elementwise.div, o, operator.itruediv)
    def __ifloordiv__(self, o): return self._augmented("//=", elementwise.floor_divide, o)
    def __imod__(self, o): return self._augmented("%=", elementwise.remainder, o)
    def __ipow__(self, o): return self._augmented("**=", elementwise.pow, o)
    def __iand__(self, o): return self._augmented("&=", elementwise.bitwise_and, o)
    def __ior__(self, o): return self._augmented("|=", elementwise.bitwise_or, o)
    def __ixor__(self, o): return self._augmented("^=", elementwise.bitwise_xor, o)

    # ------------------------------------------------------------ methods that forward to ops
    def exp(self): return elementwise.exp(self)
    def log(self): return elementwise.log(self)
    def sqrt(self): return elementwise.sqrt(self)
    def rsqrt(self): return elementwise.rsqrt(self)
    def tanh(self): return elementwise.tanh(self)
    def sigmoid(self): return elementwise.sigmoid(self)
    def relu(self): return elementwise.relu(self)
    def abs(self): return elementwise.abs(self)
    def sin(self): return elementwise.sin(self)
    def cos(self): return elementwise.cos(self)
    def square(self): return elementwise.mul(self, self)
    def sign(self): return elementwise.sign(self)
    def sgn(self): return elementwise.sgn(self)
    def pow(self, e): return elementwise.pow(self, e)
    def clamp(self, min=None, max=None): return elementwise.clamp(self, min, max)
    clip = clamp
    def maximum(self, o): return elementwise.maximum(self, o)
    def minimum(self, o): return elementwise.minimum(self, o)
    def logical_not(self): return elementwise.logical_not(self)
    def isnan(self): return elementwise.isnan(self)
    def isfinite(self): return elementwise.isfinite(self)
    def masked_fill(self, mask, value): return elementwise.masked_fill(self, mask, value)

    # **aliases: NumPy's axis= and keepdims=, which PyTorch's reductions accept too
    def sum(self, dim=None, keepdim=False, dtype=None, **aliases):
        return reduce.sum(self, dim, keepdim, dtype=dtype, **aliases)

    def prod(self, dim=None, keepdim=False, dtype=None, **aliases):
        return reduce.prod(self, dim, keepdim, dtype=dtype, **aliases)

    def mean(self, dim=None, keepdim=False, **aliases): return reduce.mean(self, dim, keepdim, **aliases)
    def max(self, dim=None, keepdim=False, **aliases): return reduce.max(self, dim, keepdim, **aliases)
    def min(self, dim=None, keepdim=False, **aliases): return reduce.min(self, dim, keepdim, **aliases)
    def amax(self, dim=None, keepdim=False, **aliases): return reduce.amax(self, dim, keepdim, **aliases)
    def amin(self, dim=None, keepdim=False, **aliases): return reduce.amin(self, dim, keepdim, **aliases)
    def argmax(self, dim=None, keepdim=False, **aliases): return reduce.argmax(self, dim, keepdim, **aliases)
    def argmin(self, dim=None, keepdim=False, **aliases): return reduce.argmin(self, dim, keepdim, **aliases)
    def var(self, dim=None, keepdim=False, unbiased=True, correction=None, **aliases):
        return reduce.var(self, dim, keepdim, unbiased=unbiased, correction=correction, **aliases)
    def std(self, dim=None, keepdim=False, unbiased=True, correction=None, **aliases):
        return reduce.std(self, dim, keepdim, unbiased=unbiased, correction=correction, **aliases)
    def logsumexp(self, *args, **kwargs):  # dim is required, as torch's, unless given as axis=
        return reduce.logsumexp(self, *args, **kwargs)
    def softmax(self, dim): return reduce.softmax(self, dim)
    def log_softmax(self, dim): return reduce.log_softmax(self, dim)
    def norm(self, p=2, dim=None, keepdim=False, **aliases): return reduce.norm(self, p, dim, keepdim, **aliases)
    def all(self, dim=None, keepdim=False, **aliases): return reduce.all(self, dim, keepdim, **aliases)
    def any(self, dim=None, keepdim=False, **aliases): return reduce.any(self, dim, keepdim, **aliases)

    def reshape(self, *shape_): return shape_ops.reshape(self, _shape_args(shape_))
    def view(self, *shape_):
        if len(shape_) == 1 and not isinstance(shape_[0], (tuple, list, int)):
            dt = to_dtype(shape_[0])  # view(dtype): the same bytes read as another type of the same size
            if dt.itemsize != self.dtype.itemsize:
                raise RuntimeError(f"view: cannot view {self.dtype!r} (itemsize {self.dtype.itemsize}) as {dt!r} "
                                   f"(itemsize {dt.itemsize}); only same-size dtypes, tensor of shape {self.shape}")
            return share_version(Tensor(self.data.view(dt.np)), (self,))
        return shape_ops.view(self, _shape_args(shape_))
    def view_as(self, other): return shape_ops.view(self, other.shape)
    def reshape_as(self, other): return shape_ops.reshape(self, other.shape)
    def permute(self, *dims): return shape_ops.permute(self, _shape_args(dims))
    def transpose(self, d0, d1): return shape_ops.transpose(self, d0, d1)
    def t(self):
        if self.ndim > 2:
            raise RuntimeError(f"t: expects a tensor with at most 2 dimensions, got shape {self.shape}; use "
                               f".transpose(d0, d1) or .mT")
        return shape_ops.transpose(self, 0, 1) if self.ndim == 2 else self

    def flatten(self, start_dim=0, end_dim=-1): return shape_ops.flatten(self, start_dim, end_dim)
    def squeeze(self, dim=None): return shape_ops.squeeze(self, dim)
    def unsqueeze(self, dim): return shape_ops.unsqueeze(self, dim)
    def expand(self, *sizes): return shape_ops.expand(self, _shape_args(sizes))
    def expand_as(self, other): return shape_ops.expand(self, other.shape)
    def contiguous(self, memory_format=None) -> "Tensor":
        """Dense in memory: C order, or channels-last with memory_format=frost.channels_last (4-D)."""
        return shape_ops.contiguous(self, memory_format)

    def split(self, split_size, dim=0): return shape_ops.split(self, split_size, dim)
    def chunk(self, chunks, dim=0): return shape_ops.chunk(self, chunks, dim)
    def repeat(self, *sizes): return shape_ops.repeat(self, _shape_args(sizes))
    def flip(self, dims): return shape_ops.flip(self, dims)
    def __getitem__(self, index): return shape_ops.getitem(self, index)
    def clone(self): return shape_ops.clone(self)
    def tril(self, diagonal=0): return shape_ops.tril(self, diagonal)
    def triu(self, diagonal=0): return shape_ops.triu(self, diagonal)
    def index_select(self, dim, index): return shape_ops.index_select(self, dim, index)
    def narrow(self, dim, start, length): return shape_ops.narrow(self, dim, start, length)
    def unbind(self, dim=0): return shape_ops.unbind(self, dim)
    def gather(self, dim, index): return shape_ops.gather(self, dim, index)
    def scatter(self, dim, index, src=None, value=None, reduce=None):
        return index_ops.scatter(self, dim, index, src, value=value, reduce=reduce)
    def scatter_add(self, dim, index, src): return index_ops.scatter_add(self, dim, index, src)
    def scatter_reduce(self, dim, index, src, reduce, include_self=True):
        return index_ops.scatter_reduce(self, dim, index, src, reduce, include_self=include_self)
    def index_add(self, dim, index, source, alpha=1): return index_ops.index_add(self, dim, index, source, alpha=alpha)
    def index_copy(self, dim, index, source): return index_ops.index_copy(self, dim, index, source)
    def index_fill(self, dim, index, value): return index_ops.index_fill(self, dim, index, value)
    def index_put(self, indices, values, accumulate=False):
        return index_ops.index_put(self, indices, values, accumulate)
    def masked_select(self, mask): return index_ops.masked_select(self, mask)
    def masked_scatter(self, mask, source): return index_ops.masked_scatter(self, mask, source)
    # in place: not recorded on the tape (see _assign_result)
    def scatter_(self, dim, index, src=None, value=None, reduce=None):
        return index_ops.in_place(self, "scatter_", index_ops.scatter, dim, index, src, value=value, reduce=reduce)
    def scatter_add_(self, dim, index, src):
        return index_ops.in_place(self, "scatter_add_", index_ops.scatter_add, dim, index, src)
    def scatter_reduce_(self, dim, index, src, reduce, include_self=True):
        return index_ops.in_place(self, "scatter_reduce_", index_ops.scatter_reduce, dim, index, src, reduce,
                                  include_self=include_self)
    def index_add_(self, dim, index, source, alpha=1):
        return index_ops.in_place(self, "index_add_", index_ops.index_add, dim, index, source, alpha=alpha)
    def index_copy_(self, dim, index, source):
        return index_ops.in_place(self, "index_copy_", index_ops.index_copy, dim, index, source)
    def index_fill_(self, dim, index, value):
        return index_ops.in_place(self, "index_fill_", index_ops.index_fill, dim, index, value)
    def index_put_(self, indices, values, accumulate=False):
        return index_ops.in_place(self, "index_put_", index_ops.index_put, indices, values, accumulate)
    def masked_fill_(self, mask, value):
        return index_ops.in_place(self, "masked_fill_", elementwise.masked_fill, mask, value)
    def masked_scatter_(self, mask, source):
        return index_ops.in_place(self, "masked_scatter_", index_ops.masked_scatter, mask, source)
    def cumsum(self, dim): return reduce.cumsum(self, dim)
    def cumprod(self, dim, dtype=None): return scan.cumprod(self, dim, dtype)
    def cummax(self, dim): return scan.cummax(self, dim)
    def cummin(self, dim): return scan.cummin(self, dim)
    def logcumsumexp(self, dim): return scan.logcumsumexp(self, dim)
    def sort(self, dim=-1, descending=False): return reduce.sort(self, dim, descending)
    def argsort(self, dim=-1, descending=False): return reduce.argsort(self, dim, descending)
    def topk(self, k, dim=-1, largest=True, sorted=True): return reduce.topk(self, k, dim, largest, sorted)

    # method forms of the operators, as PyTorch has them
    def add(self, o, alpha=1): return elementwise.add(self, o if alpha == 1 else o * alpha)
    def sub(self, o, alpha=1): return elementwise.sub(self, o if alpha == 1 else o * alpha)
    def mul(self, o): return elementwise.mul(self, o)
    def div(self, o, rounding_mode=None): return elementwise.div(self, o, rounding_mode)
    def copysign(self, o): return elementwise.copysign(self, o)
    def isclose(self, o, rtol=1e-5, atol=1e-8, equal_nan=False):
        return elementwise.isclose(self, o, rtol, atol, equal_nan)

    def allclose(self, o, rtol=1e-5, atol=1e-8, equal_nan=False):
        return elementwise.allclose(self, o, rtol, atol, equal_nan)

    def neg(self): return elementwise.neg(self)
    def matmul(self, o): return matmul.matmul(self, o)
    def eq(self, o): return elementwise.eq(self, o)
    def ne(self, o): return elementwise.ne(self, o)
    def lt(self, o): return elementwise.lt(self, o)
    def le(self, o): return elementwise.le(self, o)
    def gt(self, o): return elementwise.gt(self, o)
    def ge(self, o): return elementwise.ge(self, o)
    def logical_and(self, o): return elementwise.logical_and(self, o)
    def logical_or(self, o): return elementwise.logical_or(self, o)
    def log1p(self): return elementwise.log1p(self)
    def expm1(self): return elementwise.expm1(self)
    def reciprocal(self): return elementwise.reciprocal(self)
    def erf(self): return elementwise.erf(self)
    def floor(self): return elementwise.floor(self)
    def ceil(self): return elementwise.ceil(self)
    def round(self): return elementwise.round(self)
    def gelu(self, approximate="none"): return elementwise.gelu(self, approximate)
    def silu(self): return elementwise.silu(self)
    def softplus(self, beta=1.0, threshold=20.0): return elementwise.softplus(self, beta, threshold)
    def leaky_relu(self, negative_slope=0.01): return elementwise.leaky_relu(self, negative_slope)
    def remainder(self, o): return elementwise.remainder(self, o)
    def fmod(self, o): return math_ops.fmod(self, o)
    def atan2(self, o): return math_ops.atan2(self, o)
    def hypot(self, o): return math_ops.hypot(self, o)
    def lerp(self, end, weight): return math_ops.lerp(self, end, weight)
    def logical_xor(self, o): return math_ops.logical_xor(self, o)
    def clamp_min(self, min): return math_ops.clamp_min(self, min)
    def clamp_max(self, max): return math_ops.clamp_max(self, max)
    def nan_to_num(self, nan=0.0, posinf=None, neginf=None): return math_ops.nan_to_num(self, nan, posinf, neginf)
    def log2(self): return math_ops.log2(self)
    def log10(self): return math_ops.log10(self)
    def tan(self): return math_ops.tan(self)
    def sinh(self): return math_ops.sinh(self)
    def cosh(self): return math_ops.cosh(self)
    def asin(self): return math_ops.asin(self)
    def acos(self): return math_ops.acos(self)
    def atan(self): return math_ops.atan(self)
    def asinh(self): return math_ops.asinh(self)
    def acosh(self): return math_ops.acosh(self)
    def atanh(self): return math_ops.atanh(self)
    def outer(self, vec2): return math_ops.outer(self, vec2)
    def bmm(self, mat2): return math_ops.bmm(self, mat2)
    def addmm(self, mat1, mat2, *, beta=1, alpha=1): return math_ops.addmm(self, mat1, mat2, beta=beta, alpha=alpha)
    def baddbmm(self, batch1, batch2, *, beta=1, alpha=1):
        return math_ops.baddbmm(self, batch1, batch2, beta=beta, alpha=alpha)
    def roll(self, shifts, dims=None): return math_ops.roll(self, shifts, dims)
    def diag(self, diagonal=0): return math_ops.diag(self, diagonal)
    def trace(self): return math_ops.trace(self)
    def diff(self, n=1, dim=-1, prepend=None, append=None): return math_ops.diff(self, n, dim, prepend, append)
    def count_nonzero(self, dim=None): return math_ops.count_nonzero(self, dim)
    def median(self, dim=None, keepdim=False): return math_ops.median(self, dim, keepdim)
    def quantile(self, q, dim=None, keepdim=False, interpolation="linear"):
        return math_ops.quantile(self, q, dim, keepdim, interpolation)

    def __setitem__(self, index, value) -> None:
        if self.requires_grad and autograd.is_grad_enabled():
            raise RuntimeError("__setitem__: in-place assignment into a tensor that requires grad is not "
                               "differentiable in frost; build the result with frost.where or cat instead")
        if isinstance(value, Tensor) and value.requires_grad and autograd.is_grad_enabled():
            raise RuntimeError("__setitem__: the assigned value requires grad, but assignment into a tensor is "
                               "not recorded on the tape (its gradient would be lost); build the result with "
                               "frost.where or cat instead, or assign value.detach()")
        index = shape_ops.raw_index(index)
        self._values_change()
        shape_ops.assign(self.data, index, value.data if isinstance(value, Tensor) else value)


def install(cls: type = Tensor) -> None:
    """Add TensorMethods' methods, properties and aliases to `cls` (Tensor), as if written in its class body."""
    for name, value in vars(TensorMethods).items():
        # __hash__: Python sets it to None in a class that defines __eq__; Tensor keeps its own (identity)
        if name not in ("__module__", "__qualname__", "__doc__", "__dict__", "__weakref__", "__firstlineno__",
                        "__static_attributes__", "__hash__"):
            setattr(cls, name, value)


install()
