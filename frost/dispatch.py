"""The dispatch table: where the acceleration layer's fast paths register and where the core's ops ask for them.

The core (frost/ops) knows each op's math and nothing about how a particular GPU makes it fast. A fast path lives in
the acceleration layer (frost/accel), which imports the core and registers each implementation for an op, a
device, and optionally dtypes, memory layouts and a predicate on the call:

    @dispatch.register("cross_entropy", device="cuda", dtypes=("float32",), applies=fits_one_launch)
    def cross_entropy_kernels(input, target, weight, ignore_index, reduction, label_smoothing): ...

An op asks with its operands (Tensors or arrays, the first one deciding device, dtype and layout) and any
parameters the predicates need; it gets the implementation to call with its own arguments, or None and runs its own
reference code:

    fast = dispatch.lookup("cross_entropy", input, target, weight, reduction=reduction)
    if fast is not None:
        return fast(input, target, weight, ignore_index, reduction, label_smoothing)

Implementations are tried by descending priority, then in the order they registered. This module imports nothing
of the ops, the tensor or the layer, so that any core module can ask it; with nothing registered every op runs its
reference code: a correct, slower Frost.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from frost.dtype import to_dtype
from frost.layout import is_channels_last

DEVICES = ("cpu", "cuda")
LAYOUTS = ("contiguous", "channels_last", "strided")


@dataclass(frozen=True)
class FastPath:
    """One registered implementation of an op and the calls it takes."""
    op: str
    fn: Callable
    device: str
    dtypes: frozenset | None      # dtype names (Frost's: "float32", "bfloat16", ...); None: any
    layouts: frozenset | None     # names from LAYOUTS; None: any
    applies: Callable | None      # applies(*operands, **params) -> bool; None: always
    priority: int

    def accepts(self, dtype: str, array, operands: tuple, params: dict) -> bool:
        return ((self.dtypes is None or dtype in self.dtypes)
                and (self.layouts is None or layout_of(array) in self.layouts)
                and (self.applies is None or bool(self.applies(*operands, **params))))


_table: dict[tuple[str, str], list[FastPath]] = {}   # (op, device) -> its fast paths, best first


def _names(op: str, what: str, names: Iterable[str] | None, known: tuple | None = None) -> frozenset | None:
    if names is None:
        return None
    if isinstance(names, str):
        raise TypeError(f"dispatch.register({op!r}): {what} must be a sequence of names, got the string {names!r}")
    names = frozenset(names)
    unknown = sorted(names - set(known)) if known is not None else []
    if unknown:
        raise ValueError(f"dispatch.register({op!r}): unknown {what} {unknown} (known: {list(known)})")
    return names


def register(op: str, *, device: str = "cuda", dtypes: Iterable[str] | None = None,
             layouts: Iterable[str] | None = None, applies: Callable | None = None,
             priority: int = 0) -> Callable[[Callable], Callable]:
    """A decorator registering fn as a fast path of `op` on `device` for the given dtype names and memory layouts
    (None: any), when applies(*operands, **params) is true; returns fn unchanged."""
    if device not in DEVICES:
        raise ValueError(f"dispatch.register({op!r}): device must be one of {DEVICES}, got {device!r}")
    dtype_names = _names(op, "dtypes", None if dtypes is None else [to_dtype(d).name for d in dtypes])
    layout_names = _names(op, "layouts", layouts, LAYOUTS)

    def decorate(fn: Callable) -> Callable:
        paths = _table.setdefault((op, device), [])
        paths.append(FastPath(op, fn, device, dtype_names, layout_names, applies, priority))
        paths.sort(key=lambda path: -path.priority)   # stable: registration order within a priority
        return fn
    return decorate


def lookup(op: str, *operands, **params) -> Callable | None:
    """The first fast path of `op` that takes these operands (the first one, a Tensor or an array, decides device,
    dtype and layout) and params, or None: the op then runs its own reference code."""
    array = _array(operands[0])
    paths = _table.get((op, device_of(array)))
    if not paths or op in _disabled:
        return None
    dtype = to_dtype(array.dtype).name
    for path in paths:
        if path.accepts(dtype, array, operands, params):
            return path.fn
    return None


def has_paths(op: str, array) -> bool:
    """Whether any fast path of `op` is registered on `array`'s device and switched on: a cheap test an op makes
    before the work its lookup needs (on the CPU, where few ops register one, that work would be wasted)."""
    return op not in _disabled and (op, device_of(array)) in _table


_disabled: set[str] = set()  # ops whose fast paths `disabled` switches off for a while


@contextlib.contextmanager
def disabled(*ops: str) -> Iterator[None]:
    """Inside, these ops find no fast path and run their reference code (a benchmark's or a test's baseline)."""
    unknown = [op for op in ops if not isinstance(op, str)]
    if unknown:
        raise TypeError(f"dispatch.disabled: ops are names (str), got {unknown!r}")
    added = set(ops) - _disabled
    _disabled.update(added)
    try:
        yield
    finally:
        _disabled.difference_update(added)


def registered(op: str | None = None) -> list[FastPath]:
    """The fast paths registered (for `op`, or all), best first within each (op, device)."""
    return [path for (name, _), paths in _table.items() if op in (None, name) for path in paths]


def device_of(array) -> str:
    """"cpu" for a NumPy array, "cuda" for a CuPy one."""
    return "cpu" if isinstance(array, np.ndarray) else "cuda"


def layout_of(array) -> str:
    """The memory layout of an array: channels_last (frost.layout), contiguous (C order) or strided (any other)."""
    if is_channels_last(array):
        return "channels_last"
    return "contiguous" if array.flags.c_contiguous else "strided"


def _array(x):
    """The array of an operand: a NumPy or CuPy array is its own, a Tensor holds it in .data."""
    return x if isinstance(x, np.ndarray) or type(x).__module__.startswith("cupy") else x.data
