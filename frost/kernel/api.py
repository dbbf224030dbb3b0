"""`@kernel`, `@kernel.device` and `cuda_source`: specialization, compilation, GPU launch and simulation."""
from __future__ import annotations

import inspect
import os
import re
import sys
import time

import numpy as np

from frost.kernel import cgen, compile as kcompile, pdl, simulate
from frost.kernel.frontend import Checker, DeviceFunction, KernelError, Source, enclosing_scope
from frost.kernel.tma import MAP_BYTES, TensorMap
from frost.kernel.types import SCALARS, ArrayType, ConstType, TensorMapType, bf16, f16


class Spec:
    """One specialization of a kernel (one set of compile-time constants): checked code, C++ and simulator."""

    def __init__(self, kernel: "Kernel", consts: dict) -> None:
        self.consts = consts
        cache: dict = {}
        self.checked = Checker(kernel.src, kernel.__name__, True, consts, cache).check()
        self.devices = [v for v in cache.values() if v != "busy"]
        self.source = cgen.module_source(self.checked, self.devices)
        self._sim = None
        self._cubins: dict = {}
        self._pending: dict = {}  # arch -> Future of a background compile (prefetch)
        self._functions: dict = {}

    @property
    def sim(self):
        if self._sim is None:
            self._sim = simulate.build(self.checked, self.devices)
        return self._sim

    def arch(self, arch: str) -> str:
        """The architecture to compile for: a kernel using wgmma, setmaxnreg, mbarrier waits or bulk copies needs
        sm_90a (Hopper's arch-specific features)."""
        if not (self.checked.uses_wgmma or self.checked.needs_sm90a) or arch == "sm_90a":
            return arch
        if arch == "sm_90":
            return "sm_90a"
        raise KernelError(f"{self.checked.cname}: wgmma (warpgroup MMA), setmaxnreg, mbarriers or bulk copies "
                          f"need a Hopper GPU (sm_90a); cannot compile for {arch}")

    def cubin(self, arch: str) -> bytes:
        """The cubin for `arch`: a finished or running prefetch's, else compiled now (a compile error raises here)."""
        arch = self.arch(arch)
        if arch not in self._cubins:
            pending, start = self._pending.pop(arch, None), time.perf_counter()
            self._cubins[arch] = pending.result() if pending is not None else self._compile(arch)
            waited = time.perf_counter() - start
            kcompile.stats["launch_waits"] += 1
            kcompile.stats["launch_wait_seconds"] += waited
            kcompile.waits.append((self.checked.cname, round(waited, 4), pending is not None))
        return self._cubins[arch]

    def prefetch(self, arch: str) -> None:
        """Start compiling for `arch` on the background compile threads; `cubin` then waits for that compile."""
        arch = self.arch(arch)
        if arch not in self._cubins and arch not in self._pending:
            self._pending[arch] = kcompile.background(self._compile, arch)

    def _compile(self, arch: str) -> bytes:
        return kcompile.compile_cubin(self.source, self.checked.cname, arch, consts=self.consts)


# CUDA's launch limits (compute capability 9.0): checked on every launch, GPU and simulator alike, so that a
# configuration every GPU refuses fails here, naming the kernel, rather than in the driver or not at all
MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK = (1024, 1024, 64)
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_DYNAMIC_SMEM = 232448  # 227 KiB: the H200's opt-in maximum of dynamic shared memory per block
_AXES = ("x", "y", "z")


def _is_int(v) -> bool:
    """Whether `v` is a Python or NumPy integer (not a bool: True is no size)."""
    return type(v) is int or (isinstance(v, (int, np.integer)) and not isinstance(v, bool))


def _launch_config(cfg, what):
    """(grid, block, smem, stream) of `k[grid, block]`, `k[grid, block, smem]` or `k[grid, block, smem, stream]`:
    grid and block an int or a tuple (or list) of 1 to 3 ints, smem an int of bytes (None: 0), within CUDA's
    limits; any other value is refused, naming the kernel `what`."""
    if not isinstance(cfg, tuple) or not 2 <= len(cfg) <= 4:
        raise TypeError(f"{what}: launch as k[grid, block] or k[grid, block, smem_bytes, stream], got {cfg!r}")
    grid, block = _dim3(cfg[0], "grid", what, MAX_GRID), _dim3(cfg[1], "block", what, MAX_BLOCK)
    threads = block[0] * block[1] * block[2]
    if threads > MAX_THREADS_PER_BLOCK:
        raise ValueError(f"{what}: a block of {threads} threads {block} exceeds CUDA's limit of "
                         f"{MAX_THREADS_PER_BLOCK} threads per block")
    smem = cfg[2] if len(cfg) > 2 else None
    if smem is None:
        smem = 0
    elif not _is_int(smem):
        raise TypeError(f"{what}: dynamic shared memory must be an int number of bytes, got {smem!r} "
                        f"({type(smem).__name__})")
    else:
        smem = int(smem)
        if not 0 <= smem <= MAX_DYNAMIC_SMEM:
            raise ValueError(f"{what}: {smem} bytes of dynamic shared memory is outside CUDA's limit of 0 to "
                             f"{MAX_DYNAMIC_SMEM} bytes (227 KiB) per block")
    stream = cfg[3] if len(cfg) > 3 else None
    return grid, block, smem, stream


def _dim3(v, what, name, limits):
    """A grid or block size (an int, or a tuple or list of 1 to 3 ints) as three Python ints within `limits`."""
    if type(v) is int:  # the common case, first
        if not 1 <= v <= limits[0]:
            _dim_error(v, 0, what, name, limits, v)
        return (v, 1, 1)
    if _is_int(v):
        return _dim3(int(v), what, name, limits)
    if not isinstance(v, (tuple, list)):
        raise TypeError(f"{name}: {what} must be an int or a tuple of 1 to 3 ints, got {v!r} ({type(v).__name__})")
    if not 1 <= len(v) <= 3:
        raise ValueError(f"{name}: {what} must be 1 to 3 positive sizes, got {tuple(v)}")
    out = [1, 1, 1]
    for i, x in enumerate(v):
        if not _is_int(x):
            raise TypeError(f"{name}: {what} sizes must be ints, got {tuple(v)} ({what} {_AXES[i]} is "
                            f"{type(x).__name__})")
        x = int(x)
        if not 1 <= x <= limits[i]:
            _dim_error(x, i, what, name, limits, tuple(v))
        out[i] = x
    return tuple(out)


def _dim_error(x, i, what, name, limits, v):
    if x < 1:
        raise ValueError(f"{name}: {what} must be 1 to 3 positive sizes, got {v} ({what} {_AXES[i]} is {x})")
    raise ValueError(f"{name}: {what} {_AXES[i]} of {x} (in {what} {v}) exceeds CUDA's limit of {limits[i]}")


class Kernel:
    """A GPU kernel written in Python: `k[grid, block](*args)`, `k.simulate[grid, block](*args)`, `k.source`."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        self.src = Source(fn, enclosing_scope(fn))
        self._specs: dict = {}
        self._specs_by_given: dict = {}   # the constants as given -> their Spec (checked once)
        self.params = []  # (name, type or ConstType)
        probe = Checker(self.src, fn.__name__, True, {}, {})
        for arg in self.src.tree.args.args:
            if arg.annotation is None:
                raise self.src.error(arg, f"kernel parameter {arg.arg!r} needs a type annotation")
            self.params.append((arg.arg, probe._annotation(arg.annotation, arg)))
        self._names = [n for n, _ in self.params]
        self._is_const = {n: isinstance(t, ConstType) for n, t in self.params}
        defaults = fn.__defaults__ or ()
        self.defaults = dict(zip([a.arg for a in self.src.tree.args.args][-len(defaults):], defaults)) \
            if defaults else {}

    # -- specializations -----------------------------------------------------------------------------
    def const_names(self):
        return [n for n, t in self.params if isinstance(t, ConstType)]

    def specialize(self, **consts) -> Spec:
        # Every launch asks, so the constants as given find their Spec without being checked again: an eager seed
        # ResNet step makes 113 launches, and binding plus checking took 7.4 us a launch (3.1 now, on this CPU)
        try:
            return self._specs_by_given[tuple(consts.items())]
        except (KeyError, TypeError):
            pass
        spec = self._specialize(consts)
        self._specs_by_given[tuple(consts.items())] = spec
        return spec

    def _specialize(self, consts: dict) -> Spec:
        names = self.const_names()
        full = {}
        for n, t in self.params:
            if not isinstance(t, ConstType):
                continue
            if n in consts:
                full[n] = t.value(consts[n], f"{self.__name__}: compile-time constant {n!r}")
            elif n in self.defaults:
                full[n] = t.value(self.defaults[n], f"{self.__name__}: compile-time constant {n!r}")
            else:
                raise TypeError(f"{self.__name__}: compile-time constant {n!r} needs a value")
        extra = set(consts) - set(names)
        if extra:
            raise TypeError(f"{self.__name__}: {sorted(extra)} are not Const parameters (those are {names})")
        key = tuple(sorted(full.items()))
        spec = self._specs.get(key)
        if spec is None:
            start = time.perf_counter()
            spec = self._specs[key] = Spec(self, full)  # checked and generated here, in the caller's thread
            kcompile.stats["specialize_seconds"] += time.perf_counter() - start
            if os.environ.get("FROST_KERNEL_DEBUG") == "1":
                print(spec.source, file=sys.stderr)
        return spec

    @property
    def source(self) -> str:
        """The generated CUDA C++ (for a kernel with Const parameters: use source_for(**consts))."""
        return self.specialize().source

    def source_for(self, **consts) -> str:
        return self.specialize(**consts).source

    def compile(self, arch: str = "sm_90", **consts) -> bytes:
        """The cubin for `arch` (compiled by NVRTC or read from the disk cache), without launching."""
        return self.specialize(**consts).cubin(arch)

    def prefetch(self, arch: str | None = None, **consts) -> None:
        """Start compiling one specialization in the background (for the current GPU's arch by default), so that a
        later launch finds it compiled: a caller that knows which kernels come next (a backward pass, the weight
        gradient's candidates) overlaps their NVRTC compiles with each other and with its own work."""
        self.specialize(**consts).prefetch(arch or kcompile.device_arch())

    def inspect(self, arch: str = "sm_90", **consts) -> dict:
        """PTX and ptxas's report (registers, spill bytes, stack, static shared memory) for one specialization."""
        spec = self.specialize(**consts)
        return kcompile.inspect_program(spec.source, spec.checked.cname, spec.arch(arch))

    def ptx(self, arch: str = "sm_90", **consts) -> str:
        """The PTX NVRTC writes for this kernel (to read what the code generator produced)."""
        return self.inspect(arch, **consts)["ptx"]

    # -- launch ------------------------------------------------------------------------------------------
    def _split_args(self, args, kwargs):
        """Bind launch arguments to parameters: Const values pick the specialization, the rest are passed."""
        names = self._names
        if len(args) > len(names):
            raise TypeError(f"{self.__name__}() takes {len(names)} arguments ({', '.join(names)}), got {len(args)}")
        values = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in self._is_const:
                raise TypeError(f"{self.__name__}(): no parameter named {k!r}")
            if k in values:
                raise TypeError(f"{self.__name__}(): argument {k!r} given twice")
            values[k] = v
        if len(values) < len(names):
            values = {**self.defaults, **values}
            missing = [n for n in names if n not in values]
            if missing:
                raise TypeError(f"{self.__name__}() takes {len(names)} arguments ({', '.join(names)}), "
                                f"got {len(args) + len(kwargs)}: missing {', '.join(missing)}")
        consts, runtime = {}, []
        for n, t in self.params:
            if self._is_const[n]:
                consts[n] = values[n]
            else:
                runtime.append((n, t, values[n]))
        return consts, runtime

    def __getitem__(self, cfg):
        grid, block, smem, stream = _launch_config(cfg, self.__name__)

        def launch(*args, **kwargs):
            consts, runtime = self._split_args(args, kwargs)
            spec = self.specialize(**consts)
            _check_bounds(self.__name__, spec, block)
            fn, device = _device_function(spec, spec.cubin, spec.checked.cname)
            args = _gpu_args(self.__name__, runtime, spec.checked.vector_params)
            _gpu_launch(fn, device, grid, block, smem, stream, args, self.__name__)
        return launch

    @property
    def simulate(self):
        return _Simulator(self)

    def __call__(self, *args, **kwargs):
        raise TypeError(f"{self.__name__} is a kernel: launch it as {self.__name__}[grid, block](...) on the GPU "
                        f"or {self.__name__}.simulate[grid, block](...) on the CPU")

    def __repr__(self) -> str:
        return f"<frost.kernel {self.__name__}>"


class _Simulator:
    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel

    def __getitem__(self, cfg):
        k = self.kernel
        grid, block, smem, _ = _launch_config(cfg, k.__name__)

        def run(*args, **kwargs):
            consts, runtime = k._split_args(args, kwargs)
            spec = k.specialize(**consts)
            _check_bounds(k.__name__, spec, block)
            fn = spec.sim
            sim_args = [_sim_arg(k.__name__, n, t, v) for n, t, v in runtime]
            simulate.run(k.__name__, fn, spec.checked.has_yield, grid, block, sim_args, smem,
                         spec.checked.uses_grid_sync, spec.checked.uses_named_barriers)
        return run


def _check_bounds(kname, spec, block):
    bounds = spec.checked.launch_bounds
    if bounds and block[0] * block[1] * block[2] > bounds[0]:
        raise ValueError(f"{kname}: a block of {block[0] * block[1] * block[2]} threads exceeds the kernel's "
                         f"launch_bounds({bounds[0]}{', ' + str(bounds[1]) if len(bounds) > 1 else ''})")


def _host_array(v):
    data = getattr(v, "data", v) if not isinstance(v, np.ndarray) else v
    return data


def _tensor_map_arg(kname, name, t, v, on_gpu: bool) -> TensorMap:
    """A TensorMap argument that matches its parameter: element type, rank, and where it was made."""
    if not isinstance(v, TensorMap):
        raise TypeError(f"{kname}: argument {name!r} is {t}: make it with frost.kernel.tensor_map(array, box), got "
                        f"{type(v).__name__}")
    if v.elem != t.elem or v.rank != t.rank:
        raise TypeError(f"{kname}: argument {name!r} is {t} but got a tensor map of {v.elem} of rank {v.rank}")
    if on_gpu != (v.encoded is not None):
        raise TypeError(f"{kname}: argument {name!r} is a tensor map over a "
                        f"{'NumPy' if on_gpu else 'GPU'} array; the {'GPU' if on_gpu else 'simulator'} needs one over "
                        f"a {'CuPy' if on_gpu else 'NumPy'} array")
    return v


def _sim_arg(kname, name, t, v):
    if isinstance(t, TensorMapType):
        return _tensor_map_arg(kname, name, t, v, on_gpu=False)
    if isinstance(t, ArrayType):
        a = _host_array(v)
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{kname}: argument {name!r} must be a NumPy array (or CPU tensor) for the simulator, "
                            f"got {type(v).__name__}")
        if a.dtype != t.elem.np:
            raise TypeError(f"{kname}: argument {name!r} is {t} but got an array of dtype {a.dtype}")
        if t.ndim == 1:
            if not a.flags.c_contiguous:
                raise TypeError(f"{kname}: argument {name!r} ({t}) must be contiguous")
            return simulate.SimArray(a.reshape(-1), name)
        if a.ndim != 2:
            raise TypeError(f"{kname}: argument {name!r} is {t} but got a {a.ndim}-D array")
        return simulate.SimArray(a, name)
    return _scalar_arg(kname, name, t, v)


def _scalar_arg(kname, name, t, v):
    """A Python or NumPy scalar as a NumPy scalar of the parameter's type (a float for an integer is an error, and
    so is an integer the type cannot hold: a cast would wrap it)."""
    bounds = _INT_RANGES.get(t.name)  # (min, max) of an integer type, else None
    if type(v) is int and bounds is not None:  # the common case, first: a Python int for an integer parameter
        if bounds[0] <= v <= bounds[1]:
            return t.np.type(v)
        _int_overflow(kname, name, t, bounds, v)
    if type(v) is t.np.type:  # a NumPy scalar of the parameter's type already
        return v
    if getattr(v, "shape", ()) != ():
        raise TypeError(f"{kname}: argument {name!r} is a scalar {t}, got an array")
    if not isinstance(v, (int, float, bool, np.generic)):
        raise TypeError(f"{kname}: argument {name!r} is a scalar {t}, got {type(v).__name__}")
    if not t.is_float and isinstance(v, (float, np.floating)):
        raise TypeError(f"{kname}: argument {name!r} is {t}, got the float {v!r}; convert it explicitly")
    if bounds is not None and isinstance(v, (int, np.integer)) and not bounds[0] <= v <= bounds[1]:
        _int_overflow(kname, name, t, bounds, v)  # (a bool, True or np.True_, passes as 1)
    return np.asarray(v).astype(t.np)[()]


def _int_range(dtype) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


_INT_RANGES = {n: _int_range(t.np) for n, t in SCALARS.items() if t.is_int}  # integer type name -> (min, max)


def _int_overflow(kname, name, t, bounds, v):
    raise OverflowError(f"{kname}: argument {name!r} is {t} ({bounds[0]} to {bounds[1]}), got {v!r}, which does "
                        f"not fit (a cast would wrap it)")


def _gpu_args(kname, runtime, aligned=None):
    """Kernel arguments as CuPy expects them: pointers and sizes as NumPy scalars, in signature order.

    `aligned` maps arrays read or written as vectors (load4 of f32: 16 bytes, of bf16: 8; ...) to the alignment
    their pointers need.
    """
    import cupy
    out = []
    for name, t, v in runtime:
        if isinstance(t, ArrayType):
            a = getattr(v, "data", v) if not isinstance(v, cupy.ndarray) else v
            if not isinstance(a, cupy.ndarray):
                raise TypeError(f"{kname}: argument {name!r} ({t}) must be a CUDA tensor or CuPy array, "
                                f"got {type(v).__name__}")
            raw16 = t.elem in (bf16, f16) and a.dtype == np.uint16  # 16-bit floats as raw bits
            if a.dtype != t.elem.np and not raw16:
                raise TypeError(f"{kname}: argument {name!r} is {t} but got an array of dtype {a.dtype}")
            ptr = np.uint64(a.data.ptr)
            need = aligned.get(name, 0) if aligned else 0
            if need and a.data.ptr % need:
                raise ValueError(f"{kname}: argument {name!r} is accessed {need} bytes at a time "
                                 f"(vector loads and stores) but starts "
                                 f"{a.data.ptr % need} bytes past a {need}-byte boundary (an offset view?)")
            if t.ndim == 1:
                if not a.flags.c_contiguous:
                    raise TypeError(f"{kname}: argument {name!r} ({t}) must be contiguous")
                out += [ptr, np.int64(a.size)]
            else:
                if a.ndim != 2:
                    raise TypeError(f"{kname}: argument {name!r} is {t} but got a {a.ndim}-D array")
                item = a.dtype.itemsize
                out += [ptr, np.int64(a.shape[0]), np.int64(a.shape[1]), np.int64(a.strides[0] // item),
                        np.int64(a.strides[1] // item)]
        elif isinstance(t, TensorMapType):   # by value: the 128 bytes, which only cuLaunchKernelEx's path takes
            out.append(np.void(_tensor_map_arg(kname, name, t, v, on_gpu=True).encoded, f"V{MAP_BYTES}"))
        else:
            s = _scalar_arg(kname, name, t, v)
            if t in (bf16, f16):
                s = np.asarray(s).view(np.uint16)[()]
            out.append(s)
    return out


_smem_opt_in: dict = {}


def _device_function(owner, get_cubin, name: str) -> tuple:
    """(the loaded CuPy function for a kernel on the current device, that device's id); owner keeps one module per
    device."""
    import cupy
    dev = cupy.cuda.runtime.getDevice()
    hit = owner._functions.get(dev)
    if hit is None:
        mod = cupy.cuda.function.Module()
        mod.load(get_cubin(kcompile.device_arch(dev)))
        hit = owner._functions[dev] = (mod, mod.get_function(name))
        _prefetch_warm(dev)
    return hit[1], dev


def _gpu_launch(fn, device: int, grid, block, smem, stream, args, pdl_name: str | None = None):
    """Launch a function loaded on `device`; a Frost kernel (pdl_name given) as a programmatic dependent launch
    where the GPU has it (frost.kernel.pdl)."""
    import cupy
    # above 48 KiB in all needs the function's opt-in; from 32 KiB of dynamic memory on it is asked for, so that
    # static shared arrays of a few KiB fit beside it
    if smem > _smem_opt_in.get(id(fn), (None, 32 * 1024))[1]:
        # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (8): CuPy's Function has no property for it
        cupy.cuda.driver.funcSetAttribute(fn.ptr, 8, smem)
        _smem_opt_in[id(fn)] = (fn, smem)  # holding fn keeps its id from being reused
    stream = stream if stream is not None else cupy.cuda.get_current_stream()
    by_value = any(isinstance(a, np.void) for a in args)   # a tensor map: CuPy's launch does not pass such records
    if pdl_name is not None and (by_value or pdl.usable(device)):
        pdl.launch(pdl_name, fn.ptr, grid, block, smem, getattr(stream, "ptr", stream), args,
                   serialize=pdl.usable(device))
    else:
        fn(grid, block, tuple(args), shared_mem=smem, stream=stream)


# -- existing CUDA C++ -------------------------------------------------------------------------------------
class CudaSource:
    """An existing CUDA C++ kernel, launched like a Frost kernel: `k[grid, block](*args)`."""

    def __init__(self, code: str, name: str, options=()) -> None:
        self.code, self.__name__, self.options = code, name, tuple(options)
        self._cubins: dict = {}
        self._functions: dict = {}
        self.params = _c_params(code, name)

    @property
    def source(self) -> str:
        return self.code

    def compile(self, arch: str = "sm_90") -> bytes:
        if arch not in self._cubins:
            self._cubins[arch] = kcompile.compile_cubin(self.code, self.__name__, arch, self.options)
        return self._cubins[arch]

    def __getitem__(self, cfg):
        grid, block, smem, stream = _launch_config(cfg, self.__name__)

        def launch(*args):
            conv = _c_args(self.__name__, self.params, args)
            fn, device = _device_function(self, self.compile, self.__name__)
            _gpu_launch(fn, device, grid, block, smem, stream, conv)
        return launch


C_SCALARS = {"float": np.float32, "double": np.float64, "int": np.int32, "unsigned": np.uint32,
             "unsigned int": np.uint32, "long long": np.int64, "long long int": np.int64, "int64_t": np.int64,
             "size_t": np.uint64, "unsigned long long": np.uint64, "bool": np.bool_, "short": np.int16,
             "unsigned short": np.uint16, "unsigned char": np.uint8, "char": np.int8, "int32_t": np.int32,
             "uint32_t": np.uint32, "uint64_t": np.uint64}
_C_INT_RANGES = {c: _int_range(dt) for c, dt in C_SCALARS.items() if np.issubdtype(dt, np.integer)}


def _c_params(code: str, name: str):
    """(name, C type) of each parameter of `extern "C" __global__ void name(...)`, or None when not found."""
    m = re.search(r"__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?" + re.escape(name) + r"\s*\(([^)]*)\)",
                  code)
    if m is None:
        return None
    params = []
    for p in filter(None, (x.strip() for x in m.group(1).split(","))):
        p = re.sub(r"\b(const|__restrict__|volatile)\b", " ", p)
        pm = re.match(r"(.*?)([A-Za-z_]\w*)\s*$", p.strip())
        ctype = " ".join(pm.group(1).replace("*", " * ").split()).replace(" *", "*")
        params.append((pm.group(2), ctype))
    return params


def _c_args(kname, params, args):
    import cupy
    if params is not None and len(args) != len(params):
        raise TypeError(f"{kname}() takes {len(params)} arguments "
                        f"({', '.join(n for n, _ in params)}), got {len(args)}")
    out = []
    for k, a in enumerate(args):
        pname, ctype = params[k] if params is not None else (str(k), None)
        a = a if isinstance(a, (cupy.ndarray, np.generic, int, float)) else getattr(a, "data", a)
        if ctype is not None and ctype.endswith("*"):
            if not isinstance(a, cupy.ndarray):
                raise TypeError(f"{kname}: argument {pname!r} ({ctype}) must be a CUDA tensor or CuPy array, "
                                f"got {type(a).__name__}")
            out.append(a)
        elif isinstance(a, (np.generic, int, float, bool)):
            dt = C_SCALARS.get(ctype) if ctype else None
            if ctype is not None and dt is None:
                raise TypeError(f"{kname}: argument {pname!r} has C type {ctype!r}; pass a NumPy scalar")
            bounds = _C_INT_RANGES.get(ctype)
            if bounds is not None and isinstance(a, (float, np.floating)):  # as @kernel's: a cast would truncate
                raise TypeError(f"{kname}: argument {pname!r} has C type {ctype!r}, got the float {a!r}; convert "
                                f"it with int() if truncation is meant")
            if bounds is not None and isinstance(a, (int, np.integer)) and not bounds[0] <= a <= bounds[1]:
                _int_overflow(kname, pname, ctype, bounds, a)
            out.append(np.asarray(a).astype(dt)[()] if dt is not None else a)
        else:
            raise TypeError(f"{kname}: argument {pname!r} ({ctype}) must be a scalar, got {type(a).__name__}")
    return out


def cuda_source(code: str, name: str, options=()) -> CudaSource:
    """Bring an existing CUDA C++ kernel (an `extern "C" __global__` function named `name`) into Frost."""
    if f"{name}" not in code:
        raise KernelError(f"cuda_source: no kernel named {name!r} in the given code")
    return CudaSource(code, name, options)


def kernel(fn) -> Kernel:
    """Decorator: a Python function becomes a GPU kernel (the language: docs/kernels.md)."""
    if inspect.isclass(fn) or not callable(fn):
        raise TypeError("@kernel decorates a function")
    return Kernel(fn)


_warm: list = []          # the kernels kernel.warm marked, in the order marked
_warmed_devices: dict = {}  # device -> how many of _warm have been queued for it


def warm(k: Kernel) -> Kernel:
    """Decorator over @kernel: a kernel without compile-time constants that a GPU training step almost always
    launches (a loss, an optimizer's update, the random generator's). From the process's first launch of any Frost
    kernel on a device, its compile runs on the background threads, so that its own first launch finds it ready
    instead of compiling on the caller (a cold start-up's critical path). A kernel marked later (its module imported
    after that launch) is queued at the next first launch of a kernel."""
    if not isinstance(k, Kernel):
        raise TypeError(f"kernel.warm marks a @kernel, got {k!r}")
    if k.const_names():
        raise TypeError(f"kernel.warm: {k.__name__} has compile-time constants {k.const_names()}; prefetch its "
                        f"specializations where their values are known instead")
    _warm.append(k)
    return k


def _prefetch_warm(device: int) -> None:
    """Queue the warm kernels not yet queued for `device` (called as a kernel is first loaded there, after it: its
    own compile is not held up behind theirs)."""
    queued = _warmed_devices.get(device, 0)
    if queued < len(_warm):
        _warmed_devices[device] = len(_warm)
        arch = kcompile.device_arch(device)
        for k in _warm[queued:]:
            k.prefetch(arch)


def device(fn) -> DeviceFunction:
    """Decorator: a function callable from kernels, inlined into them."""
    return DeviceFunction(fn)


_grid_sync_counters: dict = {}


def grid_sync_counter(xp):
    """The grid_sync counter of the current device and stream, for kernels that call grid_sync(counter): a barrier
    leaves it ready for the next, so it is never reset; one per stream, so that kernels on two streams never share
    one. xp: cupy, or numpy for the simulator (a fresh zero counter)."""
    if xp is np:
        return np.zeros(1, np.uint32)
    key = (xp.cuda.runtime.getDevice(), xp.cuda.get_current_stream().ptr)
    counter = _grid_sync_counters.get(key)
    if counter is None:
        counter = _grid_sync_counters[key] = xp.zeros(1, xp.uint32)
    return counter
