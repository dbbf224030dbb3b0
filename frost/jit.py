"""Whole-step CUDA-graph capture: `frost.jit(step)` runs a training step eagerly twice, then captures and replays it.

Python runs the step once more while CUDA records every kernel into a graph; later calls copy their
inputs into static buffers and replay the graph, so the host does almost nothing per step. Memory used
inside the graph comes from a private CuPy pool kept alive with the graph, so nothing outside can
reuse (and clobber) it between replays. On the CPU, jit simply calls the function.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import warnings
from typing import Any, Callable

from frost.autograd import forget_zero_grads
from frost.backend import cuda
from frost.optim import flat
from frost.tensor import Tensor, set_host_sync_hook


class HostSyncInCaptureError(RuntimeError):
    """A captured step asked the host for a value (.item(), .numpy(), ...), which a CUDA graph cannot do."""


def _flatten(obj, out: list) -> None:
    if isinstance(obj, Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            _flatten(o, out)
    elif isinstance(obj, dict):
        for o in obj.values():
            _flatten(o, out)


def _signature(args, kwargs) -> tuple:
    """Cache key: shapes/dtypes/devices of tensor arguments, values of everything else."""
    def sig(o):
        if isinstance(o, Tensor):
            return ("T", o.shape, o.dtype.name, str(o.device))
        if isinstance(o, (list, tuple)):
            return tuple(sig(x) for x in o)
        if isinstance(o, dict):
            return tuple((k, sig(v)) for k, v in sorted(o.items()))
        return ("V", o if isinstance(o, (int, float, str, bool, type(None))) else id(o))
    return sig(args), sig(kwargs)


def _replace_tensors(obj, fn):
    if isinstance(obj, Tensor):
        return fn(obj)
    if isinstance(obj, list):
        return [_replace_tensors(o, fn) for o in obj]
    if isinstance(obj, tuple):
        return tuple(_replace_tensors(o, fn) for o in obj)
    if isinstance(obj, dict):
        return {k: _replace_tensors(v, fn) for k, v in obj.items()}
    return obj


class _Captured:
    """One captured graph: its static inputs, outputs, private memory pool and the graph itself."""

    def __init__(self) -> None:
        self.eager_calls = 0
        self.asked: frozenset = frozenset()  # kernel choices its eager calls asked and left undecided
        self.graph = None
        self.static_inputs: list[Tensor] = []
        self.output: Any = None
        self.pool = None
        self.stream = None
        self.device = None  # the device current at the capture, whose graph stream captured it


class Jitted:
    """A step function that is captured into a CUDA graph after `warmup` eager calls (per input signature)."""

    def __init__(self, fn: Callable, warmup: int = 2) -> None:
        self.fn = fn
        self.warmup = warmup
        self.warned = False   # about a call without tensors (run eagerly)
        self.captures: dict = {}
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        tensors: list[Tensor] = []
        _flatten((args, kwargs), tensors)
        if not tensors and not self.warned:
            # a step that reads its batch from a closure is run eagerly every time: the capture's static inputs are
            # the tensors passed in, so nothing would tell a replay that the batch changed
            self.warned = True
            warnings.warn(f"frost.jit: {getattr(self.fn, '__name__', 'the step')}() was called without a tensor "
                          f"argument, so it runs eagerly, never captured; pass the batch (or any CUDA tensor it "
                          f"reads) as an argument", stacklevel=2)
        if not tensors or any(t.device.type != "cuda" for t in tensors):
            return self.fn(*args, **kwargs)
        entry = self.captures.setdefault(_signature(args, kwargs), _Captured())
        if entry.graph is None:
            if entry.eager_calls < self.warmup or (entry.eager_calls == self.warmup and entry.asked & _pending()):
                entry.eager_calls += 1
                before = _pending()
                with _warm_up():
                    out = self.fn(*args, **kwargs)
                entry.asked |= _pending() - before   # kernel choices this step asked and left for a later call
                return out
            self._capture(entry, args, kwargs)
        _sync_optimizer_hyperparameters()
        current = cuda.current_stream()
        for static, t in zip(entry.static_inputs, tensors):
            static.data[...] = t.data  # an asynchronous device-to-device copy on the current stream
        if cuda.cupy().cuda.runtime.getDevice() == entry.device:
            # replayed on the caller's stream, in order after the copies and before later work: no event between
            # streams on a step's path (the graph stream only captures)
            entry.graph.launch(current)  # (a _NodePriorityGraph or CuPy's graph)
        else:  # called with another device current: the capture's device replays it, ordered by events
            entry.stream.wait_event(current.record())
            entry.graph.launch(entry.stream)
            current.wait_event(entry.stream.record())
        return entry.output

    def _capture(self, entry: _Captured, args, kwargs) -> None:
        cp = cuda.cupy()
        entry.pool = cp.cuda.MemoryPool()
        # capture cannot happen on the legacy default stream; the graph stream has the highest priority, which its
        # kernels keep (_NodePriorityGraph) over those of a gradient branch's lowest-priority side stream
        entry.stream = cuda.kept_stream("graph", priority="greatest")
        entry.device = cp.cuda.runtime.getDevice()
        statics = []

        def make_static(t: Tensor) -> Tensor:
            s = Tensor(t.data.copy(order="K"))  # keeps the memory format (channels-last inputs)
            s.requires_grad = t.requires_grad
            statics.append(s)
            return s
        # the copies run on the caller's stream: uncaptured kernels on a side stream slow the graphs captured
        # after them (frost.backend.cuda.graph_time_us), so the graph stream only ever captures and replays
        with cp.cuda.using_allocator(entry.pool.malloc):
            s_args = _replace_tensors(args, make_static)
            s_kwargs = _replace_tensors(kwargs, make_static)
        # a schedule's lr changed since the warm-up is written now: inside the capture the write would be a
        # host-to-device copy, which a capture refuses
        _sync_optimizer_hyperparameters()
        cp.cuda.get_current_stream().synchronize()
        with cp.cuda.using_allocator(entry.pool.malloc), entry.stream:
            # a zero_grad() made before the capture is not replayed with it: only one inside the step may let
            # the graph write gradients straight into .grad (frost.autograd.grad_destination)
            forget_zero_grads()
            previous_hook = set_host_sync_hook(_refuse_host_sync)
            try:
                entry.stream.begin_capture()
                try:
                    out = self.fn(*s_args, **s_kwargs)
                finally:
                    graph = entry.stream.end_capture()
            except HostSyncInCaptureError:
                raise
            except Exception as e:
                if "cublas" in str(e).lower():
                    raise RuntimeError(f"frost.jit: the step could not be captured into a CUDA graph: {e}. CuPy "
                                       f"refuses cuBLAS calls during capture: multiply with frost.matmul, or "
                                       f"frost.ops.matmul.matmul_arrays in array code (cuDNN, capturable).") from e
                if "capture" in str(e).lower() or "stream" in str(e).lower():
                    raise RuntimeError(f"frost.jit: the step could not be captured into a CUDA graph: {e}. "
                                       f"A captured step must not synchronize with the host (no .item(), "
                                       f".numpy(), printing tensors, or Python branches on tensor values).") from e
                raise
            finally:
                set_host_sync_hook(previous_hook)
        if os.environ.get("FROST_NODE_PRIORITY", "1") != "0":
            graph = _NodePriorityGraph(graph)
        entry.graph, entry.static_inputs, entry.output = graph, statics, out


class _NodePriorityGraph:
    """A captured CUDA graph instantiated so that each kernel keeps the priority of the stream that captured it
    (CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY; else every node runs at the priority of the stream it is launched
    on): the blocks of the step's critical path (the input gradients, on the graph stream) go to the SMs before those
    of a gradient branch (frost.autograd.gradient_branch), which fill what is left. H200: 0.557 -> 0.543 ms per fp32
    step. FROST_NODE_PRIORITY=0 replays CuPy's instantiation instead."""

    USE_NODE_PRIORITY = 8

    def __init__(self, graph) -> None:
        self.driver = cuda.driver()
        self.graph = graph  # CuPy's graph: owns the captured graph (and what CuPy keeps alive with it)
        self.handle = ctypes.c_void_p()
        _check(self.driver.cuGraphInstantiateWithFlags(ctypes.byref(self.handle), ctypes.c_void_p(graph.graph),
                                                       ctypes.c_ulonglong(self.USE_NODE_PRIORITY)),
               "cuGraphInstantiateWithFlags")

    def launch(self, stream) -> None:
        _check(self.driver.cuGraphLaunch(self.handle, ctypes.c_void_p(stream.ptr)), "cuGraphLaunch")

    def __del__(self) -> None:
        if self.handle:
            self.driver.cuGraphExecDestroy(self.handle)


def _sync_optimizer_hyperparameters() -> None:
    """Write every flat optimizer's changed hyper-parameters (a schedule's lr) to the device, outside any capture:
    a replay's update kernel reads them there, and a capture must not copy from the host."""
    for optimizer in list(flat.live_optimizers):
        optimizer.sync_device_hyperparameters()


def _check(err: int, call: str) -> None:
    if err:
        raise RuntimeError(f"frost.jit: {call} failed with CUresult {err} ({cuda.driver_error_name(err)})")


def _refuse_host_sync(what: str) -> None:
    raise HostSyncInCaptureError(f"frost.jit: {what} was called while the step is being captured into a CUDA "
                                 f"graph; a captured step cannot read values back to the host. Return the tensor "
                                 f"from the step and read it after the call instead.")


_warming_up = 0  # jitted steps now in an eager warm-up call (see warming_up)
_pending_sources: list[Callable[[], frozenset]] = []   # the acceleration layer's undecided kernel choices


def warming_up() -> bool:
    """True while a jitted step runs one of its eager calls before its capture. A fast path whose captured form
    differs from its eager one (matmul: cuBLAS eagerly, cuDNN captured) takes the captured form here, so that its
    plans are built and timed before the capture, where timing is refused."""
    return _warming_up > 0


@contextlib.contextmanager
def _warm_up():
    global _warming_up
    _warming_up += 1
    try:
        yield
    finally:
        _warming_up -= 1


def register_pending_choices(source: Callable[[], frozenset]) -> Callable[[], frozenset]:
    """Register source() -> the kernel choices (hashable names) the acceleration layer has asked and not made yet,
    such as a convolution shape whose candidates are still compiling: a capture would keep the fallback there for
    good (nothing is chosen inside a capture), so jit runs one more eager call first. Returns source unchanged."""
    if not callable(source):
        raise TypeError(f"frost.jit.register_pending_choices: source must be callable, got {type(source).__name__}")
    _pending_sources.append(source)
    return source


def _pending() -> frozenset:
    """The choices every registered source still has pending (the core imports no layer: the layer registers)."""
    return frozenset().union(*(source() for source in _pending_sources))


def jit(fn: Callable | None = None, *, warmup: int = 2):
    """Capture a training step into a CUDA graph: `step = frost.jit(step)` or `@frost.jit`.

    The first `warmup` calls per input signature run eagerly (allocating gradients, optimizer state and
    cuDNN plans, choosing kernels; one call more while a convolution's choice is still pending); the next call
    captures, and every later call copies its tensor inputs into static
    buffers and replays. Returned tensors stay valid until the next call. A new input shape captures a
    new graph. On the CPU the function is simply called.
    """
    if fn is None:
        return lambda f: Jitted(f, warmup)
    return Jitted(fn, warmup)
