"""The kernel language: GPU kernels written in Python (`@frost.kernel`), compiled by NVRTC, simulated on the CPU.

    from frost.kernel import kernel, f32, i32, Array, bx, tx, cdiv

    @kernel
    def scale(x: Array[f32], a: f32, n: i32):
        i = bx * 256 + tx
        if i < n:
            x[i] *= a

    scale[cdiv(n, 256), 256](x, 2.0, n)           # on the GPU (CuPy arrays or CUDA tensors), current stream
    scale.simulate[cdiv(n, 256), 256](x, 2.0, n)  # on the CPU (NumPy arrays), thread by thread
    scale.source                                   # the generated CUDA C++ (with #line directives)
    scale.compile("sm_90")                         # the cubin, from NVRTC or the disk cache

Semantics (the simulator implements these; float results can differ from the GPU's in the last bits, see "Floats"):
- Types: f32 f16 bf16 f64 i32 i64 u32 u8 bool; Array[T] (pointer + length), Array[T, 2] (strided 2-D view).
- Literals adapt to the other operand (`x * 2` keeps x's type); alone, int literals are i32 and float literals
  f32. Arithmetic follows C: bool/u8 compute as i32, f16/bf16 compute as f32, int with float gives the float,
  i32 with u32 gives u32, narrower with wider gives the wider. Unsigned integers wrap on overflow (u32 modulo
  2^32). Signed overflow (i32, i64) is undefined in the generated C++: the simulator wraps, but the GPU compiler
  may assume it never happens (an H200 found `j * 1000000000 < 0` false for j = 3); compute in u32 or i64.
- `mulhi(a, b)`: the high 32 bits of the exact 64-bit product of two u32 (CUDA's `__umulhi`) or two i32 (`__mulhi`).
- `fast_exp2(x)`: 2^x in f32 by one `ex2.approx.ftz.f32`, subnormal inputs and results flushed to zero (`exp2` keeps
  them with a few more instructions).
- Vector access on 1-D arrays: `a, b, c, d = load4(x, i)` and `store4(x, i, a, b, c, d)` move 4 elements in one
  access (16 bytes of f32/i32/u32, 8 of bf16/f16), `load2`/`store2` two, `load8`/`store8` eight bf16/f16 (16
  bytes); `ldg4(x, i)` is load4 of 4-byte elements through the read-only cache. i must be a multiple of the count
  and the array aligned to the access's bytes (the simulator checks both, the launch checks the pointers).
  `ldg(x, i)` is a scalar read-only load. Unpacking may target elements: `r[0], r[1] = f(...)`; `load8_into(v, x, i)`
  unpacks load8 into the local array v (converting to its elements); `load8_f32_into` is its float32 twin (two
  load4), `store8_from(x, i, v)` / `store8_f32_from` store v's eight values; a kernel made for either type picks
  the pair in Python (frost/accel/add.py).
- `launch_bounds(MAX_THREADS[, MIN_BLOCKS])` as a statement of a kernel's body is CUDA's `__launch_bounds__`;
  `swizzle(row, col, COLS)` is the XOR-swizzled column of a 16-bit shared tile (conflict-free ldmatrix, no padding).
- `k.inspect(arch, **consts)` returns the PTX and ptxas's registers/spills/stack; `k.ptx(arch, **consts)` the PTX.
- `/` is float division (f32 for integers); `//` and `%` truncate toward zero like C (`-7 // 2 == -3`,
  `-7 % 2 == -1`); on floats `//` is trunc(a / b) and `%` is fmod. `cdiv(a, b)` is (a + b - 1) // b, folded alike.
- A literal must fit the type it takes (`x < 3000000000` with x: i32 is an error: write i64(3000000000)); a float
  literal beyond f32's range is inf. Float -> integer casts truncate toward zero and saturate at the type's range,
  NaN -> 0, or INT64_MIN for i64 (the GPU's cvt.rzi, measured on an H200; u8 keeps the low byte of the u32
  conversion). f64 -> bf16/f16 rounds through f32.
- Floats: NVRTC contracts `a * b + c` into one fused multiply-add (rounded once; NVRTC's default --fmad=true, kept
  for speed), while the simulator rounds the product and the sum separately. Float results of the GPU and the
  simulator can therefore differ in the last bits: compare them with a tolerance (integer results are exact).
- `and`/`or`/`not` as conditions take any numbers (Python's truth, a bf16/f16 compared with 0); `a and b` / `a or b`
  as a value needs bool operands (a kernel gives a bool, not one of the operands as Python does).
- `atomic_max`/`atomic_min` on f32 ignore a NaN value (as fmaxf/fminf) and replace a stored NaN.
- A local's type is its first assignment's (or `x: f64 = 0`); assigning another type is an error, so is an
  augmented assignment that would change it (`acc = 0; acc += 0.5`). Storing into an array element converts
  (f32 into bf16 rounds to nearest even) except float into integer, which needs a cast: `i32(x)`; the same holds
  for `k: i32 = x`, a device function's parameters and its declared return type. A device function without a return
  annotation returns the type all its returns agree on (a literal adopts the others': `return 0` beside `return x`
  returns x's type) and must return on every path. Names of parameters and locals may not be the index names
  (tx, lane, ...) nor start with frost_ or _fk_ (generated names). A cast may name
  its type through any name bound to it: `T(x)` in a kernel made by a factory over the element type T.
- `Const[int]` parameters (and `N: Const[int] = ...` inside) are compile-time constants: one cubin per value.
  `k.prefetch(**consts)` starts a specialization's compile on the background threads; `@kernel.warm` over `@kernel`
  (no Consts) queues the kernel's compile at the process's first GPU launch of any Frost kernel.
- Loops: `range(a, b, step)` (bounds evaluated once; a constant step below -1 needs a signed loop variable),
  `static_range(n)` (unrolled), `for i, j in grid(m, n)` (extents evaluated once; `break` leaves the whole
  grid). Loop variables cannot be assigned or used after their loop.
- `syncthreads()` waits for every thread of the block that has not exited; warp operations (shuffles, ballot,
  ldmatrix, mma) need all 32 lanes of the warp at the same operation, as `__shfl_sync(0xffffffff, ...)` does.
- `bar_sync(id, threads)` / `bar_arrive(id, threads)`: named barrier `id` (1..15), complete when `threads` threads
  (a multiple of 32; a warp arrives whole) arrived; bar_sync waits, bar_arrive signals and goes on (warp-specialized
  producers and consumers). `setmaxnreg_inc(n)` / `setmaxnreg_dec(n)`: Hopper's register reallocation for a
  warpgroup (sm_90a; the kernel needs launch_bounds(MAX_THREADS, MIN_BLOCKS); the simulator skips it).
- mbarriers (sm_90a), elements of a shared Array[i64]: `mbarrier_init(bars, i, count)` (one thread, then a
  syncthreads), `mbarrier_arrive(bars, i)`, `mbarrier_arrive_expect_tx(bars, i, nbytes)`, `mbarrier_wait(bars, i,
  parity)` (until the phase of that parity completed); `cp_async_bulk(dst, di, src, si, nbytes, bars, i)` copies
  nbytes (a multiple of 16) from global to shared memory and completes them on the barrier. The simulator lands a
  bulk copy when its phase completes, so a read before the wait sees stale data (and races).
  `cp_reduce_async_bulk_add(dst, di, src, si, nbytes)` adds f32 from shared into global memory (bulk groups:
  `cp_async_bulk_commit()`, `cp_async_bulk_wait_read(n)`, `cp_async_bulk_wait(n)`).
- TMA tensor maps: `tensor_map(array, box, swizzle=128)` (host side; NumPy for the simulator, CuPy for the GPU)
  describes a strided array and a box, outermost first; a kernel takes it as a `TensorMap[T, rank]` parameter and
  `cp_async_bulk_tensor(dst, di, tmap, coords, bars, i)` copies the box at coords into shared memory, swizzled as
  wgmma reads it, zeros where the box leaves the array, completing its bytes (tmap's box_bytes) on the barrier.
- `grid_sync(counter)` waits for every block of the grid (global writes before it are visible after it), in the
  kernel body only; `counter` is a one-element Array[u32] parameter, zeroed once and then kept (never reset). Every
  block must be resident at once: launch at most one block per SM (or as many as the occupancy allows) and let
  every block reach every grid_sync; a block left waiting for seconds traps (the launch fails with a CUDA error
  instead of hanging). The simulator runs such a kernel's blocks side by side, barrier to barrier.
- `cp_async16` copies land at `cp_wait`; the simulator performs them there, so a missing wait reads stale data, and
  a `cp_wait` while copies wait for their `cp_commit` is an error (the wait covers committed groups only).
- `mma(c, a, b)` is the tensor-core step its fragments' types name: bf16/f16 a (8) and b (4) is `mma_16x8x16`;
  f32 a (4) and b (2) is m16n8k8 on TF32 (the operands' low 13 mantissa bits dropped, as the hardware reads them;
  fragments a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4), b0 (t, g), b1 (t + 4, g), g = lane // 4,
  t = lane % 4), so one kernel source serves both element types. `ldmatrix_x4` / `ldmatrix_x2` (not `.trans`) of
  a shared f32 tile fill f32 fragments: a row's 16 bytes are 4 values, lane (g, t) gets value (g, t) of each matrix.
- Unassigned shared and local float arrays start as NaN in the simulator (garbage on the GPU).
- Hopper warpgroup MMA (a kernel using any of these is compiled for sm_90a; other GPUs are an error):
  `d = wgmma_desc(tile, (row, col), SWIZZLE[, LBO, SBO])` is the i64 shared-memory matrix descriptor (PTX ISA "Matrix
  Descriptor Format") of the K-major operand starting at tile[row, col]; SWIZZLE 128/64/32 bytes or 0; the byte
  offsets default, for a swizzled tile with SWIZZLE-byte rows, to LBO 16 (unused) and SBO 8 rows. Write such tiles
  with `swizzle(r, c, 64)` for 128B (bf16, 64 columns), starting on a 1024-byte boundary.
  `wgmma_descriptors_from_bases()` at the top of a kernel computes each such descriptor as its shared array's plus
  the tile's offset / 16 (fewer instructions, more registers held: the kernel's choice).
  `wgmma_bf16(acc, desc_a, desc_b, N[, scale_d])` is wgmma.mma_async.m64nNk16.f32.bf16.bf16 by a warpgroup (128
  threads): acc (local f32, N/2 per thread, the PTX m64nNk16 D fragment) += A[64, 16] @ B[N, 16]^T, both K-major;
  scale_d = 0 ignores acc. `wgmma_fence()` before the first wgmma and after touching acc; `wgmma_commit()` closes a
  group; `wgmma_wait(n)` waits until n groups remain. The simulator performs a group when wgmma_wait retires it
  (reading shared memory then, writing acc then: reading acc earlier reads the old value), requires a fence before
  each batch and a wait before exit. `fence_proxy_async()` makes this thread's shared-memory writes (stores, landed
  cp.async) visible to wgmma (fence.proxy.async.shared::cta): call it before the syncthreads that publishes a tile.
"""
import sys
import types as _types

from frost.kernel import builtins as _builtins
from frost.kernel.api import (CudaSource, DeviceFunction, Kernel, cuda_source, device, grid_sync_counter, kernel,
                              warm)
from frost.kernel.builtins import *  # noqa: F401,F403 (tx, bx, sqrt, shared, ...: the language's names)
from frost.kernel.compile import stats as compile_stats
from frost.kernel.frontend import KernelError
from frost.kernel.lib import (block_max, block_sum, load8_f32_into, load8_into, load8_of, mma_tile, store8_f32_from,
                              store8_from, store8_of, swizzle, warp_max, warp_min, warp_sum)
from frost.kernel.simulate import SimulationError
from frost.kernel.tma import tensor_map
from frost.kernel.types import Array, Const, TensorMap, bf16, f16, f32, f64, i32, i64, u32, u8
from frost.kernel.types import boolean as bool_

kernel.device = device
kernel.warm = warm

__all__ = ["kernel", "device", "warm", "cuda_source", "grid_sync_counter", "Kernel", "DeviceFunction", "CudaSource",
           "KernelError", "SimulationError", "compile_stats", "Array", "Const", "TensorMap", "tensor_map", "f16",
           "bf16", "f32", "f64", "i32", "i64", "u32", "u8", "bool_", "warp_sum", "warp_max", "warp_min", "block_sum",
           "block_max", "mma_tile", "swizzle", "load8_into", "load8_f32_into", "store8_from", "store8_f32_from",
           "load8_of", "store8_of"] + \
    list(_builtins.__all__)


class _CallableModule(_types.ModuleType):
    """`frost.kernel` is both this package and the decorator: `@frost.kernel`, `@frost.kernel.device`."""

    def __call__(self, fn):
        return kernel(fn)


sys.modules[__name__].__class__ = _CallableModule
