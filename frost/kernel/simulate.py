"""The CPU simulator: kernels translated to Python generators run thread by thread, with barriers and warps.

Two checks beyond bounds checking, each failing as an out-of-bounds access does (a SimulationError naming the
kernel, the block and thread, and the kernel's source line):
- A step budget: every simulated thread may run at most `step_limit` loop iterations (all the loops of the kernel
  and its device functions together), so that an endless loop fails instead of hanging; StepLimitError. Set
  `frost.kernel.simulate.step_limit` (read at each launch) or the environment variable FROST_KERNEL_STEP_LIMIT
  (read at import). The default, a million, takes about a second for a simple loop; the kernels of Frost's test
  suite and examples stay under 100,000 per thread.
- A race detector for shared memory: between two barriers of a block (syncthreads, grid_sync), two different
  threads touching one shared address, at least one of them writing, unordered by a named barrier (bar_sync after
  the other thread's bar_sync or bar_arrive of the same barrier instance) or an mbarrier (mbarrier_wait of a phase the
  other thread arrived at, or whose bulk copy it issued), tracked with a vector clock per thread, is
  a SharedMemoryRaceError naming the array,
  the index, both threads and both lines. Atomics on one address do not race with each other (they do with plain
  reads and writes). Warp operations (shuffles, ballot, ldmatrix, mma) order nothing: as CUDA's
  `__shfl_sync` / `__ballot_sync` they exchange registers but "do not imply a memory barrier", and the language
  has no `__syncwarp`, so warp-synchronous shared-memory code needs a syncthreads() here as on the GPU.
  Tracked: loads and stores (scalar, vector, through `sub`/`tile` views), atomics, landed cp.async copies (as
  writes by the issuing thread at its cp_wait), landed bulk copies (writes by the copy engine as the issuing thread
  left it, when the barrier's phase completes), mbarrier objects (init a write, other uses atomic) and ldmatrix rows
  (as reads by each lane); wgmma's descriptor
  reads are not. Addresses are byte offsets in the block's shared memory, so differently typed views of dynamic
  shared memory meet where their elements start at the same byte. `race_check = False` (or
  FROST_KERNEL_RACECHECK=0) turns the detector off.
"""
from __future__ import annotations

import ast
import functools
import itertools
import math
import operator
import os
import sys

import ml_dtypes
import numpy as np

from frost.kernel import frontend
from frost.kernel.builder import Bounds, Builder
from frost.kernel.builtin_defs.mbarrier import BULK_ALIGN, MAX_COUNT
from frost.kernel.builtin_defs.sync import NAMED_BARRIERS
from frost.kernel.frontend import Checked
from frost.kernel.types import (ArrayType, bf16, boolean, f16, f32, f64, i32, i64,
                                strong, u32, u8)


step_limit: int = int(os.environ.get("FROST_KERNEL_STEP_LIMIT", 1_000_000))
race_check: bool = os.environ.get("FROST_KERNEL_RACECHECK", "1") != "0"


class SimulationError(Exception):
    """An error inside a simulated kernel: names the thread, the array and the Python line."""


class StepLimitError(SimulationError):
    """A simulated thread ran more loop iterations than `step_limit` (an endless loop, or a budget set too low)."""


class SharedMemoryRaceError(SimulationError):
    """Two threads of a block touched one shared-memory address, at least one writing, with no barrier between."""


class _OutOfBounds(Exception):
    error = SimulationError  # what _raise turns it into, with the kernel, the thread and the line


class _StepLimit(_OutOfBounds):
    error = StepLimitError


class _Race(_OutOfBounds):
    error = SharedMemoryRaceError

    def __init__(self, message: str, thread) -> None:
        super().__init__(message)
        self.thread = thread  # the second accessor (a lane of an ldmatrix, resolved by the scheduler)


# -- arrays ---------------------------------------------------------------------------------------------
class SimArray:
    """An array seen by simulated threads: every access is bounds-checked."""

    __slots__ = ("data", "name", "shape", "len64")

    def __init__(self, data: np.ndarray, name: str, shape=None) -> None:
        self.data = data
        self.name = name
        self.shape = tuple(shape) if shape is not None else data.shape
        self.len64 = np.int64(self.shape[0])

    def _fail(self, idx):
        raise _OutOfBounds(f"index {idx} is out of bounds for array {self.name!r} of shape {self.shape}"
                           + ("" if self.shape == self.data.shape else f" (only {self.data.shape} inside the array)"))

    def _check(self, idx):
        for k, n, m in zip(idx, self.shape, self.data.shape):
            if not 0 <= k < n or k >= m:
                self._fail(idx if len(idx) > 1 else idx[0])

    def ld(self, i):
        i = int(i)
        if not 0 <= i < self.shape[0] or i >= self.data.shape[0]:
            self._fail(i)
        return self.data[i]

    def st(self, i, v):
        i = int(i)
        if not 0 <= i < self.shape[0] or i >= self.data.shape[0]:
            self._fail(i)
        self.data[i] = v

    def _index(self, idx) -> tuple:
        """idx as a tuple of ints, checked against the bounds."""
        idx = tuple(int(k) for k in idx)
        self._check(idx)
        return idx

    def ldn(self, idx):
        return self.data[self._index(idx)]

    def stn(self, idx, v):
        self.data[self._index(idx)] = v

    def sub(self, idx):
        idx = tuple(int(k) for k in idx)
        self._check(idx)
        return SimArray(self.data[idx], f"{self.name}{list(idx)}", self.shape[len(idx):])

    def tile(self, r, c, i, j):
        i, j = int(i), int(j)
        r0, c0 = i * r, j * c
        if r0 < 0 or c0 < 0:
            self._fail((r0, c0))
        return SimArray(self.data[r0:r0 + r, c0:c0 + c], f"{self.name}.tile(({r}, {c}), ({i}, {j}))", (r, c))

    def ld4(self, i, what="load4", width=4):
        """`width` consecutive elements from i as one vector access: i % width == 0, the array aligned to
        width x the element's bytes, all in bounds."""
        return tuple(self._vector(i, what, width))

    def st4(self, i, *values, what="store4"):
        self._vector(i, what, len(values))[...] = values

    def _vector(self, i, what, width):
        i = int(i)
        n = min(self.shape[0], self.data.shape[0])
        nbytes = self.data.itemsize * width
        if i % width:
            raise _OutOfBounds(f"{what}: index {i} into array {self.name!r} is not a multiple of {width} "
                               f"({nbytes}-byte vector accesses need i % {width} == 0)")
        if self.data.ctypes.data % nbytes:
            raise _OutOfBounds(f"{what}: array {self.name!r} (index {i}) does not start at a {nbytes}-byte aligned "
                               f"address (it is {self.data.ctypes.data % nbytes} bytes past one); {nbytes}-byte "
                               "vector accesses need an aligned base")
        if not 0 <= i or i + width > n:
            raise _OutOfBounds(f"{what}: elements {i}..{i + width - 1} are out of bounds for array {self.name!r} of "
                               f"shape {self.shape}")
        return self.data[i:i + width]

    def span(self, idx, count):
        """`count` consecutive elements along the last dimension starting at idx (for 16-byte copies)."""
        idx = tuple(int(k) for k in idx)
        self._check(idx)
        last = idx[-1]
        if last + count > min(self.shape[-1], self.data.shape[-1]):
            raise _OutOfBounds(f"{count} elements from index {idx if len(idx) > 1 else idx[0]} run past the end "
                               f"of array {self.name!r} of shape {self.shape}")
        return self.data[idx[:-1]][last:last + count]

    def atomic(self, idx, op, v, v2=None):
        idx = tuple(int(k) for k in idx)
        self._check(idx)
        old = self.data[idx]
        if op == "add":
            new = old + v
        elif op == "max":
            new = np.fmax(old, v) if self.data.dtype.kind == "f" else max(old, v)
        elif op == "min":
            new = np.fmin(old, v) if self.data.dtype.kind == "f" else min(old, v)
        else:  # cas
            new = v2 if old == v else old
        self.data[idx] = new
        return old


class SharedArray(SimArray):
    """A shared-memory array (or a view of one): every access is also recorded for the block's race detector,
    keyed by its byte address in the block's shared memory (base + index . strides)."""

    __slots__ = ("block", "base", "strides")

    def __init__(self, data: np.ndarray, name: str, block: "Block", base: int, shape=None) -> None:
        super().__init__(data, name, shape)
        self.block, self.base, self.strides = block, base, data.strides

    def _address(self, idx) -> int:
        return self.base + sum(map(operator.mul, idx, self.strides))

    def ld(self, i):
        v = SimArray.ld(self, i)
        i = int(i)
        self.block.touch(self, self.base + i * self.strides[0], _READ, i)
        return v

    def st(self, i, v):
        SimArray.st(self, i, v)
        i = int(i)
        address = self.base + i * self.strides[0]
        if self.block.guards_wgmma_operands:
            self.block.check_not_wgmma_operand(address, self.data.itemsize, f"a store to {self.name}[{i}]")
        self.block.touch(self, address, _WRITE, i)

    def ldn(self, idx):
        idx = self._index(idx)
        self.block.touch(self, self._address(idx), _READ, idx)
        return self.data[idx]

    def stn(self, idx, v):
        idx = self._index(idx)
        self.data[idx] = v
        address = self._address(idx)
        if self.block.guards_wgmma_operands:
            self.block.check_not_wgmma_operand(address, self.data.itemsize, f"a store to {self.name}{list(idx)}")
        self.block.touch(self, address, _WRITE, idx)

    def atomic(self, idx, op, v, v2=None):
        old = SimArray.atomic(self, idx, op, v, v2)
        idx = tuple(int(k) for k in idx)
        self.block.touch(self, self._address(idx), _ATOMIC, idx if len(idx) > 1 else idx[0])
        return old

    def ld4(self, i, what="load4", width=4):
        values = SimArray.ld4(self, i, what, width)
        self.track_span((int(i),), width, _READ)
        return values

    def st4(self, i, *values, what="store4"):
        SimArray.st4(self, i, *values, what=what)
        if self.block.guards_wgmma_operands:
            self.block.check_not_wgmma_operand(self._address((int(i),)), self.data.itemsize * len(values),
                                               f"a {what} to {self.name}[{int(i)}]")
        self.track_span((int(i),), len(values), _WRITE)

    def track_span(self, idx, count, kind, thread=None, at=None) -> None:
        """Record `count` consecutive elements along the last dimension from idx (bounds already checked);
        thread and at (a (file, line) of generated code) name the accessor when it is not the running thread."""
        idx = tuple(int(k) for k in idx)
        step = self.strides[-1]
        start = self._address(idx)
        at = at or _caller_line()
        block = self.block
        cells = block.cells
        cell = block.cell
        for k in range(count):
            address = start + k * step
            if address in cells:
                block.touch(self, address, kind, idx, thread, at, k)
            else:  # the common case, inline: a first access since the barrier
                cells[address] = cell(thread or block.current, kind, at)

    def sub(self, idx):
        idx = tuple(int(k) for k in idx)
        self._check(idx)
        return SharedArray(self.data[idx], f"{self.name}{list(idx)}", self.block, self._address(idx),
                           self.shape[len(idx):])

    def tile(self, r, c, i, j):
        view = SimArray.tile(self, r, c, i, j)
        return SharedArray(view.data, view.name, self.block, self._address((int(i) * r, int(j) * c)), (r, c))


_READ, _WRITE, _ATOMIC = "reads", "writes", "atomically updates"
_PAST = {_READ: "read", _WRITE: "wrote", _ATOMIC: "atomically updated"}


class _Cell:
    """Who touched one shared address since the block's last barrier: the first plain writer, and up to two
    distinct readers and two distinct atomic updaters (two are enough to find one other than any given thread)."""

    __slots__ = ("writer", "readers", "atomics")

    def __init__(self, thread, kind, at) -> None:
        """The first access since the barrier: by `thread`, at (file, line) of generated code."""
        self.writer = (thread, at) if kind == _WRITE else None
        self.readers = ((thread, at),) if kind == _READ else ()  # tuples: the empty one costs no allocation
        self.atomics = ((thread, at),) if kind == _ATOMIC else ()

    def conflict(self, thread, kind):
        """The earlier access by another thread that `kind` by `thread` races with: (thread, at, kind) or None."""
        w = self.writer
        if w is not None and w[0] is not thread:
            return w[0], w[1], _WRITE
        if kind != _READ:
            for t, at in self.readers:
                if t is not thread:
                    return t, at, _READ
        if kind != _ATOMIC:
            for t, at in self.atomics:
                if t is not thread:
                    return t, at, _ATOMIC
        return None

    def record(self, thread, kind, at) -> None:
        """Note the access; at: its (file, line) in generated code, None for the caller's."""
        if kind == _WRITE:
            if self.writer is None:
                self.writer = (thread, at or _caller_line())
            return
        seen = self.readers if kind == _READ else self.atomics
        if not seen or (len(seen) == 1 and seen[0][0] is not thread):
            seen += ((thread, at or _caller_line()),)
            if kind == _READ:
                self.readers = seen
            else:
                self.atomics = seen


class _OrderedCell:
    """_Cell for a kernel with named barriers, where threads are only partly ordered: the last plain writer and
    every thread's latest read and atomic update, each as (thread, at, the thread's epoch then); an access by
    another thread is ordered after one of them when that thread has passed a named barrier the first one had
    arrived at since (its vector clock holds that epoch)."""

    __slots__ = ("writer", "readers", "atomics")

    def __init__(self, thread, kind, at) -> None:
        entry = (thread, at, thread.epoch)
        self.writer = entry if kind == _WRITE else None
        self.readers = {thread.linear: entry} if kind == _READ else {}
        self.atomics = {thread.linear: entry} if kind == _ATOMIC else {}

    def conflict(self, thread, kind):
        """The earlier access by another thread, not ordered before this one, that `kind` by `thread` races with:
        (thread, at, kind) or None."""
        seen = thread.vc
        w = self.writer
        if w is not None and w[0] is not thread and seen.get(w[0].linear, -1) < w[2]:
            return w[0], w[1], _WRITE
        for others, what in ((self.readers, _READ), (self.atomics, _ATOMIC)):
            if kind == what:
                continue
            for t, at, epoch in others.values():
                if t is not thread and seen.get(t.linear, -1) < epoch:
                    return t, at, what
        return None

    def record(self, thread, kind, at) -> None:
        """Note the access (conflict() found none). A write is ordered after every access kept (else it raced): it
        replaces them."""
        entry = (thread, at or _caller_line(), thread.epoch)
        if kind == _WRITE:
            self.writer, self.readers, self.atomics = entry, {}, {}
        elif kind == _READ:
            self.readers[thread.linear] = entry
        else:
            self.atomics[thread.linear] = entry


def _caller_line():
    """(file, line) of the innermost frame of generated kernel code on the stack (the access being recorded)."""
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename not in LINE_MAPS:
        f = f.f_back
    return (f.f_code.co_filename, f.f_lineno) if f is not None else ("<kernel>", 0)


def _source_line(at) -> str:
    """'file.py:line' of the kernel's Python source for a (file, line) of generated code."""
    filename, lineno = at
    if filename not in LINE_MAPS:
        return f"{filename}:{lineno}"
    pyfile, lines = LINE_MAPS[filename]
    return f"{pyfile}:{lines[min(max(lineno - 1, 0), len(lines) - 1)]}"


def _filled(dtype, shape):
    dt = np.dtype(dtype)
    if dt.kind == "f" or dt == np.dtype(ml_dtypes.bfloat16):
        return np.full(shape, np.nan, dtype=dt)
    return np.zeros(shape, dtype=dt)


# -- helpers the generated code calls --------------------------------------------------------------------
def _idiv(a, b):
    t = type(a)
    if b == 0:
        raise ZeroDivisionError("integer division by zero")
    q = abs(int(a)) // abs(int(b))
    return np.asarray(q if (a >= 0) == (b >= 0) else -q).astype(t)[()]


def _imod(a, b):
    t = type(a)
    if b == 0:
        raise ZeroDivisionError("integer remainder by zero")
    return np.asarray(int(a) - int(b) * int(_idiv(a, b))).astype(t)[()]


def _cast(dtype):
    def cast(x):
        return np.asarray(x).astype(dtype)[()]
    return cast


def _fma(a, b, c):
    t = type(a)
    if t is np.float32:
        return np.float32(float(a) * float(b) + float(c))
    fma = getattr(math, "fma", None)
    return t(fma(float(a), float(b), float(c))) if fma else t(a * b + c)


def _mulhi(a, b):
    """The high 32 bits of the exact 64-bit product (__umulhi for u32, __mulhi for i32)."""
    if type(a) is np.uint32:
        return np.uint32((np.uint64(a) * np.uint64(b)) >> np.uint64(32))
    return np.int32((int(a) * int(b)) >> 32)  # Python ints are exact; >> floors, as the signed high word does


def _erf(x):
    return type(x)(math.erf(float(x)))


def _rsqrt(x):
    return type(x)(1) / np.sqrt(x)


def _range(t, start, stop=None, step=None):
    if stop is None:
        start, stop = 0, start
    step = 1 if step is None else int(step)
    if step == 0:
        raise ValueError("range() step must not be zero")
    return map(t, range(int(start), int(stop), step))


def _grid(types, *extents):
    """The index tuples of grid(*extents), each variable of its own type (as the frontend and C++ give them)."""
    return itertools.product(*(list(map(t, range(int(n)))) for t, n in zip(types, extents)))


def _float_to_int(np_type, nan_value: int = 0):
    """A float -> integer conversion as the GPU's cvt.rzi does it: truncation toward zero, saturating at the type's
    range, NaN to nan_value (0; INT64_MIN for i64, as the H200 gives) where NumPy's astype gives INT_MIN or wraps."""
    info = np.iinfo(np_type)
    lo, hi = int(info.min), int(info.max)

    def convert(x):
        x = float(x)
        if x != x:
            return np_type(nan_value)
        if x <= lo:
            return np_type(lo)
        if x >= hi:
            return np_type(hi)
        return np_type(int(x))
    return convert


_float_to_u32 = _float_to_int(np.uint32)


def _float_to_u8(x):
    """(unsigned char)x: NVRTC converts to u32 (cvt.rzi.u32.f32, saturating) and stores the low byte."""
    return np.uint8(int(_float_to_u32(x)) & 0xFF)


_SMALLEST_NORMAL = np.float32(2.0 ** -126)


def _fast_exp2(x):
    """ex2.approx.ftz.f32: subnormal inputs read as zero, subnormal results flushed to zero (the rounding of the
    approximation itself, about 2^-22 relative, is not modelled)."""
    x = np.float32(x)
    if abs(x) < _SMALLEST_NORMAL:
        x = np.float32(0.0)
    r = np.exp2(x)
    return np.float32(0.0) if r < _SMALLEST_NORMAL else r


NAMESPACE = {
    "_np": np, "_idiv": _idiv, "_imod": _imod, "_fma": _fma, "_erf": _erf, "_mulhi": _mulhi, "_rsqrt": _rsqrt,
    "_range": _range, "_grid": _grid, "_B": bool, "_fmod": np.fmod, "_ftrunc": np.trunc, "_pow": np.power,
    "_fmin": np.fmin, "_fmax": np.fmax, "_min": min, "_max": max, "_abs": abs,
    "_SYNC": ("sync",), "_GRID_SYNC": ("grid_sync",),
    "_local": lambda dtype, shape, name: SimArray(_filled(dtype, shape), name),
    "_sqrt": np.sqrt, "_exp": np.exp, "_exp2": np.exp2, "_fast_exp2": _fast_exp2, "_log": np.log, "_log2": np.log2,
    "_tanh": np.tanh, "_sin": np.sin, "_cos": np.cos, "_floor": np.floor, "_ceil": np.ceil, "_SimArray": SimArray,
    "_sat_i32": _float_to_int(np.int32), "_sat_i64": _float_to_int(np.int64, nan_value=-2 ** 63),
    "_sat_u32": _float_to_u32,
    "_sat_u8": _float_to_u8,
}
# a kernel's own names must not shadow these (nor _T, _BF16, _BF16_DT and the generated _fk_ names)
frontend.SIM_NAMES.update(NAMESPACE, {"_T", "_BF16", "_BF16_DT"})
CONV = {f32: "_np.float32", f64: "_np.float64", f16: "_np.float16", i32: "_np.int32", i64: "_np.int64",
        u32: "_np.uint32", u8: "_np.uint8", boolean: "_np.bool_"}
PYOPS = {"Add": "+", "Sub": "-", "Mult": "*", "Div": "/", "LShift": "<<", "RShift": ">>", "BitAnd": "&",
         "BitOr": "|", "BitXor": "^"}
LINE_MAPS: dict[str, tuple[str, list[int]]] = {}  # generated filename -> (python file, line of each generated line)


def convert(code: str, src, dst) -> str:
    """Python code converting a value of type src to type dst, as the generated C++ does (cgen.convert)."""
    if dst is None or src == dst:
        return code
    if dst in (bf16, f16):  # C++ converts to bf16/f16 from f32 (frost_to_f16((float)x)): two roundings from f64
        if src is not f32:
            code = f"_np.float32({code})"
        return f"_BF16({code})" if dst is bf16 else f"_np.float16({code})"
    if dst.is_int and src.is_float:  # cvt.rzi saturates
        return f"_sat_{dst.name}({code})"
    return f"{CONV[dst]}({code})"


class PyGen(Builder):
    """Writes a checked function as Python source for the simulator."""

    TARGET, AND, TMP, UNSUPPORTED = "sim", " and ", "_fk_t", "the simulator does not support {name}()"
    convert = staticmethod(convert)

    def __init__(self, fn: Checked, namespace: dict) -> None:
        super().__init__(fn)
        self.ns = namespace
        self.out: list[str] = []
        self.lines: list[int] = []

    def w(self, text, node):
        self.out.append("    " * self.indent + text)
        self.lines.append(self.src.line(node))

    def const(self, value, t) -> str:
        t = strong(t)
        key = f"_fk_c{len(self.ns)}"
        with np.errstate(over="ignore"):  # a float beyond f32's range is inf, as cgen.literal writes it
            if t is bf16 or t is f16:  # rounded to f32 first, as cgen.literal writes it
                self.ns[key] = t.np.type(np.float32(value))
            elif t.is_float:
                self.ns[key] = np.asarray(float(value)).astype(t.np)[()]
            else:
                self.ns[key] = np.asarray(int(value)).astype(t.np)[()]
        return key

    literal = const  # a number in the generated code is a constant of the namespace

    def generate(self) -> str:
        fn = self.fn
        tree = self.src.tree
        params = []
        for p in fn.params:
            params.append(p.name)
        self.out.append(f"def {fn.cname}(_T, {', '.join(params)}):")
        self.lines.append(self.src.line(tree))
        self.w("tx, ty, tz, bx, by, bz, bdx, bdy, bdz, gdx, gdy, gdz, warp, lane = _T.idx", tree)
        if fn.has_yield:
            self.w("if False:", tree)
            self.w("    yield", tree)
        self.block(tree.body)
        self.w("return None", tree)
        return "\n".join(self.out) + "\n"

    def block(self, stmts):
        n = len(self.out)
        super().block(stmts)
        if len(self.out) == n:
            self.w("pass", stmts[0] if stmts else self.src.tree)

    # -- statements: Python's words for the shared walk (builder.Builder) --------------------------------
    def end(self, code: str) -> str:
        return code

    def pass_stmt(self, s) -> None:
        self.w("pass", s)

    def omitted(self, expr) -> bool:
        return False

    def assign(self, target, code: str) -> str:
        return f"{target.id} = {code}" if isinstance(target, ast.Name) else self.store(target, code)

    def element_store(self, target, value) -> str:
        return self.store(target, value())

    def array_value(self, value, target) -> str:
        if isinstance(value, ast.Call) and _fname(value) in ("shared", "local"):
            return self.alloc(value, target.id)
        return self.ex(value)

    def bind_values(self, s, targets, values) -> list[str]:
        vals = [self.ex(v, self.type(t)) for t, v in zip(targets, values)]
        tmps = [self.new_tmp() for _ in vals]
        self.w(f"{', '.join(tmps)} = {', '.join(vals)}", s)
        return tmps

    def bind(self, tmp: str, code: str) -> str:
        return f"{tmp} = {code}"

    def item(self, tmp: str, k: int) -> str:
        return f"{tmp}[{k}]"

    def alloc(self, call, name):
        t = self.type(call)
        dtype = f"_np.dtype({t.elem.np.name!r})" if t.elem is not bf16 else "_BF16_DT"
        if _fname(call) == "shared":
            sid = self.fn.shared_ids[id(call)]
            return f"_T.shared(({self.fn.cname!r}, {sid}), {dtype}, {t.shape}, {name!r})"
        return f"_local({dtype}, {t.shape}, {name!r})"

    def store(self, target, value_code):
        arr, idx = target.value, _indices(target)
        a = self.ex(arr)
        if len(idx) == 1:
            return f"{a}.st({self.ex(idx[0])}, {value_code})"
        return f"{a}.stn(({', '.join(self.ex(i) for i in idx)},), {value_code})"

    def update(self, s, tt, rt, op: str):
        if isinstance(s.target, ast.Name):
            cur = s.target.id
            return cur, lambda value: f"{cur} = {value}"
        arr, idx = s.target.value, _indices(s.target)  # array and indices into temporaries: evaluated once
        a = self.new_tmp()
        self.w(f"{a} = {self.ex(arr)}", s)
        tmps = []
        for i in idx:
            t = self.new_tmp()
            self.w(f"{t} = {self.ex(i)}", s)
            tmps.append(t)
        if len(tmps) == 1:
            return f"{a}.ld({tmps[0]})", lambda value: f"{a}.st({tmps[0]}, {value})"
        index = f"({', '.join(tmps)},)"
        return f"{a}.ldn({index})", lambda value: f"{a}.stn({index}, {value})"

    def if_head(self, test, first: bool) -> str:
        return f"{'if' if first else 'elif'} {self.ex(test)}:"

    def else_head(self, s) -> None:
        self.w("else:", s)

    def close(self) -> None:
        pass  # Python's indentation ends the block

    def while_head(self, test) -> str:
        return f"while {self.ex(test)}:"

    def range_head(self, s, kind: str, bounds: Bounds) -> None:
        t = self.type(s.target)
        step = bounds.step
        if bounds.step_value is not None:
            # a constant step keeps its sign (C++ picks `i > end` from it; a u32 step of -1 wraps to i - 1)
            step = str(int(bounds.step_value))
        args = ", ".join(a for a in (bounds.start, bounds.stop, step) if a is not None)
        self.w(f"for {s.target.id} in _range({CONV[t]}, {args}):", s)

    def grid_head(self, s) -> tuple[None, int]:
        it = s.iter
        names = [n.id for n in s.target.elts]
        types = ", ".join(CONV[self.type(n)] for n in s.target.elts)
        ext = ", ".join(self.ex(a, self.type(n)) for a, n in zip(it.args, s.target.elts))
        self.w(f"for {', '.join(names)} in _grid(({types},), {ext}):", s)
        self.indent += 1
        return None, 1  # _grid yields the index tuples: a break leaves the whole grid

    def grid_end(self, s, exit_label) -> None:
        pass

    def count_iteration(self, loop):
        """One step of the thread's budget per iteration, inline (a call would cost more than the count)."""
        self.w("_T.steps -= 1", loop)
        self.w("if _T.steps < 0: _T.out_of_steps()", loop)

    def break_word(self, exit_label) -> str:
        return "break"

    def tuple_value(self, codes: list[str]) -> str:
        return f"({', '.join(codes)},)"

    def return_stmt(self, code: str | None) -> str:
        return "return None" if code is None else f"return {code}"

    # -- expressions ------------------------------------------------------------------------------------
    def e_Constant(self, node):
        return "True" if node.value else "False"

    def e_Name(self, node):
        if id(node) in self.fn.values:  # a Const[bool] or a global bool (other folded names are Weak, written above)
            return "True" if self.fn.values[id(node)] else "False"
        return node.id

    def binop(self, name, a, b, t):
        if name == "Pow":
            return f"_pow({a}, {b})"
        if name == "FloorDiv":
            return f"_ftrunc({a} / {b})" if t.is_float else f"_idiv({a}, {b})"
        if name == "Mod":
            return f"_fmod({a}, {b})" if t.is_float else f"_imod({a}, {b})"
        return f"({a} {PYOPS[name]} {b})"

    def negation(self, operand) -> str:
        return f"(not {self.ex(operand)})"

    def e_BoolOp(self, node):
        op = " and " if isinstance(node.op, ast.And) else " or "
        parts = [self.ex(v) if self.type(v) is boolean else f"_B({self.ex(v)})" for v in node.values]
        return "(" + op.join(parts) + ")"

    def e_IfExp(self, node):
        t = self.type(node)
        return f"({self.ex(node.body, t)} if {self.ex(node.test)} else {self.ex(node.orelse, t)})"

    def e_Subscript(self, node):
        if isinstance(node.value, ast.Attribute) and node.value.attr == "shape":
            k = self.fn.values[id(node.slice)]
            return f"_np.int64({self.ex(node.value.value)}.shape[{k}])"
        idx = _indices(node)
        a = self.ex(node.value)
        if isinstance(self.type(node), ArrayType):
            return f"{a}.sub(({', '.join(self.ex(i) for i in idx)},))"
        if len(idx) == 1:
            return f"{a}.ld({self.ex(idx[0])})"
        return f"{a}.ldn(({', '.join(self.ex(i) for i in idx)},))"

    def call_device(self, node, callee: Checked) -> str:
        args = []
        for a, p in zip([node.args[k] for k in callee.param_positions], callee.params):
            args.append(self.ex(a) if isinstance(p.type, ArrayType) else self.ex(a, p.type))
        call = f"{callee.cname}(_T, {', '.join(args)})"
        return f"(yield from {call})" if callee.has_yield else call

    def tile(self, node) -> str:
        r, c = self.type(node).shape
        i, j = (self.ex(e) for e in node.args[1].elts)
        return f"{self.ex(node.func.value)}.tile({r}, {c}, {i}, {j})"

    def index_tuple(self, node) -> str:
        """Python code for a tuple of indices (one index node, or an ast.Tuple of them)."""
        idx = node.elts if isinstance(node, ast.Tuple) else [node]
        return "(" + ", ".join(self.ex(i) for i in idx) + ",)"



def _fname(call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr


def _indices(sub):
    return sub.slice.elts if isinstance(sub.slice, ast.Tuple) else [sub.slice]


def build(kernel: Checked, devices: list[Checked]):
    """Python functions for the kernel and its device functions, sharing one namespace."""
    ns = dict(NAMESPACE)
    ns["_BF16"] = ml_dtypes.bfloat16
    ns["_BF16_DT"] = np.dtype(ml_dtypes.bfloat16)
    for fn in devices + [kernel]:
        gen = PyGen(fn, ns)
        code = gen.generate()
        filename = f"<frost-sim {fn.cname} {id(fn)}>"
        LINE_MAPS[filename] = (fn.src.filename, gen.lines)
        exec(compile(code, filename, "exec"), ns)
        fn.sim_code = code
    return ns[kernel.cname]


# -- the scheduler --------------------------------------------------------------------------------------
class Block:
    """A block's shared memory: static arrays and the dynamic buffer, with simulated shared addresses (the
    dynamic buffer at 0, static arrays after it on 1024-byte boundaries) for wgmma's descriptors."""

    def __init__(self, smem_bytes: int, named_barriers: bool = False) -> None:
        self.shared_arrays: dict = {}
        self.dyn = np.zeros(smem_bytes, dtype=np.uint8)
        self.regions = [(0, self.dyn)]  # (shared address, the bytes there)
        self.top = -(-smem_bytes // 1024) * 1024
        self.cells: dict | None = {} if race_check else None  # shared address -> _Cell, since the last barrier
        self.current: Thread | None = None  # the thread the scheduler runs now: the accessor of what it touches
        self.bars: dict = {}      # named barrier id -> its instance in progress (_named_barriers)
        self.mbars: dict = {}     # shared address -> _MBarrier (mbarrier_init)
        # the kernel uses named barriers, which order only some threads: the race detector keeps every access
        self.partial = named_barriers
        self.cell = _OrderedCell if named_barriers else _Cell   # what a first access since a barrier records
        # shared address -> how many wgmmas in flight read the byte there (issued, not yet retired by any thread)
        self.wgmma_reading: np.ndarray | None = None
        self.wgmmas_in_flight = 0
        # wgmmas retired since the block's last barrier, and the bytes they read: a write there must be ordered after
        # one of the wgmma_waits that retired the wgmma (check_not_wgmma_operand)
        self.wgmma_retired: list = []
        self.wgmma_retired_reading: np.ndarray | None = None

    def add_static(self, data: np.ndarray) -> int:
        """Place a static shared array after the others; its shared address."""
        base = self.top
        self.regions.append((base, data.reshape(-1).view(np.uint8)))
        self.top += -(-data.nbytes // 1024) * 1024
        return base

    def shared_array(self, data: np.ndarray, name: str, base: int) -> SimArray:
        return SharedArray(data, name, self, base) if self.cells is not None else SimArray(data, name)

    def barrier(self, threads) -> None:
        """Every thread of the block passed a barrier: what came before is ordered before what comes after. With
        mbarriers the record is kept and the threads' clocks joined instead, since a barrier does not wait for the
        copy engine: a bulk copy's landing, before or after the barrier, stays unordered until its phase is
        waited for."""
        if self.wgmma_retired:   # every retire so far is now ordered before every thread's next access
            self.wgmma_retired.clear()
            self.wgmma_retired_reading.fill(0)
        if self.mbars:
            joined: dict = {}
            for th in threads:
                _join(joined, th.linear, th.vc, th.epoch)
            for th in threads:
                _advance(th.vc, joined)
                th.epoch += 1
        elif self.cells:
            self.cells.clear()

    def _count_reads(self, counts: np.ndarray | None, addresses: list, delta: int) -> np.ndarray:
        """counts (shared address -> wgmmas reading the byte), grown to the block's shared memory, plus delta for each
        byte of the operands' 16-bit elements (each array's addresses unique within it)."""
        if counts is None or counts.size < self.top:
            grown = np.zeros(max(self.top, 1), np.int32)
            if counts is not None:
                grown[:counts.size] = counts
            counts = grown
        for a in addresses:
            flat = a.reshape(-1)
            flat = flat[(flat >= 0) & (flat + 1 < counts.size)]   # outside: read_u16 names the error
            counts[flat] += delta
            counts[flat + 1] += delta
        return counts

    def wgmma_issued(self, op: "WgmmaOp") -> None:
        """A wgmma is in flight: from its issue until the first wgmma_wait that retires it its operands must not
        change (the simulator reads them then, the hardware any time until then)."""
        self.wgmma_reading = self._count_reads(self.wgmma_reading, op.reads, 1)
        self.wgmmas_in_flight += 1

    def wgmma_retired_by(self, op: "WgmmaOp", thread) -> None:
        """`thread`'s wgmma_wait retires op: a write to its operands is ordered after this (check_not_wgmma_operand)
        where the writer is the thread, or has passed a barrier since (a full one clears the record)."""
        if not op.retirers:
            self.wgmma_reading = self._count_reads(self.wgmma_reading, op.reads, -1)
            self.wgmmas_in_flight -= 1
            self.wgmma_retired_reading = self._count_reads(self.wgmma_retired_reading, op.reads, 1)
            self.wgmma_retired.append(op)
        op.retirers.append((thread, thread.epoch))

    @property
    def guards_wgmma_operands(self) -> bool:
        """Whether a write to shared memory needs check_not_wgmma_operand (a wgmma in flight, or retired since the
        last barrier): asked before building the check's arguments, which would cost every simulated store."""
        return bool(self.wgmmas_in_flight or self.wgmma_retired)

    def check_not_wgmma_operand(self, address: int, nbytes: int, what: str) -> None:
        """A write of nbytes at a shared address (or a copy issued to land there, which may be any time from the
        issue) that a wgmma reads is an error unless the writer is ordered after a wgmma_wait that retired it: PTX
        lets the hardware read wgmma's shared operands until the wgmma completes."""
        end = address + nbytes
        if self.wgmmas_in_flight and self.wgmma_reading[address:end].any():
            raise _OutOfBounds(f"{what} writes shared address {address:#x} ({nbytes} bytes), an operand of a wgmma "
                               "no thread has retired yet (PTX: wgmma's shared operands must not change until it "
                               "completes; wgmma_wait in every warpgroup that reads them, then a barrier, first)")
        if not self.wgmma_retired or not self.wgmma_retired_reading[address:end].any():
            return
        writer = self.current
        for op in self.wgmma_retired:
            if not any(((a >= address - 1) & (a < end)).any() for a in op.reads):
                continue
            if not any(t is writer or writer.vc.get(t.linear, -1) >= epoch for t, epoch in op.retirers):
                t = op.retirers[0][0]
                raise _Race(f"{what} writes shared address {address:#x} ({nbytes} bytes), an operand of a wgmma that "
                            f"{_describe(t)} retired with wgmma_wait, but nothing orders this write after any "
                            "wgmma_wait that retired it (a barrier with a thread that waited for it, or waiting for "
                            "it in this thread; PTX: wgmma's shared operands must not change until it completes)",
                            writer)

    def touch(self, arr: SharedArray, address: int, kind: str, idx, thread=None, at=None, offset: int = 0) -> None:
        """Record an access to the shared address (arr[idx], the last index plus offset) by `thread` (the running
        one by default) at `at` ((file, line) of generated code, the caller's by default); a conflicting access by
        another thread since the last barrier is a race."""
        cells = self.cells
        cell = cells.get(address)
        if cell is None:
            cells[address] = self.cell(thread or self.current, kind, at or _caller_line())
            return
        thread = thread or self.current
        other = cell.conflict(thread, kind)
        if other is not None:
            if offset:
                idx = idx[:-1] + (idx[-1] + offset,)
            if isinstance(idx, tuple) and len(idx) == 1:
                idx = idx[0]
            who = thread.landing if isinstance(thread, _CopyEngine) else f"this thread {kind} it"
            earlier = (f"the {other[0].linear[0]} {_describe(other[0])} issued at {_source_line(other[1])} landed on it"
                       if isinstance(other[0], _CopyEngine) else
                       f"{_describe(other[0])} {_PAST[other[2]]} it at {_source_line(other[1])}")
            raise _Race(f"data race on shared array {arr.name!r} at index {idx}: {who}, and {earlier}, with no "
                        "syncthreads() between (nor a named barrier or an mbarrier wait ordering them)", thread)
        cell.record(thread, kind, at)

    def address(self, arr: "SimArray", idx) -> int:
        """The shared address of arr[idx] (idx already bounds-checked)."""
        ptr = arr.data.ctypes.data + sum(int(i) * st for i, st in zip(idx, arr.data.strides))
        for base, buf in self.regions:
            p0 = buf.ctypes.data
            if p0 <= ptr < p0 + buf.nbytes:
                return base + ptr - p0
        raise _OutOfBounds(f"array {arr.name!r} is not in this block's shared memory")

    def read_u16(self, addrs: np.ndarray) -> np.ndarray:
        """The 16-bit words at the given shared addresses (each even)."""
        out = np.empty(addrs.shape, np.uint16)
        done = np.zeros(addrs.shape, bool)
        for base, buf in self.regions:
            inside = (addrs >= base) & (addrs + 2 <= base + buf.nbytes)
            if inside.any():
                words = buf[:buf.nbytes // 2 * 2].view(np.uint16)
                out[inside] = words[(addrs[inside] - base) // 2]
                done |= inside
        if not done.all():
            bad = int(addrs[~done].reshape(-1)[0])
            raise SimulationError(f"wgmma reads shared address {bad:#x}, outside every shared array of the block")
        return out


class Thread:
    __slots__ = ("idx", "block", "linear", "pending", "groups", "where", "wg_fenced", "wg_pending", "wg_groups",
                 "bulk_pending", "bulk_groups", "bulk_read", "steps", "vc", "epoch")

    def __init__(self, idx, block, linear, steps: int) -> None:
        self.idx, self.block, self.linear = idx, block, linear
        self.steps = steps  # loop iterations left (the generated code counts them down)
        self.pending: list = []
        self.groups: list = []
        self.wg_fenced = False
        self.wg_pending: list = []  # wgmma operations issued since the last wgmma_commit
        self.wg_groups: list = []   # committed groups not yet retired by wgmma_wait
        self.bulk_pending: list = []  # cp_reduce_async_bulk_add operations since the last cp_async_bulk_commit
        self.bulk_groups: list = []   # committed bulk groups not yet retired by a cp_async_bulk_wait[_read]
        self.bulk_read: list = []     # groups retired by cp_async_bulk_wait_read whose adds have not landed
        # the race detector's happens-before across named barriers: epoch counts this thread's arrivals at them, and
        # vc[t] is the latest epoch of thread t (linear index) whose earlier accesses are ordered before this
        # thread's (a vector clock; empty where only full barriers order threads, which clear the record instead)
        self.epoch = 0
        self.vc: dict = {}

    def out_of_steps(self):
        raise _StepLimit(f"more than {step_limit} loop iterations in this thread (an endless loop? the limit is "
                         "frost.kernel.simulate.step_limit, or FROST_KERNEL_STEP_LIMIT in the environment)")

    def shared(self, key, dtype, shape, name):
        arr = self.block.shared_arrays.get(key)
        if arr is None:
            data = _filled(dtype, shape)
            arr = self.block.shared_arrays[key] = self.block.shared_array(data, name, self.block.add_static(data))
        return arr

    # -- wgmma: issued collectively (the scheduler makes a WgmmaOp), performed when wgmma_wait retires it
    def wgmma_desc(self, arr, idx, lbo, sbo, swizzle):
        idx = tuple(int(k) for k in idx)
        arr._check(idx)
        addr = self.block.address(arr, idx)
        if addr % 16:
            raise _OutOfBounds(f"wgmma_desc: {arr.name}{list(idx)} is at shared address {addr:#x}, not 16-byte "
                               "aligned")
        return np.uint64(encode_wgmma_desc(addr, lbo, sbo, swizzle)).view(np.int64)  # the bits, as C's i64 holds them

    def wgmma_fence(self):
        self.wg_fenced = True

    def wgmma_commit(self):
        self.wg_groups.append(self.wg_pending)
        self.wg_pending = []

    def wgmma_wait(self, n, *named):
        while len(self.wg_groups) > n:
            for op in self.wg_groups.pop(0):
                acc = op.accs[self.linear % 128]
                if named and not any(acc is a for a in named):
                    raise _OutOfBounds(f"wgmma_wait: it retires a wgmma into {acc.name!r}, which it does not name "
                                       "among the accumulators to fence (name it, or name none to fence them all)")
                self.block.wgmma_retired_by(op, self)
                op.retire(self.linear % 128)
        self.wg_fenced = False  # the accumulators may be touched now: the next wgmma needs a wgmma_fence first

    def wgmma_discard(self, *arrays):
        for a in arrays:
            a.data.fill(np.nan)
        self.wg_fenced = False  # as a write of the accumulators: the next wgmma needs a wgmma_fence first

    def dynamic_shared(self, dtype, shape=None, offset=0):
        dtype = np.dtype(dtype)
        if shape is None:
            n = self.block.dyn.size // dtype.itemsize
            return self.block.shared_array(self.block.dyn[:n * dtype.itemsize].view(dtype), "dynamic_shared", 0)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        if offset + nbytes > self.block.dyn.size:
            raise _OutOfBounds(f"dynamic_shared({dtype.name}, {shape}) at byte {offset} needs {offset + nbytes} "
                               f"bytes of dynamic shared memory; the launch gave {self.block.dyn.size}")
        key = ("dyn", offset, dtype, shape)
        arr = self.block.shared_arrays.get(key)
        if arr is None:
            view = self.block.dyn[offset:offset + nbytes].view(dtype).reshape(shape)
            view[...] = np.nan if dtype.kind == "f" or dtype == np.dtype(ml_dtypes.bfloat16) else 0
            arr = self.block.shared_arrays[key] = self.block.shared_array(view, "dynamic_shared", offset)
        return arr

    def cp_async(self, dst, didx, src, sidx):
        count = 16 // dst.data.dtype.itemsize
        d = dst.span(didx, count)
        if self.block.guards_wgmma_operands:
            self.block.check_not_wgmma_operand(self.block.address(dst, tuple(int(k) for k in didx)), 16,
                                               f"cp_async16 into {dst.name}")
        s = src.span(sidx, count)
        self.pending.append((d, s, dst, didx))
        if isinstance(src, SharedArray):
            src.track_span(sidx, count, _READ)

    def cp_commit(self):
        self.groups.append(self.pending)
        self.pending = []

    def cp_wait(self, n):
        if self.pending:   # PTX: cp.async.wait_group waits for committed groups only; these would land any time
            raise _OutOfBounds(f"cp_wait({int(n)}): this thread has {len(self.pending)} cp_async16 cop"
                               f"{'y' if len(self.pending) == 1 else 'ies'} not yet committed, which the wait does not "
                               "cover: call cp_commit() after issuing them")
        while len(self.groups) > n:
            for d, s, dst, didx in self.groups.pop(0):
                d[...] = s.view(d.dtype)
                if isinstance(dst, SharedArray):  # the copy lands now: a write by this thread, at its cp_wait
                    dst.track_span(didx, d.size, _WRITE)

    # -- mbarriers and bulk copies: a phase completes (and its copies land) when its arrivals and bytes are all in
    def _mbarrier(self, arr, i, name: str, kind: str) -> "_MBarrier":
        """The mbarrier at arr[i], its use recorded for the race detector (using it before the syncthreads() after
        its mbarrier_init races with the init's write)."""
        addr = self._mbarrier_address(arr, i)
        if isinstance(arr, SharedArray):
            arr.track_span((i,), 1, kind)
        bar = self.block.mbars.get(addr)
        if bar is None:
            raise _OutOfBounds(f"{name}: {arr.name}[{int(i)}] is not an initialized mbarrier (mbarrier_init first)")
        return bar

    def _mbarrier_address(self, arr, i) -> int:
        idx = (int(i),)
        arr._check(idx)
        return self.block.address(arr, idx)

    def mbarrier_init(self, arr, i, count):
        count = int(count)
        if not 1 <= count <= MAX_COUNT:
            raise _OutOfBounds(f"mbarrier_init: count {count} is not in 1..{MAX_COUNT}")
        addr = self._mbarrier_address(arr, i)
        if addr in self.block.mbars:   # PTX: mbarrier.init of a valid mbarrier is undefined
            raise _OutOfBounds(f"mbarrier_init: {arr.name}[{int(i)}] is already an initialized mbarrier")
        if isinstance(arr, SharedArray):
            arr.track_span((int(i),), 1, _WRITE)
        self.block.mbars[addr] = _MBarrier(count, f"{arr.name}[{int(i)}]")

    def mbarrier_arrive(self, arr, i, tx, name="mbarrier_arrive"):
        bar = self._mbarrier(arr, i, name, _ATOMIC)
        if not 0 <= int(tx) <= MAX_COUNT:
            raise _OutOfBounds(f"{name}: {int(tx)} bytes is not in 0..{MAX_COUNT}")
        bar.add_tx(int(tx))
        bar.pending -= 1
        if bar.pending < 0:
            raise _OutOfBounds(f"mbarrier {bar.name}: more than its count of {bar.count} arrivals in one phase")
        _join(bar.clock, self.linear, self.vc, self.epoch)
        self.epoch += 1
        bar.complete_if_done()

    def mbarrier_waiting(self, arr, i, parity):
        """The scheduler's request of mbarrier_wait: it resumes the thread when the phase has completed."""
        if int(parity) not in (0, 1):
            raise _OutOfBounds(f"mbarrier_wait: parity {int(parity)} is not 0 or 1 (use k // STAGES % 2)")
        return "mbar", self._mbarrier(arr, i, "mbarrier_wait", _ATOMIC), int(parity)

    def _bulk_aligned(self, op: str, shared, sidx: int, glob, gidx: int, span) -> None:
        """A bulk operation's two addresses are 16-byte aligned (span: its elements of the global array)."""
        if self.block.address(shared, (sidx,)) % BULK_ALIGN:
            raise _OutOfBounds(f"{op}: {shared.name}[{sidx}] is not {BULK_ALIGN}-byte aligned in shared memory")
        if span.ctypes.data % BULK_ALIGN:
            raise _OutOfBounds(f"{op}: {glob.name}[{gidx}] is not {BULK_ALIGN}-byte aligned in global memory")

    def cp_async_bulk(self, dst, didx, src, sidx, nbytes, bars, i):
        nbytes, size = int(nbytes), dst.data.dtype.itemsize
        if nbytes <= 0 or nbytes % BULK_ALIGN or nbytes > MAX_COUNT:
            raise _OutOfBounds(f"cp_async_bulk: {nbytes} bytes is not a positive multiple of {BULK_ALIGN} up to "
                               f"{MAX_COUNT}")
        count = nbytes // size
        d = dst.span((int(didx),), count)
        s = src.span((int(sidx),), count)
        self._bulk_aligned("cp_async_bulk", dst, int(didx), src, int(sidx), s)
        self._copy_on_barrier("cp_async_bulk", bars, i, d, s, dst, int(didx), nbytes)

    def _copy_on_barrier(self, op: str, bars, i, d, source, dst, didx: int, nbytes: int) -> None:
        """A copy-engine copy of source into d (dst[didx:]) counting nbytes on bars[i]: it lands when the phase
        completes. The copy engine writes as a thread of its own, after what the issuing thread did before issuing;
        a waiter of the phase is ordered after the landing only (PTX: complete-tx orders nothing else of the
        issuer's)."""
        if self.block.guards_wgmma_operands:   # the copy engine may write from the issue on
            self.block.check_not_wgmma_operand(self.block.address(dst, (didx,)), nbytes, f"{op} into {dst.name}")
        bar = self._mbarrier(bars, i, op, _ATOMIC)
        engine = _CopyEngine(self, _caller_line(), op)
        bar.copies.append((d, source, dst, didx, engine))
        _join(bar.clock, engine.linear, {}, engine.epoch)
        bar.add_tx(-nbytes)
        bar.complete_if_done()

    def cp_async_bulk_tensor(self, dst, didx, tmap, coords, bars, i):
        coords = tuple(int(c) for c in coords)
        align = 1024 if tmap.swizzle else 128
        if self.block.address(dst, (int(didx),)) % align:
            raise _OutOfBounds(f"cp_async_bulk_tensor: {dst.name}[{int(didx)}] is not on a {align}-byte boundary of "
                               f"shared memory" + (f" (the {tmap.swizzle}-byte swizzle repeats every 1024 bytes)"
                                                   if tmap.swizzle else ""))
        d = dst.span((int(didx),), int(np.prod(tmap.box)))
        image = tmap.box_image(coords)   # read at the issue: the copy engine reads global memory as it goes
        self._copy_on_barrier("cp_async_bulk_tensor", bars, i, d, image, dst, int(didx), tmap.box_bytes)

    # -- bulk reductions: the source is read at the issue (as the issuing thread, for the race detector) and must not
    # change until a wait retires the group (the hardware may read it any time until then); the adds land at
    # cp_async_bulk_wait (or the thread's exit), not at cp_async_bulk_wait_read, which promises only the reads
    def cp_reduce_async_bulk_add(self, dst, didx, src, sidx, nbytes):
        nbytes = int(nbytes)
        if nbytes <= 0 or nbytes % BULK_ALIGN:
            raise _OutOfBounds(f"cp_reduce_async_bulk_add: {nbytes} bytes is not a positive multiple of {BULK_ALIGN}")
        count = nbytes // 4
        d = dst.span((int(didx),), count)
        source = src.span((int(sidx),), count)
        self._bulk_aligned("cp_reduce_async_bulk_add", src, int(sidx), dst, int(didx), d)
        src.track_span((int(sidx),), count, _READ)
        self.bulk_pending.append((d, src, int(sidx), count, source.copy()))

    def bulk_commit(self):
        self.bulk_groups.append(self.bulk_pending)
        self.bulk_pending = []

    def bulk_wait_read(self, n):
        while len(self.bulk_groups) > n:
            group = self.bulk_groups.pop(0)
            for _, src, sidx, count, read in group:
                if not np.array_equal(src.span((sidx,), count), read, equal_nan=True):
                    raise _OutOfBounds(f"cp_reduce_async_bulk_add: its source {src.name}[{sidx}:{sidx + count}] was "
                                       "written before a cp_async_bulk_wait_read or cp_async_bulk_wait retired it")
            self.bulk_read.append(group)

    def bulk_wait(self, n):
        self.bulk_wait_read(n)
        self._bulk_land()

    def _bulk_land(self):
        for group in self.bulk_read:
            for d, _, _, _, read in group:
                d += read
        self.bulk_read = []

    def finish(self):
        self.cp_commit()
        self.cp_wait(0)
        self._bulk_land()
        if self.bulk_pending or self.bulk_groups:
            raise SimulationError(f"{_describe(self)} ended with bulk reductions in flight "
                                  f"({'uncommitted' if self.bulk_pending else 'not waited for'}): call "
                                  "cp_async_bulk_commit() and cp_async_bulk_wait(0) before exiting")
        if self.wg_pending or self.wg_groups:
            raise SimulationError(f"{_describe(self)} ended with wgmma operations in flight "
                                  f"({'uncommitted' if self.wg_pending else 'not waited for'}): call wgmma_commit() "
                                  "and wgmma_wait(0) before reading the accumulators or exiting")


class _CopyEngine:
    """The accessor of one bulk copy's landing, for the race detector: a thread of its own (its clock key unique,
    its one epoch 0), which has seen what the issuing thread had when it issued the copy; two copies in flight are
    unordered, as PTX's asynchronous copies are."""

    __slots__ = ("idx", "linear", "vc", "epoch", "at")
    issued = itertools.count()

    def __init__(self, issuer: Thread, at, op: str) -> None:
        self.idx, self.at, self.epoch = issuer.idx, at, 0
        self.linear = (op, next(_CopyEngine.issued))
        self.vc = dict(issuer.vc)
        self.vc[issuer.linear] = issuer.epoch

    @property
    def landing(self) -> str:
        return f"the {self.linear[0]} {_describe(self)} issued at {_source_line(self.at)} lands on it"


class _MBarrier:
    """An mbarrier (PTX): its current phase waits for `pending` more arrivals and `tx` more bytes (negative while
    copies land before mbarrier_arrive_expect_tx announced them); when both are zero the phase completes: its
    copies land, its parity flips and the next phase waits for `count` arrivals. `clock` gathers the vector clocks
    of the phase's arrivals and copies; `done`, of every completed phase (a waiter is ordered after them)."""

    __slots__ = ("count", "pending", "tx", "phase", "clock", "done", "copies", "name")

    def __init__(self, count: int, name: str) -> None:
        self.count, self.pending, self.tx, self.phase, self.name = count, count, 0, 0, name
        self.clock: dict = {}
        self.done: dict = {}
        self.copies: list = []

    def add_tx(self, nbytes: int) -> None:
        self.tx += nbytes
        if abs(self.tx) > MAX_COUNT:
            raise _OutOfBounds(f"mbarrier {self.name}: its phase's transaction count {self.tx} is out of PTX's range "
                               f"+-{MAX_COUNT}")

    def complete_if_done(self) -> None:
        if self.pending or self.tx:
            return
        for d, s, dst, didx, engine in self.copies:
            d[...] = s.view(d.dtype)
            if isinstance(dst, SharedArray):
                dst.track_span((didx,), d.size, _WRITE, engine, engine.at)
        _advance(self.done, self.clock)
        self.phase ^= 1
        self.pending, self.tx, self.clock, self.copies = self.count, 0, {}, []

    def state(self) -> str:
        n = len(self.copies)
        copies = f", {n} bulk cop{'y' if n == 1 else 'ies'} not landed" if n else ""
        return (f"mbarrier {self.name}: its phase of parity {self.phase} waits for {self.pending} of {self.count} "
                f"arrivals and {self.tx} bytes{copies}")


# -- wgmma ----------------------------------------------------------------------------------------------
SWIZZLE_MODES = {0: 0, 128: 1, 64: 2, 32: 3}  # swizzle bytes -> the descriptor's mode bits 62-63


def encode_wgmma_desc(addr: int, lbo: int, sbo: int, swizzle: int) -> int:
    """The 64-bit shared-memory matrix descriptor of the PTX ISA ("Matrix Descriptor Format"): bits 0-13 the start
    address >> 4, 16-29 the leading dimension byte offset >> 4, 32-45 the stride dimension byte offset >> 4,
    49-51 the base offset (0), 62-63 the swizzle mode (0 none, 1 128B, 2 64B, 3 32B)."""
    return (((addr & 0x3FFFF) >> 4) | (((lbo >> 4) & 0x3FFF) << 16) | (((sbo >> 4) & 0x3FFF) << 32)
            | (SWIZZLE_MODES[swizzle] << 62))


def decode_wgmma_desc(desc: int) -> dict:
    d = int(desc) & (2 ** 64 - 1)
    mode = (d >> 62) & 3
    return dict(start=(d & 0x3FFF) << 4, lbo=((d >> 16) & 0x3FFF) << 4, sbo=((d >> 32) & 0x3FFF) << 4,
                base_offset=(d >> 49) & 7, swizzle={0: 0, 1: 128, 2: 64, 3: 32}[mode])


def wgmma_operand_addresses(desc: int, rows: int, k: int = 16, elem_bytes: int = 2) -> np.ndarray:
    """The shared address of element (r, k) of a K-major wgmma operand (rows x k) that `desc` describes: the PTX
    ISA's canonical K-major layouts in bytes, T = 16 bytes of elements per core-matrix row:
      no swizzle:    ((8, m), (T, 2k)) : ((16, SBO), (1, LBO))  -- 8x16-byte core matrices, LBO apart along K
      W-byte swizzle: ((8, m), (T, 2k)) : ((W, SBO), (1, T))    -- rows W bytes apart, then Swizzle<log2(W/16), 4, 3>
    on the address: bits [4, 4 + log2(W/16)) ^= bits [7, 7 + log2(W/16)) (CUTLASS cute/swizzle.hpp)."""
    f = _simulated_desc(desc)
    r = np.arange(rows)[:, None]
    kb = np.arange(k)[None, :] * elem_bytes
    w = f["swizzle"]
    if w == 0:
        return f["start"] + (r // 8) * f["sbo"] + (r % 8) * 16 + (kb // 16) * f["lbo"] + kb % 16
    return _swizzled(f["start"] + (r // 8) * f["sbo"] + (r % 8) * w + (kb // w) * f["lbo"] + kb % w, w)


def _simulated_desc(desc: int) -> dict:
    f = decode_wgmma_desc(desc)
    if f["base_offset"]:
        raise SimulationError("wgmma: descriptors with a nonzero base offset are not simulated")
    return f


def _swizzled(addr: np.ndarray, w: int) -> np.ndarray:
    """Swizzle<log2(w/16), 4, 3> on shared addresses: bits [4, 4 + log2(w/16)) ^= bits [7, 7 + log2(w/16))."""
    return addr ^ (((addr >> 7) & (w // 16 - 1)) << 4)


def wgmma_mn_operand_addresses(desc: int, rows: int, k: int = 16, elem_bytes: int = 2) -> np.ndarray:
    """wgmma_operand_addresses of an MN-major operand (imm-trans-a/b = 1: element (r, k) with r contiguous), the PTX
    ISA's canonical MN-major layouts in bytes (CUTLASS make_gmma_desc<Major::MN>), T = 16 bytes of elements:
      no swizzle:     ((T, m), (8, k)) : ((1, SBO), (16, LBO))  -- 8 K-rows of 16 bytes, LBO apart along K
      W-byte swizzle: ((W, m), (8, k)) : ((1, LBO), (W, SBO))   -- K-rows W bytes apart, a W-byte run of r then
    the next LBO on, 8 K-rows then SBO on; the same Swizzle<log2(W/16), 4, 3> on the address as K-major."""
    f = _simulated_desc(desc)
    rb = np.arange(rows)[:, None] * elem_bytes
    kk = np.arange(k)[None, :]
    w = f["swizzle"]
    if w == 0:
        return f["start"] + (rb // 16) * f["sbo"] + rb % 16 + (kk % 8) * 16 + (kk // 8) * f["lbo"]
    return _swizzled(f["start"] + (rb // w) * f["lbo"] + rb % w + (kk % 8) * w + (kk // 8) * f["sbo"], w)


class WgmmaOp:
    """One wgmma.mma_async.m64nNk16.f32.bf16.bf16 of a warpgroup: D[64, N] (= or +=) A[64, 16] @ B[N, 16]^T."""

    def __init__(self, block, accs, desc_a, desc_b, n, scale_d, a_frags=None, b_mn=0, a_mn=0) -> None:
        self.block, self.accs, self.desc_a, self.desc_b, self.n, self.scale_d = (block, accs, desc_a, desc_b, n,
                                                                                  scale_d)
        self.b_addresses = wgmma_mn_operand_addresses if b_mn else wgmma_operand_addresses   # imm-trans-b
        self.a_addresses = wgmma_mn_operand_addresses if a_mn else wgmma_operand_addresses   # imm-trans-a
        # wgmma_bf16_rs: each thread's A fragment and its values at issue (PTX: they must not change until the
        # operation is retired); None when A is in shared memory
        self.a_frags = a_frags
        self.prod = None
        self.reads = [self.b_addresses(desc_b, n)] + ([] if a_frags is not None else [self.a_addresses(desc_a, 64)])
        self.retirers: list = []   # (thread, its epoch) of each wgmma_wait that retired it
        block.wgmma_issued(self)   # Block.check_not_wgmma_operand guards the operands from writes

    def product(self) -> np.ndarray:
        """A[64, 16] @ B[N, 16]^T from shared memory as it is when the first thread's wgmma_wait retires the
        operation (the hardware may read it any time until then)."""
        if self.prod is None:
            if self.a_frags is not None:
                a = wgmma_a_from_registers([at_issue for _, at_issue in self.a_frags])
            else:
                a = self.block.read_u16(self.reads[1]).view(ml_dtypes.bfloat16)
            b = self.block.read_u16(self.reads[0]).view(ml_dtypes.bfloat16)
            self.prod = a.astype(np.float64) @ b.astype(np.float64).T
        return self.prod

    def retire(self, thread_in_group: int) -> None:
        """Write one thread's accumulator registers (at that thread's wgmma_wait)."""
        if self.a_frags is not None:
            frag, at_issue = self.a_frags[thread_in_group]
            if not np.array_equal(np.asarray(frag.data, dtype=np.float64), at_issue, equal_nan=True):
                raise _OutOfBounds(f"wgmma_bf16_rs: A fragment {frag.name!r} changed before wgmma_wait retired the "
                                   "operation that reads it (PTX: its registers must not be written until then)")
        rows, cols = wgmma_fragment_index(self.n)
        flat = self.accs[thread_in_group].data.reshape(-1)
        base = flat.astype(np.float64) if self.scale_d else 0.0
        flat[...] = (base + self.product()[rows[thread_in_group], cols[thread_in_group]]).astype(np.float32)


def wgmma_a_from_registers(frags: list) -> np.ndarray:
    """A[64, 16] (float64) of a wgmma with A in registers from the 128 threads' 8 fragment values (PTX ISA, the
    register fragment layout of matrix A for .m64nNk16 with 16-bit types: warp w holds rows 16w..16w+15 as the A
    fragment of mma.m16n8k16, g = lane // 4, c = lane % 4: a[i] is row g + 8 * (i // 2 % 2), column 2c + i % 2 +
    8 * (i // 4))."""
    a = np.empty((64, 16))
    i = np.arange(8)
    for t, frag in enumerate(frags):
        lane = t % 32
        a[16 * (t // 32) + lane // 4 + 8 * (i // 2 % 2), 2 * (lane % 4) + i % 2 + 8 * (i // 4)] = frag.reshape(-1)
    return a


@functools.lru_cache(maxsize=None)
def wgmma_fragment_index(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols): where accumulator register i of warpgroup thread t sits in D[64, N] (PTX ISA, "WGMMA .m64nNk16
    register fragment layout for accumulator matrix D"): warp w = t // 32 owns rows 16w..16w+15; within it, as
    mma.m16n8: g = lane // 4, c = lane % 4; d[4j + q] is row g + 8 * (q // 2), column 8j + 2c + q % 2."""
    t = np.arange(128)[:, None]
    i = np.arange(n // 2)[None, :]
    lane = t % 32
    rows = 16 * (t // 32) + lane // 4 + 8 * ((i % 4) // 2)
    cols = 8 * (i // 4) + 2 * (lane % 4) + i % 2
    return rows, cols


def _where(fn_name, thread, exc_tb=None, gen=None):
    """(file, line) of a thread's current position, from a traceback or a suspended generator."""
    frames = []
    if exc_tb is not None:
        tb = exc_tb
        while tb is not None:
            frames.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
            tb = tb.tb_next
    while gen is not None:
        fr = gen.gi_frame
        if fr is None:
            break
        frames.append((fr.f_code.co_filename, fr.f_lineno))
        gen = getattr(gen, "gi_yieldfrom", None)
        if gen is not None and not hasattr(gen, "gi_frame"):
            gen = None
    for filename, lineno in reversed(frames):
        if filename in LINE_MAPS:
            pyfile, lines = LINE_MAPS[filename]
            return pyfile, lines[min(max(lineno - 1, 0), len(lines) - 1)]
    return "<kernel>", 0


def _describe(th) -> str:
    """The thread (or a bulk copy's engine: its issuing thread's) as messages name it."""
    tx, ty, tz, bx, by, bz = th.idx[:6]
    return f"block ({bx}, {by}, {bz}) thread ({tx}, {ty}, {tz})"


def run(name: str, fn, has_yield: bool, grid, block, args, smem_bytes: int = 0, grid_sync: bool = False,
        named_barriers: bool = False) -> None:
    """Run every block of the grid, one after another, each block's threads interleaved at barriers; a kernel with
    grid_sync() runs all its blocks side by side, each up to the next grid_sync, as the GPU keeps them resident."""
    gdx, gdy, gdz = grid
    bdx, bdy, bdz = block
    blocks = []
    with np.errstate(all="ignore"):
        for bz, by, bx in itertools.product(range(gdz), range(gdy), range(gdx)):
            blk = Block(smem_bytes, named_barriers)
            threads = []
            for tz, ty, tx in itertools.product(range(bdz), range(bdy), range(bdx)):
                linear = tx + bdx * (ty + bdy * tz)
                idx = tuple(np.int32(v) for v in (tx, ty, tz, bx, by, bz, bdx, bdy, bdz, gdx, gdy, gdz,
                                                   tx // 32, tx % 32))
                threads.append(Thread(idx, blk, linear, step_limit))
            if not has_yield:
                for th in threads:
                    blk.current = th
                    try:
                        fn(th, *args)
                        th.finish()
                    except Exception as exc:
                        _raise(name, th, exc)
                _copies_landed(name, blk)
            elif grid_sync:
                blocks.append(_block_steps(name, fn, threads, args))
            else:
                for _ in _block_steps(name, fn, threads, args):
                    raise SimulationError(f"{name}: grid_sync() outside a grid_sync kernel")
        _run_grid(name, blocks)


def _run_grid(name, blocks) -> None:
    """Blocks (generators of _block_steps) in rounds: each runs until all its threads wait at grid_sync(), then
    the next round resumes them all. Every block must reach every grid_sync (an exited block never arrives)."""
    while blocks:
        parked, exited = [], 0
        for b in blocks:
            try:
                next(b)
                parked.append(b)
            except StopIteration:
                exited += 1
        if parked and exited:
            raise SimulationError(f"{name}: deadlock: {len(parked)} blocks wait at grid_sync() for {exited} blocks "
                                  "that have exited (every block of the grid must reach each grid_sync)")
        blocks = parked


def _raise(name, th, exc, gen=None):
    if isinstance(exc, SimulationError):
        raise exc
    pyfile, line = _where(name, th, exc.__traceback__, gen)
    checked = isinstance(exc, _OutOfBounds)  # one of the simulator's own checks: its message says it all
    what = str(exc) if checked else f"{type(exc).__name__}: {exc}"
    error = exc.error if checked else SimulationError
    raise error(f"{name}: {_describe(th)} at {pyfile}:{line}: {what}") from (None if checked else exc)


def _finish(name, th) -> None:
    """A thread exits: its cp.async copies land (recorded as its writes)."""
    try:
        th.finish()
    except _OutOfBounds as exc:
        _raise(name, th, exc)


def _block_steps(name, fn, threads, args):
    """Run one block's threads; yields (parks) whenever all of them wait at grid_sync(), resuming them after."""
    gens = {}
    for th in threads:
        gens[th.linear] = fn(th, *args)
    waiting = {}   # linear -> request
    send = {t.linear: None for t in threads}
    live = {t.linear: t for t in threads}
    runnable = list(live)
    at_barrier: set = set()   # threads counted at a named barrier, waiting for it to complete
    while live:
        for lin in runnable:
            th = live[lin]
            th.block.current = th
            try:
                req = gens[lin].send(send[lin])
                waiting[lin] = req
            except StopIteration:
                _finish(name, th)
                del live[lin]
            except Exception as exc:
                _raise(name, th, exc, gens[lin])
        runnable = []
        if not live:
            break
        # warp operations: resolved when every live lane of the warp waits on one
        warps: dict[int, list[int]] = {}
        for lin in live:
            warps.setdefault(lin // 32, []).append(lin)
        for w, lanes in warps.items():
            reqs = [waiting[lin] for lin in lanes]
            if all(r[0] == "wgmma" for r in reqs):
                continue  # a warpgroup operation: resolved below when all four warps are there
            if all(r[0] not in ("sync", "grid_sync", "bar", "mbar") for r in reqs):
                kinds = {r[0] for r in reqs}
                if len(kinds) != 1 or len({_position(gens[lin]) for lin in lanes}) != 1:
                    _deadlock(name, live, gens, waiting, f"the lanes of warp {w} wait at different warp operations")
                exited = [lin for lin in range(w * 32, w * 32 + 32) if lin in send and lin not in live]
                if exited:
                    _deadlock(name, live, gens, waiting, f"a warp operation in warp {w} while its lanes "
                              f"{[x % 32 for x in exited]} have exited (warp operations need all 32 lanes)")
                results = _resolve_warp_op(name, live, gens, lanes, reqs)
                for lin, r in zip(lanes, results):
                    send[lin] = r
                    del waiting[lin]
                    runnable.append(lin)
        runnable += _warpgroup_ops(name, threads, live, gens, waiting, send)
        runnable += _named_barriers(name, threads, live, gens, waiting, send, at_barrier)
        runnable += _mbarrier_waits(threads[0].block, live, waiting, send)
        if runnable:
            continue
        kinds = {waiting[lin][0] for lin in live}
        if kinds == {"sync"} or kinds == {"grid_sync"}:
            if len({_position(gens[lin]) for lin in live}) > 1:
                what = "syncthreads()" if kinds == {"sync"} else "grid_sync()"
                _deadlock(name, live, gens, waiting, f"threads wait at different {what} (divergent barrier)")
            if kinds == {"grid_sync"}:
                yield
            threads[0].block.barrier(threads)
            for lin in live:
                send[lin] = None
                del waiting[lin]
            runnable = list(live)
            continue
        counts = [f"named barrier {bar}: {st['threads']} of {st['count']} threads arrived"
                  for bar, st in sorted(threads[0].block.bars.items())]
        awaited = {id(req[1]): req[1] for req in waiting.values() if req[0] == "mbar"}
        counts += [bar.state() for bar in awaited.values()]
        _deadlock(name, live, gens, waiting, "threads wait on a barrier that others never reach"
                  + (f" ({'; '.join(counts)})" if counts else ""))
    _copies_landed(name, threads[0].block)


def _named_barriers(name, threads, live, gens, waiting, send, at_barrier) -> list:
    """Count the warps newly waiting at bar_sync / bar_arrive (PTX counts a warp's arrival as 32 threads, its live
    lanes arriving together); complete each named barrier whose count is reached (its bar_sync threads resume,
    ordered after everything its threads did before arriving). bar_arrive threads resume at once. Returns the
    threads to resume."""
    block = threads[0].block
    if not block.partial:   # the kernel has no bar_sync / bar_arrive (frontend.Checked.uses_named_barriers)
        return []
    lanes_of: dict[int, list[int]] = {}
    for lin in sorted(live):
        lanes_of.setdefault(lin // 32, []).append(lin)
    resumed: list = []
    released: set = set()   # waiters of a barrier completed in this pass: their requests are answered, not new
    for w, lanes in lanes_of.items():
        arriving = [lin for lin in lanes if waiting.get(lin, ("",))[0] == "bar" and lin not in at_barrier
                    and lin not in released]
        if not arriving:
            continue
        if len(arriving) < len(lanes) or len({(waiting[lin], _position(gens[lin])) for lin in arriving}) > 1:
            if any(lin not in waiting for lin in lanes):
                continue   # some lanes were resumed this round and may still come
            _deadlock(name, live, gens, waiting, f"the live lanes of warp {w} wait at different barriers or "
                      "operations (bar.sync and bar.arrive are .aligned: a warp's lanes reach them together)")
        _, bar, count, arrive = waiting[arriving[0]]
        state = block.bars.setdefault(bar, {"count": count, "threads": 0, "arrived": [], "waiters": []})
        why = _named_barrier_error(bar, count, state["count"], 32 * math.ceil(len(threads) / 32))
        if why:
            pyfile, line = _where(name, live[arriving[0]], None, gens[arriving[0]])
            raise SimulationError(f"{name}: {_describe(live[arriving[0]])} at {pyfile}:{line}: {why}")
        state["threads"] += 32
        for lin in arriving:
            th = live[lin]
            state["arrived"].append((lin, dict(th.vc), th.epoch))
            th.epoch += 1
        if arrive:
            resumed += arriving
        else:
            state["waiters"] += arriving
            at_barrier.update(arriving)
        if state["threads"] == count:
            waiters = _complete(block, bar, state, live, at_barrier)
            released.update(waiters)
            resumed += waiters
    for lin in resumed:
        send[lin] = None
        del waiting[lin]
    return resumed


def _mbarrier_waits(block, live, waiting, send) -> list:
    """Resume the threads waiting on an mbarrier phase that has completed (mbarrier_wait(bars, i, parity) returns
    once the barrier's current phase has the other parity), ordered after every completed phase's arrivals."""
    if not block.mbars:
        return []
    resumed = [lin for lin in live if waiting.get(lin, ("",))[0] == "mbar" and waiting[lin][1].phase != waiting[lin][2]]
    for lin in resumed:
        _advance(live[lin].vc, waiting[lin][1].done)
        send[lin] = None
        del waiting[lin]
    return resumed


def _copies_landed(name: str, block) -> None:
    """The block has exited: a bulk copy whose phase never completed would write shared memory after it."""
    for bar in block.mbars.values():
        if bar.copies:
            engine = bar.copies[0][4]
            raise SimulationError(f"{name}: the block exited with cp_async_bulk copies in flight (the first issued by "
                                  f"{_describe(engine)} at {_source_line(engine.at)}; {bar.state()}): a phase "
                                  "lands its copies when its arrivals and announced bytes are all in")


def _named_barrier_error(bar: int, count: int, expected: int, block_threads: int) -> str | None:
    if not 1 <= bar < NAMED_BARRIERS:
        return f"bar_sync/bar_arrive: barrier id {bar} is not in 1..{NAMED_BARRIERS - 1} (0 is syncthreads()'s)"
    if count % 32 or not 0 < count <= block_threads:
        return (f"bar_sync/bar_arrive on barrier {bar}: {count} threads is not a multiple of 32 up to the block's "
                f"{block_threads} (its warps times 32)")
    if count != expected:
        return f"bar_sync/bar_arrive on barrier {bar}: {count} threads here, {expected} by a warp before"
    return None


def _complete(block, bar: int, state: dict, live: dict, at_barrier: set) -> list:
    """A named barrier's count is reached: its waiters see everything its threads did before arriving."""
    arrived: dict = {}
    for lin, clock, epoch in state["arrived"]:
        _join(arrived, lin, clock, epoch)
    for lin in state["waiters"]:
        _advance(live[lin].vc, arrived)
        at_barrier.discard(lin)
    del block.bars[bar]
    return list(state["waiters"])


def _advance(clock: dict, other: dict) -> None:
    """clock = the element-wise latest of clock and other (vector clocks: thread -> epoch)."""
    for t, e in other.items():
        if clock.get(t, -1) < e:
            clock[t] = e


def _join(clock: dict, linear, seen: dict, epoch: int) -> None:
    """clock takes in what a thread (`linear`, its clock `seen`, its current `epoch`) has done so far."""
    _advance(clock, seen)
    _advance(clock, {linear: epoch})


def _warpgroup_ops(name, threads, live, gens, waiting, send):
    """Issue the wgmma of every warpgroup (128 consecutive threads) whose threads all wait at it."""
    groups: dict[int, list[int]] = {}
    for lin in live:
        if waiting.get(lin, ("",))[0] == "wgmma":
            groups.setdefault(lin // 128, []).append(lin)
    by_linear = {th.linear: th for th in threads}
    resumed = []
    for g, lins in groups.items():
        members = [lin for lin in range(g * 128, g * 128 + 128) if lin in by_linear]
        if len(members) < 128:
            _deadlock(name, live, gens, waiting, f"wgmma_bf16 needs a full warpgroup of 128 threads; warpgroup {g} "
                                                 f"has {len(members)} (launch blocks of a multiple of 128 threads)")
        if len(lins) < 128:
            if any(lin not in live for lin in members):
                _deadlock(name, live, gens, waiting, f"wgmma_bf16 in warpgroup {g} while some of its threads have "
                                                     "exited")
            continue  # some warps have not arrived yet
        if len({_position(gens[lin]) for lin in lins}) != 1:
            _deadlock(name, live, gens, waiting, f"the threads of warpgroup {g} wait at different wgmma_bf16 calls")
        reqs = [waiting[lin][1] for lin in members]
        acc0, da, db, n, scale, b_mn, a_mn = reqs[0]
        registers = isinstance(da, SimArray)   # wgmma_bf16_rs: A from each thread's fragment, read at issue
        da = 0 if registers else da
        for lin, (acc, a, b, nn, sc, _, _) in zip(members, reqs):
            th = by_linear[lin]
            a = 0 if registers else a
            if (int(a), int(b), nn, sc) != (int(da), int(db), n, scale):
                raise SimulationError(f"{name}: {_describe(th)}: wgmma_bf16 operands differ across warpgroup {g} "
                                      f"(descriptors {int(a):#x}, {int(b):#x}, scale_d {sc} here vs {int(da):#x}, "
                                      f"{int(db):#x}, {scale} in its first thread); they must be the same")
            if not th.wg_fenced:
                pyfile, line = _where(name, th, None, gens[lin])
                raise SimulationError(f"{name}: {_describe(th)} at {pyfile}:{line}: wgmma_bf16 without a "
                                      "wgmma_fence() before it (needed before the first wgmma and after wgmma_wait)")
        a_frags = [(r[1], np.array(r[1].data, dtype=np.float64)) for r in reqs] if registers else None
        op = WgmmaOp(by_linear[members[0]].block, [r[0] for r in reqs], int(da), int(db), n, scale, a_frags, b_mn,
                     a_mn)
        for lin in members:
            by_linear[lin].wg_pending.append(op)
            send[lin] = None
            del waiting[lin]
            resumed.append(lin)
    return resumed


def _position(gen):
    while getattr(gen, "gi_yieldfrom", None) is not None and hasattr(gen.gi_yieldfrom, "gi_frame"):
        gen = gen.gi_yieldfrom
    return gen.gi_frame.f_code.co_filename, gen.gi_frame.f_lineno


def _deadlock(name, live, gens, waiting, why):
    where = []
    for lin in list(live)[:64]:
        th = live[lin]
        pyfile, line = _where(name, th, None, gens[lin])
        where.append(f"{_describe(th)} waits at {pyfile}:{line} ({waiting.get(lin, ('?',))[0]})")
    raise SimulationError(f"{name}: deadlock: {why}:\n  " + "\n  ".join(where[:8]))


def _resolve_warp_op(name, live, gens, lanes, reqs):
    """The results of one warp operation for each lane (lanes: linear thread indices); an ldmatrix records each
    lane's shared-memory reads as that lane's, at its line."""
    accessors = [(live[lin], _position(gens[lin])) for lin in lanes] if reqs[0][0] == "ldmatrix" else None
    try:
        return _warp_op(reqs[0][0], [lin % 32 for lin in lanes], reqs, accessors)
    except _Race as exc:
        _raise(name, exc.thread, exc, gens[exc.thread.linear])


def _warp_op(kind, lanes, reqs, accessors=None):
    if kind in ("shfl_xor", "shfl_down", "shfl_up", "shfl_idx", "ballot"):
        vals = {lane: r[1] for lane, r in zip(lanes, reqs)}
        if kind == "ballot":
            mask = sum(1 << lane for lane, v in vals.items() if v)
            return [np.uint32(mask)] * len(lanes)
        out = []
        for lane, r in zip(lanes, reqs):
            k = r[2]
            src = {"shfl_xor": lane ^ k, "shfl_down": lane + k, "shfl_up": lane - k, "shfl_idx": k % 32}[kind]
            out.append(vals.get(src, r[1]) if 0 <= src < 32 else r[1])
        return out
    if kind == "ldmatrix":
        return _ldmatrix(lanes, [r[1] for r in reqs], accessors)
    if kind == "mma":
        return _mma(lanes, [r[1] for r in reqs])
    raise SimulationError(f"unknown warp operation {kind}")


def _ldmatrix(lanes, reqs, accessors=None):
    """ldmatrix.sync.aligned.m8n8.x{2,4}[.trans].b16: lanes 8m..8m+7 give the row addresses of matrix m. On a 32-bit
    shared array (no .trans) a row's 16 bytes are 4 elements and each lane gets element (g, t) of each matrix: the
    same bits as on the GPU, where a 32-bit register holds the two 16-bit halves of one element."""
    regs, trans = reqs[0][3], reqs[0][4]
    if len(lanes) != 32:
        raise SimulationError("ldmatrix needs a full warp of 32 lanes")
    width = 16 // reqs[0][1].data.dtype.itemsize
    rows = {}
    for k, (lane, (frag, smem, idx, _, _)) in enumerate(zip(lanes, reqs)):
        if lane < 8 * regs:
            try:
                rows[lane] = np.array(smem.span(idx, width))
            except _OutOfBounds as exc:
                raise SimulationError(f"ldmatrix: lane {lane}: {exc}") from None
            if accessors is not None and isinstance(smem, SharedArray):
                smem.track_span(idx, width, _READ, *accessors[k])
    mats = [np.stack([rows[8 * m + r] for r in range(8)]) for m in range(regs)]
    for lane, (frag, *_rest) in zip(lanes, reqs):
        g, t = lane // 4, lane % 4
        flat = frag.data.reshape(-1)
        for m in range(regs):
            if width == 4:
                flat[m] = mats[m][g, t]
                continue
            for j in range(2):
                flat[2 * m + j] = mats[m][2 * t + j, g] if trans else mats[m][g, 2 * t + j]
    return [None] * len(lanes)


def _tf32(v):
    """float32 values as the tensor cores read TF32 operands: the low 13 of the 23 mantissa bits dropped."""
    return (np.asarray(v, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)


def _mma(lanes, reqs):
    """mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16} (16-bit fragments) or m16n8k8.row.col.f32.tf32 (f32
    fragments): D = A @ B + C with the PTX fragment layouts."""
    if len(lanes) != 32:
        raise SimulationError("mma needs a full warp of 32 lanes")
    tf32 = reqs[0][1].data.dtype == np.float32
    K = 8 if tf32 else 16
    A = np.zeros((16, K))
    Bm = np.zeros((K, 8))
    C = np.zeros((16, 8))
    for lane, (c, a, b) in zip(lanes, reqs):
        g, t = lane // 4, lane % 4
        av = _tf32(a.data.reshape(-1)) if tf32 else a.data.reshape(-1).astype(np.float64)
        bv = _tf32(b.data.reshape(-1)) if tf32 else b.data.reshape(-1).astype(np.float64)
        cv = c.data.reshape(-1)
        if tf32:   # a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); b0 (t, g), b1 (t+4, g)
            for i in range(4):
                A[g + 8 * (i % 2), t + 4 * (i // 2)] = av[i]
            for i in range(2):
                Bm[t + 4 * i, g] = bv[i]
        else:
            for i in range(8):
                A[g + 8 * ((i // 2) % 2), 2 * t + (i & 1) + 8 * (i // 4)] = av[i]
            for i in range(4):
                Bm[2 * t + (i & 1) + 8 * (i // 2), g] = bv[i]
        for i in range(4):
            C[g + 8 * (i // 2), 2 * t + (i & 1)] = cv[i]
    D = (A @ Bm + C).astype(np.float32)
    for lane, (c, a, b) in zip(lanes, reqs):
        g, t = lane // 4, lane % 4
        cv = c.data.reshape(-1)
        for i in range(4):
            cv[i] = D[g + 8 * (i // 2), 2 * t + (i & 1)]
    return [None] * len(lanes)
