"""PyTorch idioms answered with what frost has: frost.compile, frost.inference_mode, frost.numel, frost.device and
frost.set_default_dtype / get_default_dtype."""
from __future__ import annotations

import functools
from typing import Any, Callable

from frost import dtype as dtypes
from frost.autograd import is_grad_enabled, set_grad_enabled
from frost.backend import Device
from frost.backend.cuda import is_available as cuda_is_available
from frost.dtype import DType, to_dtype
from frost.jit import jit
from frost.nn.module import Module
from frost.tensor import Tensor


def compile(model: Callable | None = None, *, fullgraph: bool = False, dynamic: bool | None = None,  # noqa: A001
            backend: str | Callable = "inductor", mode: str | None = None, options: dict | None = None,
            disable: bool = False) -> Any:
    """PyTorch's torch.compile call, answered with frost.jit: a function (a whole training or inference step) is
    captured into a CUDA graph after two eager calls, where CUDA is available. Without CUDA, for disable=True, and
    for a Module, the argument comes back unchanged: frost.jit captures whole steps, and a module's forward alone
    would leave its backward outside the graph (wrap the step that calls the module instead). fullgraph, dynamic,
    backend, mode and options are accepted and ignored (frost has one compiler: the graph capture). Also a
    decorator: `@frost.compile` or `@frost.compile(mode=...)`."""
    if model is None:
        return functools.partial(compile, fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode,
                                 options=options, disable=disable)
    if not callable(model):
        raise TypeError(f"frost.compile: expected a function or a Module, got {type(model).__name__}")
    if disable or isinstance(model, Module) or not cuda_is_available():
        return model
    return jit(model)


class inference_mode(set_grad_enabled):
    """PyTorch's inference_mode: no tape is recorded inside (frost's no_grad; frost has no separate inference
    tensors, so tensors made inside may later be used with autograd, unlike PyTorch's). A context manager or a
    decorator (`@frost.inference_mode()` or `@frost.inference_mode`); inference_mode(False) changes nothing."""

    def __new__(cls, mode: bool | Callable = True):
        return cls()(mode) if callable(mode) else super().__new__(cls)

    def __init__(self, mode: bool = True) -> None:
        super().__init__(False)
        self.enabled = bool(mode)

    def __enter__(self):
        if not self.enabled:
            self.mode = is_grad_enabled()  # inference_mode(False) keeps whatever mode is in force
        return super().__enter__()


def numel(input: Tensor) -> int:  # noqa: A002 - PyTorch's argument name
    """The number of elements of a tensor."""
    if not isinstance(input, Tensor):
        raise TypeError(f"frost.numel: expected a Tensor, got {type(input).__name__}")
    return input.numel()


def device(type: str | Device, index: int | None = None) -> Device:  # noqa: A002 - PyTorch's argument name
    """A Device from PyTorch's forms: device("cuda:0"), device("cuda", 0), device("cpu")."""
    if index is None:
        return Device(type)
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise ValueError(f"frost.device: index must be an integer >= 0, got {index!r}")
    if type != "cuda":
        raise ValueError(f"frost.device: only 'cuda' takes an index, got device({type!r}, {index})")
    return Device(f"cuda:{index}")


def get_default_dtype() -> DType:
    """The dtype of tensors made from Python floats and of the float constructors (frost.float32 unless set)."""
    return dtypes.default_float_dtype()


def set_default_dtype(d) -> None:
    """Make `d` (a floating-point dtype) the default of get_default_dtype()."""
    new = to_dtype(d)
    if not new.is_floating_point:
        raise TypeError(f"set_default_dtype: only floating-point dtypes can be the default, got {new!r}")
    dtypes.set_default_float_dtype(new)
