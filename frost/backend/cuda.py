"""The CUDA backend: CuPy arrays, streams, pinned memory and device utilities. Imported lazily; Frost works without
CuPy."""
from __future__ import annotations

import ctypes
import functools
import threading
from typing import Any, Callable

_cupy = None
_seed = 0
_generators: dict = {}  # device index -> the generator _generator_factory made (frost.accel.philox.PhiloxGenerator)
# (seed, device index) -> a device generator. The generator is written in the kernel language, which sits above this
# module, so it registers itself here when imported (frost.accel.philox, imported with the acceleration layer by
# frost/__init__.py)
_generator_factory: Callable[[int, int], Any] | None = None
_gpu_seen = False  # a GPU has answered once: later uses skip the check


class CudaUnavailableError(RuntimeError):
    """CUDA cannot be used here: CuPy is missing, or CUDA finds no GPU or no (recent enough) driver."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"frost: CUDA is not available ({reason}); Frost's GPU path needs CuPy (install with "
                         f"`pip install frost-dl[cuda]`) and an NVIDIA GPU with its driver. "
                         f"frost.cuda.is_available() tells whether there is one")


def cupy():
    """The CuPy module, imported on first use with a clear error when it is missing."""
    global _cupy
    if _cupy is None:
        try:
            import cupy as cp
        except ImportError as e:  # pragma: no cover - depends on the machine
            raise CudaUnavailableError("CuPy is not installed") from e
        _cupy = cp
    return _cupy


def unavailable_reason() -> str | None:
    """Why CUDA cannot be used (CuPy missing, CUDA's error such as cudaErrorInsufficientDriver, no GPU), or None."""
    try:
        cp = cupy()
    except Exception as e:  # noqa: BLE001 - missing, or a broken install failing on import
        return "CuPy is not installed" if isinstance(e, CudaUnavailableError) else f"CuPy fails to import: {e}"
    try:
        count = cp.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - CuPy's CUDARuntimeError names the cause: no driver, an old one, ...
        return f"CuPy reports {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}"
    return None if count > 0 else "CUDA sees no GPU"


def is_available() -> bool:
    """True when CuPy imports and sees at least one GPU."""
    return unavailable_reason() is None


def gpu_cupy():
    """CuPy for work on a GPU: raises CudaUnavailableError, Frost's message, where there is none, instead of the
    error CuPy would raise at the first allocation (cudaErrorInsufficientDriver, cudaErrorNoDevice, ...)."""
    global _gpu_seen
    if not _gpu_seen:
        if not is_available():
            raise CudaUnavailableError(unavailable_reason() or "CUDA sees no GPU")
        _gpu_seen = True
    return cupy()


def synchronize() -> None:
    """Wait for all work queued on the current GPU."""
    cupy().cuda.Device().synchronize()


def current_stream():
    return cupy().cuda.get_current_stream()


_kept_streams: dict = {}  # (device, purpose, index, thread) -> a non-blocking stream kept for the process
_kept_streams_lock = threading.Lock()


def kept_stream(purpose: str, index: int = 0, priority: str = "least"):
    """The current device's and thread's non-blocking stream for `purpose` ("timing", "graph", "copy", ...) and
    `index`, made once and kept for the life of the process: choosing kernels times hundreds of candidates, and a GPU
    loader starts an epoch at a time; neither needs a stream of its own each time. Per thread, so that two threads
    capturing or timing at once never share a stream. priority: "least" (CUDA's default) or "greatest" (frost.jit
    captures on such a stream: its kernels outrank a gradient branch's); a stream per priority."""
    cp = cupy()
    key = (cp.cuda.runtime.getDevice(), purpose, index, priority, threading.get_ident())
    with _kept_streams_lock:
        stream = _kept_streams.get(key)
        if stream is None:
            levels = {"priority": _greatest_stream_priority()} if priority == "greatest" else {}
            stream = _kept_streams[key] = cp.cuda.Stream(non_blocking=True, **levels)
    return stream


def _greatest_stream_priority() -> int:
    """The highest stream priority of the current device (the lowest number; 0, the default, is the lowest)."""
    least, greatest = ctypes.c_int(), ctypes.c_int()
    lib = driver()
    if lib is None or lib.cuCtxGetStreamPriorityRange(ctypes.byref(least), ctypes.byref(greatest)):
        return 0
    return greatest.value


@functools.lru_cache(maxsize=None)
def driver():
    """The CUDA driver library (ctypes), or None where there is none: for what CuPy does not wrap (launch
    attributes, graph instantiation flags, stream priority ranges)."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def driver_error_name(err: int) -> str:
    """The name of a CUresult (CUDA_ERROR_...), or "unknown"."""
    name = ctypes.c_char_p()
    get_error_name = getattr(driver(), "cuGetErrorName", None)
    if get_error_name is not None:
        get_error_name(err, ctypes.byref(name))
    return (name.value or b"unknown").decode()


def device_name(index: int = 0) -> str:
    props = cupy().cuda.runtime.getDeviceProperties(index)
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def device_index(array) -> int:
    """The index of the GPU a CuPy array lives on."""
    if isinstance(array, cupy().ndarray):
        return array.device.id
    raise TypeError(f"not an array frost knows: {type(array).__name__}")


def to_host(array):
    return cupy().asnumpy(array)


def to_device(array, index: int):
    cp = gpu_cupy()
    with cp.cuda.Device(index):
        return cp.asarray(array)


def pinned_empty(shape, dtype):
    """A NumPy array in page-locked host memory (for asynchronous copies to the GPU)."""
    import cupyx
    return cupyx.empty_pinned(shape, dtype=dtype)


def register_generator_factory(factory: Callable[[int, int], Any]) -> None:
    """Set what makes a GPU's random generator: factory(seed, device index) -> generator (frost.accel.philox registers
    PhiloxGenerator on import). Generators made before keep living; new ones come from `factory`."""
    global _generator_factory
    if not callable(factory):
        raise TypeError(f"frost.backend.cuda.register_generator_factory: factory must be callable, "
                        f"got {type(factory).__name__}")
    _generator_factory = factory


def generator(index: int | None = None):
    """GPU `index`'s random generator (the current GPU's by default): Philox4x32-10 with its offset on the device
    (frost.accel.philox), so captured CUDA graphs draw new numbers on every replay; seeded by frost.manual_seed."""
    if index is None:
        index = gpu_cupy().cuda.Device().id
    if index not in _generators:
        _generators[index] = _registered_factory("generator")(_seed, index)
    return _generators[index]


def new_generator(seed: int, index: int):
    """A GPU generator of its own (not the device's global one), from the registered factory: what a
    frost.Generator(device="cuda") draws from."""
    return _registered_factory("new_generator")(seed, index)


def _registered_factory(caller: str) -> Callable[[int, int], Any]:
    if _generator_factory is None:
        raise RuntimeError(f"frost.backend.cuda.{caller}: no GPU generator is registered; import frost (or "
                           f"frost.accel.philox, which registers PhiloxGenerator) before drawing on a GPU")
    return _generator_factory


def manual_seed(seed: int) -> None:
    """Reseed every GPU's generator in place (key = seed, offset = 0), so captured graphs follow."""
    global _seed
    _seed = seed
    for g in _generators.values():
        g.seed(seed)


def generators_snapshot() -> tuple[int, frozenset[int]]:
    """The seed new generators start from and the devices whose generator exists (what fork_rng restores)."""
    return _seed, frozenset(_generators)


def restore_generators(snapshot: tuple[int, frozenset[int]]) -> None:
    """Back to a generators_snapshot(): its seed for new generators, and the generators made since reset to it
    (offset 0, as if made afterwards). Those that existed keep their state (fork_rng sets it)."""
    global _seed
    _seed, existing = snapshot
    for index, g in _generators.items():
        if index not in existing:
            g.seed(_seed)


def memory_allocated() -> int:
    """Bytes in use in CuPy's default memory pool on the current device."""
    return cupy().get_default_memory_pool().used_bytes()


def graph_time_us(fn, calls: int = 10, repeats: int = 10, warmup: int = 2) -> float:
    """Median microseconds per call of fn (a sequence of launches on the current stream), captured `calls` times
    into one CUDA graph and replayed `repeats` times (CUDA events): launching from Python costs more than small
    kernels take, so timing plain calls would measure the host.

    fn's first, uncaptured call runs on the caller's stream, not on the timing stream: a process that launched more
    than a few kernels outside a capture on a non-default stream replays the CUDA graphs it captures later ~6 %
    slower for the rest of its life (the seed's step 0.670 against 0.635 ms on an H200 after a start-up that chose
    its kernels; benchmarks/stream_churn.py --before side_eager_300)."""
    import numpy as np
    cp = cupy()
    stream = kept_stream("timing")
    pool = cp.cuda.MemoryPool()   # scratch made during the capture stays the graph's while it is replayed
    fn()   # compiles, loads, tunes (and sizes cuDNN's workspace) outside the capture
    current_stream().synchronize()
    with stream:
        with cp.cuda.using_allocator(pool.malloc):
            stream.begin_capture()
            try:
                for _ in range(calls):
                    fn()
            finally:
                graph = stream.end_capture()
        for _ in range(warmup):
            graph.launch(stream)
        times = []
        for _ in range(repeats):
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            graph.launch(stream)
            stop.record(stream)
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop) * 1000 / calls)
    return float(np.median(times))
