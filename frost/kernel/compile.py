"""NVRTC compilation of CUDA C++ to cubin, with an on-disk cache keyed by source, architecture and NVRTC version."""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from frost.backend.remembered import cache_root
from frost.kernel.frontend import KernelError

# Counters the tests (and curious users) read: how often NVRTC ran and how often the disk cache answered, and the
# seconds NVRTC took summed over every thread (compiles on the background threads overlap: more than wall time).
stats = {"nvrtc_compiles": 0, "disk_hits": 0, "nvrtc_seconds": 0.0, "launch_waits": 0, "launch_wait_seconds": 0.0,
         "specialize_seconds": 0.0}
# (kernel, seconds, compiled in the background) each time a launch waited for its cubin: a start-up's critical path
waits: list = []

# FROST_KERNEL_LINEINFO=1 compiles kernels with -lineinfo: Nsight Compute's source page then attributes stalls and
# instructions to the kernel's Python lines (the generated C++ carries #line directives). Off by default: it changes
# nothing in the code, but profiling builds should be asked for.
LINEINFO = os.environ.get("FROST_KERNEL_LINEINFO", "0") == "1"

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def background(fn, *args) -> Future:
    """fn(*args) on the background compile threads (one per CPU core, at most 16: NVRTC releases the GIL)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1), thread_name_prefix="frost-nvrtc")
    return _pool.submit(fn, *args)


def cache_dir() -> Path:
    return cache_root() / "kernels"


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError("frost.kernel needs NVRTC: install cuda-bindings and nvidia-cuda-nvrtc") from exc
    return nvrtc


def nvrtc_version() -> str:
    err, major, minor = _nvrtc().nvrtcVersion()
    return f"{major}.{minor}"


def _check(result, what: str):
    err = result[0]
    if int(err) != 0:
        raise RuntimeError(f"NVRTC {what} failed: {err}")
    return result[1:] if len(result) > 2 else (result[1] if len(result) == 2 else None)


def cache_key(source: str, name: str, arch: str, options, consts=None) -> str:
    h = hashlib.sha256()
    for part in (source, name, arch, " ".join(options), repr(sorted((consts or {}).items())), nvrtc_version()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


_archs: dict = {}


def device_arch(device: int | None = None) -> str:
    """The architecture of a GPU (e.g. 'sm_90' on H100/H200) as NVRTC names it."""
    import cupy
    device = cupy.cuda.runtime.getDevice() if device is None else device
    arch = _archs.get(device)
    if arch is None:
        cc = cupy.cuda.Device(device).compute_capability  # e.g. "90"
        arch = _archs[device] = f"sm_{cc}"
    return arch


@functools.lru_cache(maxsize=None)
def multiprocessor_count(device: int) -> int:
    """The streaming multiprocessors of a GPU: how many blocks of one-block-an-SM kernels run at once."""
    import cupy
    return int(cupy.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"])


def has_mma(a) -> bool:
    """Whether the GPU holding array `a` runs mma.sync on bf16 and TF32 operands (compute capability 8.0 or newer);
    True for a NumPy array (the simulator runs these kernels anywhere)."""
    if isinstance(a, np.ndarray):
        return True
    return int(device_arch(a.device.id)[len("sm_"):].rstrip("a")) >= 80


def compile_cubin(source: str, name: str, arch: str = "sm_90", options=(), consts=None,
                  line_map=None) -> bytes:
    """Compile CUDA C++ to a cubin for `arch`, reading and filling the disk cache."""
    options = ["--gpu-architecture=" + arch, "-std=c++17", *(["-lineinfo"] if LINEINFO else []), *options]
    key = cache_key(source, name, arch, options, consts)
    path = cache_dir() / f"{name}-{arch}-{key}.cubin"
    if path.exists():
        stats["disk_hits"] += 1
        return path.read_bytes()
    cubin = _nvrtc_compile(source, name, options)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".cubin")
    with os.fdopen(fd, "wb") as f:
        f.write(cubin)
    os.replace(tmp, path)
    return cubin


@contextlib.contextmanager
def _compiled_program(source: str, name: str, options):
    """An NVRTC program for kernel `name` compiled with `options`, and NVRTC's log, destroyed on leaving;
    KernelError (the log in the kernel's Python line numbers) when it does not compile."""
    nvrtc = _nvrtc()
    prog = _check(nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], []), "create")
    try:
        opts = [o.encode() for o in options]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        size = _check(nvrtc.nvrtcGetProgramLogSize(prog), "log size")
        log = bytearray(size)  # never b" " * n: for n == 1 that is the interned b" ", which NVRTC would overwrite
        nvrtc.nvrtcGetProgramLog(prog, log)
        log = log.decode(errors="replace").rstrip("\x00 \n")
        if int(err) != 0:
            raise KernelError(f"NVRTC could not compile kernel {name!r}:\n{_python_lines(log)}")
        yield prog, log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _output(prog, get_size, get, what: str) -> bytes:
    """One output of a compiled program (the cubin or the PTX), through NVRTC's size-then-copy pair of calls."""
    size = _check(get_size(prog), f"{what} size")
    buf = bytearray(size)
    _check((get(prog, buf)[0], None), f"get {what}")
    return bytes(buf)


def _nvrtc_compile(source: str, name: str, options) -> bytes:
    nvrtc = _nvrtc()
    stats["nvrtc_compiles"] += 1
    start = time.perf_counter()
    try:
        with _compiled_program(source, name, options) as (prog, _log):
            return _output(prog, nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN, "cubin")
    finally:
        stats["nvrtc_seconds"] += time.perf_counter() - start


def inspect_program(source: str, name: str, arch: str = "sm_90", options=()) -> dict:
    """Compile without the cache and return the PTX and ptxas's resource report for kernel `name`:
    {"ptx": str, "log": str, "registers": int, "spill_stores": int, "spill_loads": int, "stack": int,
    "smem": int (static shared bytes)}. For reading what the code generator produced, not for launching."""
    nvrtc = _nvrtc()
    opts = ["--gpu-architecture=" + arch, "-std=c++17", "--ptxas-options=-v", *options]
    with _compiled_program(source, name, opts) as (prog, log):
        ptx = _output(prog, nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX, "ptx")
    return dict(ptx=ptx.decode(errors="replace").rstrip("\x00"), log=log, **_ptxas_numbers(log, name))


def _ptxas_numbers(log: str, name: str) -> dict:
    """Registers, spills, stack and static shared memory of one entry function, from `ptxas -v` output."""
    part = log.split(f"Function properties for {name}", 1)[-1]
    def num(pattern):
        m = re.search(pattern, part)
        return int(m.group(1)) if m else 0
    return dict(registers=num(r"Used (\d+) registers"), spill_stores=num(r"(\d+) bytes spill stores"),
                spill_loads=num(r"(\d+) bytes spill loads"), stack=num(r"(\d+) bytes stack frame"),
                smem=num(r"(\d+) bytes smem"))


def _python_lines(log: str) -> str:
    """NVRTC reports `file.py(12): error: ...`; add the Python line's text after each such message."""
    out = []
    for line in log.splitlines():
        out.append(line)
        m = re.match(r"(.+\.py)\((\d+)\): (error|warning)", line)
        if m and os.path.exists(m.group(1)):
            try:
                text = Path(m.group(1)).read_text().splitlines()[int(m.group(2)) - 1]
                out.append(f"    python line {m.group(2)}: {text.strip()}")
            except (OSError, IndexError):
                pass
    return "\n".join(out)
