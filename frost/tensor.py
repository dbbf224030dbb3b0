"""The Tensor: an array (NumPy or CuPy), its gradient, and the tape node that made it; creation functions."""
from __future__ import annotations

import copy
import math
import operator
from typing import Callable, Sequence

import numpy as np

from frost import autograd
from frost import backend
from frost.backend import Device, cpu, cuda
from frost.dtype import DType, to_dtype, default_float_dtype, float32
from frost.layout import channels_last, is_channels_last


# dtype name -> the tensor type name that Tensor.type() answers, as PyTorch's
_TENSOR_TYPE_NAMES = {"float32": "FloatTensor", "float64": "DoubleTensor", "float16": "HalfTensor",
                      "bfloat16": "BFloat16Tensor", "int8": "CharTensor", "int16": "ShortTensor",
                      "int32": "IntTensor", "int64": "LongTensor", "uint8": "ByteTensor", "bool": "BoolTensor"}


# numpy() of a tensor that requires grad, and NumPy functions given one (frost.numpy_interop): PyTorch's words
GRAD_MESSAGE = "Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead."


class Tensor:
    """An n-dimensional array with reverse-mode autograd. Its methods that are ops (x + y, x.sum(), x.view(...),
    x.to(...)) are in frost/tensor_methods.py, which adds them to this class when frost is imported."""

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

    def backward(self, gradient=None, retain_graph: bool | None = None, create_graph: bool = False) -> None:
        """Accumulate this tensor's gradient into the leaves' .grad; create_graph=True: gradients with a graph of their
        own (higher-order gradients; see frost.autograd.backward)."""
        autograd.backward(self, gradient, retain_graph, create_graph)

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
            raise RuntimeError(GRAD_MESSAGE)
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

    def tolist(self):
        a = self._host()
        if a.dtype.kind not in "biuf":  # bfloat16: tolist() would give ml_dtypes scalars
            a = a.astype(np.float32)
        return a.tolist()

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

    def __pos__(self): return self

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

    def is_contiguous(self, memory_format=None) -> bool:
        if memory_format is channels_last:
            return is_channels_last(self.data) or (self.ndim == 4 and self.data.flags.c_contiguous and
                                                   (self.shape[1] == 1 or self.shape[2] * self.shape[3] == 1))
        return bool(self.data.flags.c_contiguous)

    # new tensors like this one (same dtype and device unless given)
    def new_zeros(self, *size, dtype=None): return zeros(*size, dtype=dtype or self.dtype, device=self.device)
    def new_ones(self, *size, dtype=None): return ones(*size, dtype=dtype or self.dtype, device=self.device)
    def new_full(self, size, fill_value, dtype=None):
        return full(size, fill_value, dtype=dtype or self.dtype, device=self.device)
    def new_tensor(self, data, dtype=None): return tensor(data, dtype=dtype or self.dtype, device=self.device)


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


def from_op(out, parents: Sequence[Tensor], backward: Callable, name: str,
            tensor_backward: Callable | None = None) -> Tensor:
    """Wrap an op's output array; record `backward` (grad_out -> grads of parents) when gradients are needed.

    Every differentiable op ends with this call: forward math, then its backward closure, side by side.
    `tensor_backward(grad_out, out)`: the same on Tensors, written with Frost's ops (so itself on the tape); what
    create_graph=True runs to make gradients that can be differentiated again. None: this op's cannot.
    """
    t = share_version(Tensor(out), parents)
    if autograd.is_anomaly_enabled():
        autograd.check_forward(name, t.data, parents)  # t.data: a NumPy scalar result is an array there
    if autograd.is_grad_enabled() and any(p.requires_grad for p in parents):
        t.requires_grad = True
        t._ctx = autograd.Node(tuple(parents), backward, name, tensor_backward)
    return t


def record_tensor_backward(t: Tensor, tensor_backward: Callable) -> Tensor:
    """t, made by a fast path (frost.dispatch) whose from_op records only the array backward, with the op's
    Tensor-level backward on its node too: create_graph=True then works whichever path made t."""
    if t._ctx is not None and t._ctx.tensor_backward is None:
        t._ctx.tensor_backward = tensor_backward
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
    cpu.manual_seed(seed)
    cuda.manual_seed(seed)
