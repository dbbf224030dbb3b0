"""The Tensor: an array (NumPy or CuPy), its gradient, and the tape node that made it; creation functions."""
from __future__ import annotations

import copy
import math
import operator
from typing import Callable, Sequence

import numpy as np

from frost import autograd
from frost import backend
from frost.backend import Device
from frost.dtype import DType, to_dtype, default_float_dtype, float32


# dtype name -> the tensor type name that Tensor.type() answers, as PyTorch's
_TENSOR_TYPE_NAMES = {"float32": "FloatTensor", "float64": "DoubleTensor", "float16": "HalfTensor",
                      "bfloat16": "BFloat16Tensor", "int8": "CharTensor", "int16": "ShortTensor",
                      "int32": "IntTensor", "int64": "LongTensor", "uint8": "ByteTensor", "bool": "BoolTensor"}


class Tensor:
    """An n-dimensional array with reverse-mode autograd."""

    __slots__ = ("data", "grad", "requires_grad", "_ctx", "_retains_grad", "_is_param", "__weakref__", "__dict__")
    __array_priority__ = 1000  # for array libraries that look at it; NumPy asks __array_ufunc__ (ndarray + t, ...)
    # in-place changes so far, counted in a one-element list shared by a tensor and its views (those made by an op
    # whose output array is a view of, or is, its input's memory, and detach()): a change through either is seen by a
    # backward that saved the other, as PyTorch's version counter; None until the first change or view
    _version_counter: list | None = None

    def __init__(self, data, requires_grad: bool = False) -> None:
        if isinstance(data, Tensor):
            data = data.data
        elif isinstance(data, np.generic):
            data = np.asarray(data)  # NumPy scalars (e.g. from a full reduction) become 0-d arrays
        elif not (hasattr(type(data), "__array_interface__") or type(data).__module__.startswith("cupy")
                  or hasattr(data, "__cuda_array_interface__")):  # NumPy's and CuPy's by type: the instance's
            data = np.asarray(data)  # attribute builds a dict (1 us); a CPU torch tensor's raises: it converts
        self.data = data
        self.grad: Tensor | None = None
        self._ctx: autograd.Node | None = None
        self._retains_grad = False
        self._is_param = False
        self.requires_grad = False
        if requires_grad:
            self.requires_grad_(True)

    # ------------------------------------------------------------ properties
    @property
    def shape(self) -> tuple:
        return tuple(self.data.shape)

    @property
    def dtype(self) -> DType:
        return to_dtype(self.data.dtype)

    @property
    def device(self) -> Device:
        return backend.device_of(self.data)

    @property
    def xp(self):
        return np if isinstance(self.data, np.ndarray) else backend.xp_for(self.device)

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def _version(self) -> int:
        counter = self._version_counter
        return 0 if counter is None else counter[0]

    @property
    def is_leaf(self) -> bool:
        return self._ctx is None

    @property
    def grad_fn(self):
        return self._ctx

    @property
    def T(self) -> "Tensor":
        return shape_ops.permute(self, tuple(range(self.ndim - 1, -1, -1)))

    @property
    def mT(self) -> "Tensor":
        return shape_ops.transpose(self, -2, -1)

    def dim(self) -> int:
        return self.data.ndim

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def numel(self) -> int:
        return int(self.data.size)

    def element_size(self) -> int:
        return self.data.dtype.itemsize

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        extra = ""
        if self.device.type != "cpu":
            extra += f", device='{self.device}'"
        if self.data.size == 0 and self.ndim != 1:
            extra += f", size={self.shape}"
        if self.dtype != default_float_dtype() and self.dtype.name not in ("int64", "bool"):
            extra += f", dtype={self.dtype!r}"
        if self._ctx is not None:
            extra += f", grad_fn=<{self._ctx.name}>"
        elif self.requires_grad:
            extra += ", requires_grad=True"
        return f"tensor({_format_array(self._host())}{extra})"

    def __format__(self, format_spec: str) -> str:
        # as PyTorch's: a 0-d tensor formats as its Python number (f"{loss:.4f}"), any other only with an empty spec
        return format(self.item(), format_spec) if self.ndim == 0 else object.__format__(self, format_spec)

    def __hash__(self) -> int:
        return id(self)

    def __bool__(self) -> bool:
        if self.data.size != 1:
            raise RuntimeError(f"bool value of a tensor with {self.data.size} elements is ambiguous")
        return bool(self.item())

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        if self.dtype.is_floating_point or self.data.size != 1:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return int(self.item())

    # ------------------------------------------------------------ autograd
    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        if requires_grad and not self.dtype.is_floating_point:
            raise RuntimeError(f"only floating-point tensors can require gradients, got {self.dtype!r}")
        if not requires_grad and self._ctx is not None:
            raise RuntimeError("requires_grad_(False) is only allowed on leaf tensors; use .detach()")
        self.requires_grad = requires_grad
        return self

    def retain_grad(self) -> None:
        if not self.requires_grad:
            raise RuntimeError(f"retain_grad: the tensor (shape {self.shape}) does not require grad, so it will "
                               f"get none; make it from tensors that require grad, or call requires_grad_()")
        self._retains_grad = True

    def register_hook(self, hook: Callable) -> "autograd.RemovableHandle":
        return autograd.register_hook(self, hook)

    def __deepcopy__(self, memo: dict) -> "Tensor":
        """Python's usual deep copy (a Parameter's rebuilds it), for leaves only: a tensor made by an op is refused,
        as PyTorch refuses it, since its copy would drag a copy of its whole graph along."""
        if self._ctx is not None:
            raise RuntimeError(f"deepcopy: only tensors created by the user (graph leaves) can be deep-copied, not "
                               f"one made by '{self._ctx.name}'; deep-copy x.detach() instead")
        return copy._reconstruct(self, memo, *self.__reduce_ex__(4))

    def backward(self, gradient=None, retain_graph: bool = False) -> None:
        autograd.backward(self, gradient, retain_graph)

    def detach(self) -> "Tensor":
        """The same data (shared, not copied, with its version counter), cut off from the tape."""
        return share_version(Tensor(self.data), (self,))

    def detach_(self) -> "Tensor":
        self._ctx, self.requires_grad = None, False
        return self

    # ------------------------------------------------------------ conversion
    def _check_host_sync(self, what: str) -> None:
        hook = _host_sync_hook
        if hook is not None and self.device.type == "cuda":
            hook(what)

    def item(self):
        if self.data.size != 1:
            raise RuntimeError(f"item(): a tensor with {self.data.size} elements cannot be converted "
                               f"to a Python scalar")
        self._check_host_sync("Tensor.item()")
        v = self.data.reshape(()).item() if hasattr(self.data, "item") else self.data
        if isinstance(v, np.bool_):
            return bool(v)
        if isinstance(v, np.integer):
            return int(v)
        if isinstance(v, np.generic) or type(v).__name__ == "bfloat16":
            return float(v)
        return v

    def numpy(self) -> np.ndarray:
        """The values as a NumPy array: this tensor's own memory on the CPU, a copy from a GPU. A tensor that
        requires grad is refused, as PyTorch refuses it (the array would silently leave the graph)."""
        if self.requires_grad:
            raise RuntimeError(numpy_interop.GRAD_MESSAGE)
        return self._host()

    def _host(self) -> np.ndarray:
        """The values as a NumPy array whether or not the tensor requires grad: for reading them (printing, tolist)."""
        if isinstance(self.data, np.ndarray):
            return self.data
        self._check_host_sync("Tensor.numpy()")
        return backend.to_device(self.data, backend.CPU)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        # np.asarray(tensor) works as with PyTorch, through numpy(): refused for a tensor that requires grad
        a = self.numpy()
        return a if dtype is None else a.astype(dtype, copy=False)

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

    def tolist(self):
        a = self._host()
        if a.dtype.kind not in "biuf":  # bfloat16: tolist() would give ml_dtypes scalars
            a = a.astype(np.float32)
        return a.tolist()

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

    def cuda(self, index: int = 0) -> "Tensor":
        return self.to(f"cuda:{index}")

    def cpu(self) -> "Tensor":
        return self.to("cpu")

    def pin_memory(self) -> "Tensor":
        """This tensor: frost's host-to-GPU copies stage through pinned buffers of their own (frost.data's loader),
        so a CPU tensor needs no pinning; a CUDA tensor is refused, as in PyTorch."""
        if self.device.type != "cpu":
            raise RuntimeError(f"pin_memory: only CPU tensors can be pinned, this one is on {self.device}")
        return self

    def is_pinned(self) -> bool:
        return False

    def type(self, dtype=None):
        """With no argument, the type's name ('frost.FloatTensor', as PyTorch's 'torch.FloatTensor'); with a dtype
        (or such a name), this tensor cast to it."""
        if dtype is None:
            prefix = "frost.cuda." if self.device.type == "cuda" else "frost."
            return prefix + _TENSOR_TYPE_NAMES[self.dtype.name]
        if isinstance(dtype, str) and dtype.endswith("Tensor"):
            by_type_name = {v: k for k, v in _TENSOR_TYPE_NAMES.items()}
            name = dtype.rsplit(".", 1)[-1]
            if name not in by_type_name:
                raise ValueError(f"type: unknown tensor type {dtype!r}; expected one of {sorted(by_type_name)}")
            return self.to(by_type_name[name], device="cuda" if ".cuda." in dtype else None)
        return self.to(dtype)

    def type_as(self, other: "Tensor") -> "Tensor":
        return self.to(other.dtype)

    def float(self) -> "Tensor":
        return self.to(float32)

    def double(self) -> "Tensor":
        return self.to("float64")

    def half(self) -> "Tensor":
        return self.to("float16")

    def bfloat16(self) -> "Tensor":
        return self.to("bfloat16")

    def long(self) -> "Tensor":
        return self.to("int64")

    def int(self) -> "Tensor":
        return self.to("int32")

    def bool(self) -> "Tensor":
        return self.to("bool")

    def is_floating_point(self) -> bool:
        return self.dtype.is_floating_point

    # ------------------------------------------------------------ in-place (no autograd; for optimizers/init)
    def _values_change(self) -> None:
        """Before an in-place change: count it (`_version`: a backward of an op that read the old values refuses to
        run) and forget what was known about the old values: a convolution's channel statistics of them, and that
        they were the zeros of a zero_grad() (frost.autograd.mark_grad_zero: backward() must add to new values)."""
        if self._version_counter is None:
            self._version_counter = [0]
        self._version_counter[0] += 1
        self.__dict__.pop("_channel_stats", None)
        self.__dict__.pop("_known_zero", None)

    def _inplace_check(self, what: str, *operands) -> None:
        if autograd.is_grad_enabled() and any(isinstance(o, Tensor) and o.requires_grad for o in operands):
            raise RuntimeError(f"{what}: an operand requires grad, and frost records no in-place op on the tape (its "
                               f"gradient would be lost); write the out-of-place op (x = x + y) or change x under "
                               f"`with frost.no_grad():`")
        if self.requires_grad and autograd.is_grad_enabled():
            if self._ctx is None:
                raise RuntimeError(f"{what}: a leaf tensor that requires grad is used in an in-place operation; "
                                   f"wrap it in `with frost.no_grad():`")
            raise RuntimeError(f"{what}: in-place operations on a tensor that is part of the autograd graph "
                               f"(made by '{self._ctx.name}') are not differentiable in frost; use the "
                               f"out-of-place op instead")
        self._values_change()  # only once the change will happen: a refused one leaves the values (and version)

    def _assign_result(self, what: str, op: Callable, *operands) -> "Tensor":
        """self = op(self, *operands) in place: the op's result (PyTorch's type promotion) must cast back to self's
        dtype within its kind (an int tensor takes no float result, as in PyTorch)."""
        with autograd.no_grad():
            result = op(self.detach(), *operands)
        if result.dtype != self.dtype and not np.can_cast(result.dtype.np, self.dtype.np, "same_kind"):
            raise RuntimeError(f"{what}: the result type {result.dtype} can't be cast to the tensor's type "
                               f"{self.dtype} (shape {self.shape}) in place; use the out-of-place op")
        if result.shape != self.shape and np.broadcast_shapes(result.shape, self.shape) != self.shape:
            raise RuntimeError(f"{what}: the result's shape {result.shape} does not fit the tensor's {self.shape} "
                               f"(in place, only the other operand broadcasts)")
        self._inplace_check(what, *operands)
        self.data[...] = result.data
        return self

    def copy_(self, src) -> "Tensor":
        self._inplace_check("copy_", src)
        src = src.data if isinstance(src, Tensor) else src
        if backend.device_of(src) != self.device if hasattr(src, "shape") else False:
            src = backend.to_device(src, self.device)
        self.data[...] = src
        return self

    def zero_(self) -> "Tensor":
        self._inplace_check("zero_")
        self.data[...] = 0
        return self

    def fill_(self, value) -> "Tensor":
        if isinstance(value, Tensor) and value.ndim:
            raise RuntimeError(f"fill_: the value must be a number or a 0-d tensor, got a tensor of shape "
                               f"{value.shape} (copy_ takes a tensor)")
        self._inplace_check("fill_", value)
        self.data[...] = value.data if isinstance(value, Tensor) else value
        return self

    def _direct(self, other) -> bool:
        """Whether `self op= other` may run as the array module's own in-place op: a floating self with a Python
        number, or with a tensor of its dtype and device that broadcasts into it. The out-of-place op would run
        that same array op (no promotion), so the result is equal, without its temporary (an EMA, a manual SGD)."""
        if not self.dtype.is_floating_point:
            return False
        if isinstance(other, Tensor):
            return other.data.dtype == self.data.dtype and type(other.data) is type(self.data) and \
                (other.shape == self.shape or np.broadcast_shapes(other.shape, self.shape) == self.shape)
        return type(other) in (int, float)

    def _update(self, what: str, in_place: Callable, op: Callable, other, alpha=1) -> "Tensor":
        """self = op(self, other * alpha) in place: the array module's own in-place op (`in_place`) where it gives
        the out-of-place op's result (_direct), else the out-of-place op's result written back (_assign_result)."""
        scaled = (lambda o: o) if alpha == 1 else (lambda o: o * alpha)
        if self._direct(other) and type(alpha) in (int, float):
            self._inplace_check(what, other)
            in_place(self.data, scaled(other.data if isinstance(other, Tensor) else other))
            return self
        return self._assign_result(what, lambda x, o: op(x, scaled(o)), other)

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
        _floating("uniform_", self.dtype)  # floats drawn into integers would be truncated
        self._inplace_check("uniform_")
        draws = _random_uniform(self.shape, a, b, self.device, np.float32, generator, "uniform_")
        self.data[...] = draws.astype(self.data.dtype)
        return self

    def normal_(self, mean: float = 0.0, std: float = 1.0, *, generator=None) -> "Tensor":
        _floating("normal_", self.dtype)
        self._inplace_check("normal_")
        draws = _random_normal(self.shape, self.device, np.float32, generator, "normal_")
        self.data[...] = (draws * std + mean).astype(self.data.dtype)
        return self

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
    def __pos__(self): return self
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

    def _inplace_records(self, o) -> bool:
        """True when `self op= o` must be recorded on the tape: Frost records no in-place op, so it is done out of
        place, rebinding the name (other references to the old tensor keep the old values; PyTorch's change them)."""
        if not autograd.is_grad_enabled():
            return False
        return (self.requires_grad and self._ctx is not None) or (isinstance(o, Tensor) and o.requires_grad)

    def _augmented(self, what: str, op: Callable, o, in_place: Callable | None = None) -> "Tensor":
        if self._inplace_records(o):
            return op(self, o)
        return self._update(what, in_place, op, o) if in_place else self._assign_result(what, op, o)

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

    def is_contiguous(self, memory_format=None) -> bool:
        from frost.layout import channels_last, is_channels_last
        if memory_format is channels_last:
            return is_channels_last(self.data) or (self.ndim == 4 and self.data.flags.c_contiguous and
                                                   (self.shape[1] == 1 or self.shape[2] * self.shape[3] == 1))
        return bool(self.data.flags.c_contiguous)
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

    # new tensors like this one (same dtype and device unless given)
    def new_zeros(self, *size, dtype=None): return zeros(*size, dtype=dtype or self.dtype, device=self.device)
    def new_ones(self, *size, dtype=None): return ones(*size, dtype=dtype or self.dtype, device=self.device)
    def new_full(self, size, fill_value, dtype=None):
        return full(size, fill_value, dtype=dtype or self.dtype, device=self.device)
    def new_tensor(self, data, dtype=None): return tensor(data, dtype=dtype or self.dtype, device=self.device)

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


# set by frost.jit while a CUDA graph is being captured: called with the name of a host-synchronizing call
_host_sync_hook: Callable[[str], None] | None = None


def set_host_sync_hook(hook: Callable[[str], None] | None) -> Callable[[str], None] | None:
    """Install the hook called before a CUDA tensor's value is read on the host; returns the previous one."""
    global _host_sync_hook
    previous, _host_sync_hook = _host_sync_hook, hook
    return previous


def capturing() -> bool:
    """True while frost.jit captures a CUDA graph (no host reads allowed)."""
    return _host_sync_hook is not None


def can_read_values(t: Tensor) -> bool:
    """Whether an op may read t's values on the host for a check: always on the CPU, on CUDA except during capture."""
    return t.device.type == "cpu" or not capturing()


autograd.register_tensor_type(Tensor)


# ---------------------------------------------------------------- printing, as PyTorch prints

_PRINT_THRESHOLD, _PRINT_EDGEITEMS, _PRINT_LINEWIDTH, _PRINT_PRECISION = 1000, 3, 80, 4


def _float_formatter(values: np.ndarray):
    """PyTorch's rule: integer-valued floats print as '3.', else 4 decimals, else scientific for wide ranges."""
    finite = values[np.isfinite(values) & (values != 0)]
    if finite.size == 0:
        return lambda v: f"{v:.0f}" + ("" if math.isinf(v) or math.isnan(v) else "."), 1
    mags = np.abs(finite.astype(np.float64))
    lo, hi = float(mags.min()), float(mags.max())
    int_mode = bool(np.all(finite == np.ceil(finite)))
    sci = hi / lo > 1000.0 or hi > 1.0e8 or (not int_mode and lo < 1.0e-4)
    if sci:
        fmt = lambda v: f"{v:.{_PRINT_PRECISION}e}"  # noqa: E731
        width = builtins_max(len(fmt(float(v))) for v in finite)
    elif int_mode:
        fmt = lambda v: f"{v:.0f}" + ("" if math.isinf(v) or math.isnan(v) else ".")  # noqa: E731
        width = builtins_max(len(f"{float(v):.0f}") + 1 for v in finite)
    else:
        fmt = lambda v: f"{v:.{_PRINT_PRECISION}f}"  # noqa: E731
        width = builtins_max(len(fmt(float(v))) for v in finite)
    return fmt, width


def _summarized(a: np.ndarray) -> np.ndarray:
    """The first and last few items along every long axis."""
    for axis, n in enumerate(a.shape):
        if n > 2 * _PRINT_EDGEITEMS:
            keep = list(range(_PRINT_EDGEITEMS)) + list(range(n - _PRINT_EDGEITEMS, n))
            a = np.take(a, keep, axis=axis)
    return a


def _format_array(a: np.ndarray) -> str:
    """The body of a tensor's repr: nested brackets, aligned columns, '...' past 1000 elements."""
    if a.dtype.kind not in "biuf":
        a = a.astype(np.float32)  # bfloat16 prints through float32
    summarize = a.size > _PRINT_THRESHOLD
    shown = _summarized(a) if summarize else a  # the formatter sees only what is printed, as in PyTorch
    if a.dtype.kind == "f":
        fmt, width = _float_formatter(shown)
        to_py = float
    else:
        fmt, to_py = str, (bool if a.dtype.kind == "b" else int)
        width = builtins_max((len(str(to_py(v))) for v in shown.reshape(-1)), default=1)

    def cell(v) -> str:
        return fmt(to_py(v)).rjust(width)

    def vector(v, indent: int) -> str:
        per_line = builtins_max(1, (_PRINT_LINEWIDTH - indent) // (width + 2))
        if summarize and len(v) > 2 * _PRINT_EDGEITEMS:
            cells = [cell(x) for x in v[:_PRINT_EDGEITEMS]] + [" ..."] + [cell(x) for x in v[-_PRINT_EDGEITEMS:]]
        else:
            cells = [cell(x) for x in v]
        lines = [", ".join(cells[i:i + per_line]) for i in range(0, len(cells), per_line)]
        return "[" + (",\n" + " " * (indent + 1)).join(lines) + "]"

    def block(b, indent: int) -> str:
        if b.ndim == 0:
            return cell(b[()]).strip()
        if b.ndim == 1:
            return vector(b, indent)
        if summarize and len(b) > 2 * _PRINT_EDGEITEMS:
            parts = [block(b[i], indent + 1) for i in range(_PRINT_EDGEITEMS)] + ["..."] + \
                    [block(b[i], indent + 1) for i in range(len(b) - _PRINT_EDGEITEMS, len(b))]
        else:
            parts = [block(b[i], indent + 1) for i in range(len(b))]
        return "[" + ("," + "\n" * (b.ndim - 1) + " " * (indent + 1)).join(parts) + "]"

    if a.size == 0:
        return "[]"
    return block(a, len("tensor("))


builtins_max = max  # `max` stays the builtin here; named so a reader sees it is not frost.max


def _shape_args(args) -> tuple:
    sizes = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list)) else args
    try:
        return tuple(operator.index(a) for a in sizes)
    except TypeError:
        raise TypeError(f"sizes must be integers, got {tuple(sizes)}") from None


def from_op(out, parents: Sequence[Tensor], backward: Callable, name: str) -> Tensor:
    """Wrap an op's output array; record `backward` (grad_out -> grads of parents) when gradients are needed.

    Every differentiable op ends with this call: forward math, then its backward closure, side by side.
    """
    t = share_version(Tensor(out), parents)
    if autograd.is_anomaly_enabled():
        autograd.check_forward(name, t.data, parents)  # t.data: a NumPy scalar result is an array there
    if autograd.is_grad_enabled() and any(p.requires_grad for p in parents):
        t.requires_grad = True
        t._ctx = autograd.Node(tuple(parents), backward, name)
    return t


def share_version(view: Tensor, sources: Sequence[Tensor]) -> Tensor:
    """`view` with the version counter of the first source whose memory its array is, or views: NumPy's and CuPy's
    views point to the array that owns their memory (`base`)."""
    data = view.data
    owner = getattr(data, "base", None)
    if owner is None:
        owner = data
    for source in sources:
        if source.data is owner or getattr(source.data, "base", None) is owner:
            if source._version_counter is None:
                source._version_counter = [0]
            view._version_counter = source._version_counter
            break
    return view


# ---------------------------------------------------------------- creation


def _resolve(device, dtype, default=None):
    dev = Device(device) if device is not None else backend.CPU
    dt = to_dtype(dtype) if dtype is not None else default
    return dev, dt


def tensor(data, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """Make a tensor from data (nested lists, scalars, NumPy or CuPy arrays, tensors). Copies."""
    if isinstance(data, Tensor):
        arr = data.data.copy()
        src_dev = data.device
    elif hasattr(data, "__cuda_array_interface__"):
        arr = data.copy()
        src_dev = backend.device_of(arr)
    else:
        arr = _list_to_array(data, default_types=dtype is None)
        src_dev = backend.CPU
    dev = Device(device) if device is not None else src_dev
    if dtype is not None:
        arr = arr.astype(to_dtype(dtype).np, copy=False)
    arr = backend.to_device(arr, dev)
    return Tensor(arr, requires_grad=requires_grad)


def _list_to_array(data, default_types: bool = True) -> np.ndarray:
    """data as a NumPy array of the dtype PyTorch infers when default_types: its leaves' dtypes promoted, where a
    Python float counts as float32, an int as int64 and a bool as bool, and a NumPy scalar or array or a tensor as
    its own dtype. Without default_types the values are read at full precision (the caller casts to its dtype)."""
    leaf_dtypes: set = set()

    def walk(x):
        if isinstance(x, (list, tuple)):
            return [walk(y) for y in x]
        if isinstance(x, Tensor):
            x = x._host()  # values only, as torch.tensor() copies a tensor that requires grad
        leaf_dtypes.add(x.dtype if isinstance(x, (np.ndarray, np.generic)) else
                        np.dtype(bool) if isinstance(x, bool) else np.dtype(np.int64) if isinstance(x, int) else
                        default_float_dtype().np if isinstance(x, float) else None)
        return x

    typed = isinstance(data, (np.ndarray, np.generic))  # NumPy data keeps its dtype, as in PyTorch
    data = data if typed else walk(data)
    try:
        arr = np.array(data)
    except ValueError as e:
        raise ValueError(f"tensor(): nested sequences must be rectangular (same length at each level): {e}") from None
    if arr.dtype.kind not in "biuf" and arr.dtype.name != "bfloat16":
        raise TypeError(f"tensor(): cannot make a tensor from data of dtype {arr.dtype}")
    inferred = _inferred_dtype(leaf_dtypes) if default_types and not typed else None
    return arr.astype(inferred) if inferred is not None and arr.dtype != inferred else arr


def _inferred_dtype(dtypes: set):
    """PyTorch's promotion of leaf dtypes by category: floating over integer over bool, the widest within one
    (float16 with bfloat16 gives float32, uint8 with int8 int16); None when a leaf had no dtype of its own."""
    if None in dtypes:
        return None
    if not dtypes:
        return default_float_dtype().np  # an empty list, as PyTorch's
    floats = sorted((d for d in dtypes if d.kind == "f" or d.name == "bfloat16"), key=lambda d: d.itemsize)
    if floats:
        widest = floats[-1]
        if len(floats) > 1 and floats[-2].itemsize == widest.itemsize and floats[-2] != widest:
            return np.dtype(np.float32)  # float16 and bfloat16: neither holds the other
        return widest
    ints = [d for d in dtypes if d.kind in "iu"]
    return np.result_type(*ints) if ints else np.dtype(bool)


def from_numpy(array: np.ndarray) -> Tensor:
    """A tensor sharing memory with a NumPy array."""
    return Tensor(array)


def _full(shape, value, dtype, device) -> Tensor:
    dev, dt = _resolve(device, dtype, default_float_dtype())
    xp = backend.xp_for(dev)
    if dev.type == "cuda":
        with xp.cuda.Device(dev.index):
            return Tensor(xp.full(shape, value, dtype=dt.np))
    return Tensor(xp.full(shape, value, dtype=dt.np))


def zeros(*shape, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    return _full(_shape_args(shape), 0, dtype, device).requires_grad_(requires_grad)


def ones(*shape, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    return _full(_shape_args(shape), 1, dtype, device).requires_grad_(requires_grad)


def empty(*shape, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    return zeros(*shape, dtype=dtype, device=device, requires_grad=requires_grad)


def full(shape, fill_value, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    if dtype is None and isinstance(fill_value, bool):
        dtype = "bool"
    elif dtype is None and isinstance(fill_value, int):
        dtype = "int64"
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return _full(shape, fill_value, dtype, device).requires_grad_(requires_grad)


def _like(t: Tensor, dtype, device):
    return (dtype if dtype is not None else t.dtype), (device if device is not None else t.device)


def zeros_like(t: Tensor, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    dt, dev = _like(t, dtype, device)
    return zeros(t.shape, dtype=dt, device=dev, requires_grad=requires_grad)


def ones_like(t: Tensor, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    dt, dev = _like(t, dtype, device)
    return ones(t.shape, dtype=dt, device=dev, requires_grad=requires_grad)


def empty_like(t: Tensor, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    return zeros_like(t, dtype, device, requires_grad=requires_grad)


def full_like(t: Tensor, fill_value, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    dt, dev = _like(t, dtype, device)
    return full(t.shape, fill_value, dtype=dt, device=dev, requires_grad=requires_grad)


def arange(start, end=None, step=1, dtype=None, device=None) -> Tensor:
    if end is None:
        start, end = 0, start
    is_float = any(isinstance(v, float) for v in (start, end, step))
    dev, dt = _resolve(device, dtype, default_float_dtype() if is_float else to_dtype("int64"))
    if not dt.is_floating_point:  # an integer range steps in integers, as PyTorch's (1.5 steps by 1)
        start, end, step = int(start), int(end), int(step)
    if step == 0:
        raise RuntimeError(f"arange: step must be nonzero (start {start}, end {end})")
    if (end - start) * step < 0:
        raise RuntimeError(f"arange: the step {step} cannot go from start {start} to end {end}: its sign must be "
                           f"that of end - start")
    xp = backend.xp_for(dev)
    return Tensor(backend.to_device(np.arange(start, end, step).astype(dt.np), dev)) if xp is np else \
        Tensor(xp.arange(start, end, step, dtype=dt.np))


def linspace(start: float, end: float, steps: int, dtype=None, device=None) -> Tensor:
    dev, dt = _resolve(device, dtype, default_float_dtype())
    return Tensor(backend.to_device(np.linspace(start, end, steps).astype(dt.np), dev))


def eye(n: int, m: int | None = None, dtype=None, device=None) -> Tensor:
    dev, dt = _resolve(device, dtype, default_float_dtype())
    return Tensor(backend.to_device(np.eye(n, m, dtype=dt.np), dev))


# ---------------------------------------------------------------- random


def manual_seed(seed: int) -> None:
    """Seed Frost's random generators (CPU and, when used, CUDA)."""
    from frost.backend import cpu, cuda
    cpu.manual_seed(seed)
    cuda.manual_seed(seed)


def _generator(device: Device, generator=None, who: str = "random"):
    if generator is not None:  # a frost.Generator of the caller's
        return sampling.engine(generator, device, who)
    from frost.backend import cpu, cuda
    return cpu.generator() if device.type == "cpu" else cuda.generator()


def _draw_dtype(dt: DType):
    # draw float64 directly when asked for it; every other float type is drawn in float32 and cast
    return np.float64 if dt.name == "float64" else np.float32


def _random_normal(shape, device: Device, dtype=np.float32, generator=None, who: str = "randn"):
    return _generator(device, generator, who).standard_normal(shape, dtype=dtype)


def _random_uniform(shape, low, high, device: Device, dtype=np.float32, generator=None, who: str = "rand"):
    return _generator(device, generator, who).random(shape, dtype=dtype) * (high - low) + low


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
    return Tensor(_generator(dev, generator, "randint").integers(low, high, size=tuple(size)).astype(dt.np))


def randperm(n: int, *, generator=None, dtype=None, device=None) -> Tensor:
    """A random permutation of range(n), drawn on the device from frost's generator."""
    if n < 0:
        raise RuntimeError(f"randperm: n must be non-negative, got {n}")
    dev, dt = _resolve(device, dtype, to_dtype("int64"))
    g = _generator(dev, generator, "randperm")
    if hasattr(g, "permutation"):
        return Tensor(g.permutation(n).astype(dt.np, copy=False))
    return Tensor(g.random(n).argsort().astype(dt.np))  # a generator without permutation(): sort uniform draws


def randn_like(t: Tensor, dtype=None, requires_grad: bool = False) -> Tensor:
    return randn(t.shape, dtype=dtype or t.dtype, device=t.device, requires_grad=requires_grad)


def rand_like(t: Tensor, dtype=None, requires_grad: bool = False) -> Tensor:
    return rand(t.shape, dtype=dtype or t.dtype, device=t.device, requires_grad=requires_grad)


from frost.ops import elementwise, matmul, reduce, scan, shape as shape_ops  # noqa: E402  (the ops need Tensor defined first)
from frost import numpy_interop  # noqa: E402  (it maps NumPy's functions to those ops)
from frost import dlpack  # noqa: E402  (Tensor.__dlpack__)
from frost.ops import math as math_ops  # noqa: E402  (aliased: `math` here is Python's)
from frost.ops import index as index_ops  # noqa: E402  (the scatter and index family)
from frost.ops import sampling, spectral  # noqa: E402  (random draws with a frost.Generator; stft)
