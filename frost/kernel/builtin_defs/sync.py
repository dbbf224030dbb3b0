"""Built-in barriers and launch hints: syncthreads, named barriers (bar_sync, bar_arrive), grid_sync, launch_bounds,
register reallocation (setmaxnreg_inc, setmaxnreg_dec)."""
from __future__ import annotations

from frost.kernel.builtin_defs.base import BuiltinDef, Checking, CudaBuilding, SimBuilding, kernel_statement
from frost.kernel.types import ArrayType, Scalar, Weak

NAMED_BARRIERS = 16   # a block's hardware barriers; syncthreads() uses barrier 0


class Syncthreads(BuiltinDef):
    def check(self, ck: Checking, node):
        ck.args(node, 0, "syncthreads")
        ck.out.has_yield = True
        return None

    def cuda(self, g: CudaBuilding, node, t) -> str:
        return "__syncthreads()"

    def sim(self, g: SimBuilding, node, t) -> str:
        return "(yield _SYNC)"


class NamedBarrier(BuiltinDef):
    """bar_sync(id, threads) / bar_arrive(id, threads): PTX's bar.sync / bar.arrive on named barrier `id` (1..15;
    syncthreads() owns 0), completed when `threads` threads (a multiple of 32) have arrived. bar_sync waits for that;
    bar_arrive signals and goes on. A producer's writes before its bar_arrive are visible to a consumer after its
    bar_sync of the same barrier: the pattern of warp-specialized kernels (FlashAttention-3's producer and consumer
    warpgroups), where syncthreads() would stall the warps that do not take part."""

    def __init__(self, name: str, arrive: bool) -> None:
        super().__init__(name)
        self.arrive = arrive

    def check(self, ck: Checking, node):
        for arg, t in zip(node.args, ck.args(node, 2, self.name)):
            if not (isinstance(t, (Scalar, Weak)) and t.is_int):
                raise ck.src.error(arg, f"{self.name}(id, threads) takes integers, got {t}")
        barrier, threads = (ck.out.values.get(id(a)) for a in node.args)
        if isinstance(barrier, int) and not 1 <= barrier < NAMED_BARRIERS:
            raise ck.src.error(node.args[0], f"{self.name}: barrier id {barrier} is not in 1..{NAMED_BARRIERS - 1} "
                                             "(0 is syncthreads()'s)")
        if isinstance(threads, int) and not (0 < threads <= 1024 and threads % 32 == 0):
            raise ck.src.error(node.args[1], f"{self.name}: {threads} threads is not a multiple of 32 in 32..1024 "
                                             "(warps arrive whole)")
        ck.out.has_yield = True
        ck.out.uses_named_barriers = True
        return None

    def cuda(self, g: CudaBuilding, node, t) -> str:
        op = "bar.arrive" if self.arrive else "bar.sync"
        return (f'asm volatile("{op} %0, %1;" :: "r"((int)({g.ex(node.args[0])})), '
                f'"r"((int)({g.ex(node.args[1])})) : "memory")')

    def sim(self, g: SimBuilding, node, t) -> str:
        return f"(yield ('bar', int({g.ex(node.args[0])}), int({g.ex(node.args[1])}), {self.arrive}))"


class SetMaxNReg(BuiltinDef):
    """setmaxnreg_inc(N) / setmaxnreg_dec(N): Hopper's setmaxnreg (sm_90a), raising or lowering the registers per
    thread of the calling warpgroup to N (24..256, a multiple of 8), so that producer warpgroups that only issue
    copies give registers to the consumers that hold accumulators. Every thread of the warpgroup must execute it, in
    the kernel's body, and the kernel must start with launch_bounds(MAX_THREADS, MIN_BLOCKS): without both bounds
    ptxas cannot tell the register count at entry and drops the instruction (warning C7508).
    The simulator has no register file: there it checks nothing at run time and does nothing."""

    def __init__(self, name: str, op: str) -> None:
        super().__init__(name)
        self.op = op

    def check(self, ck: Checking, node):
        if len(node.args) != 1:
            raise ck.src.error(node, f"{self.name}(registers) takes 1 argument, got {len(node.args)}")
        n = ck.const_int(node.args[0])
        if not (24 <= n <= 256 and n % 8 == 0):
            raise ck.src.error(node.args[0], f"{self.name}({n}): registers must be a multiple of 8 in 24..256")
        bounds = ck.out.launch_bounds if ck.out.is_kernel else None
        if bounds is None or len(bounds) != 2:
            raise ck.src.error(node, f"{self.name}() needs launch_bounds(MAX_THREADS, MIN_BLOCKS) at the top of the "
                                     "kernel itself (ptxas ignores setmaxnreg when it cannot tell the register count "
                                     "at entry: warning C7508)")
        ck.out.needs_sm90a = True   # an arch-specific Hopper instruction
        return None

    def cuda(self, g: CudaBuilding, node, t) -> str:
        n = int(g.fn.values[id(node.args[0])])
        return f'asm volatile("setmaxnreg.{self.op}.sync.aligned.u32 {n};" ::: "memory")'

    def sim(self, g: SimBuilding, node, t) -> str:
        return "None"


class GridSync(BuiltinDef):
    """grid_sync(counter): a barrier of the whole grid (the simulator runs such a kernel's blocks side by side)."""

    def check(self, ck: Checking, node):
        ck.args(node, 1, "grid_sync")
        at = ck.expr(node.args[0])
        if not (isinstance(at, ArrayType) and at.kind == "param" and at.elem.name == "u32" and at.ndim == 1):
            raise ck.src.error(node, f"grid_sync(counter) needs a 1-D Array[u32] kernel parameter (a barrier "
                                     f"counter the caller zeroes once and keeps), got {at}")
        ck.out.has_yield = True
        ck.out.uses_grid_sync = True
        return None

    def cuda(self, g: CudaBuilding, node, t) -> str:
        return f"frost_grid_sync((unsigned*){g.array_ref(node.args[0])})"

    def sim(self, g: SimBuilding, node, t) -> str:
        return f"((yield _GRID_SYNC) if {g.ex(node.args[0])}.ld(0) is not None else None)"


class LaunchBounds(BuiltinDef):
    """launch_bounds(MAX_THREADS[, MIN_BLOCKS]): CUDA's __launch_bounds__, so ptxas may budget registers for
    MIN_BLOCKS blocks of MAX_THREADS threads per SM; a statement at the top of a kernel. The C++ builder writes it
    into the kernel's signature (and skips the statement); the launch checks the block size against it."""

    def check(self, ck: Checking, node):
        kernel_statement(ck, node, self.name)
        if not 1 <= len(node.args) <= 2:
            raise ck.src.error(node, "launch_bounds(max_threads[, min_blocks]) takes 1 or 2 arguments")
        vals = tuple(ck.const_int(a) for a in node.args)
        if vals[0] < 1 or vals[0] > 1024 or (len(vals) == 2 and vals[1] < 1):
            raise ck.src.error(node, f"launch_bounds{vals}: max_threads must be 1..1024 and min_blocks positive")
        if ck.out.launch_bounds is not None:
            raise ck.src.error(node, "launch_bounds() is given twice")
        ck.out.launch_bounds = vals
        return None

    def sim(self, g: SimBuilding, node, t) -> str:
        return "None"


DEFINITIONS = [Syncthreads("syncthreads"), NamedBarrier("bar_sync", arrive=False),
               NamedBarrier("bar_arrive", arrive=True), GridSync("grid_sync"), LaunchBounds("launch_bounds"),
               SetMaxNReg("setmaxnreg_inc", "inc"), SetMaxNReg("setmaxnreg_dec", "dec")]
