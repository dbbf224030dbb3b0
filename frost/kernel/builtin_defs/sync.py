"""Built-in barriers and launch hints: syncthreads, grid_sync, launch_bounds."""
from __future__ import annotations

from frost.kernel.builtin_defs.base import BuiltinDef, Checking, CudaBuilding, SimBuilding
from frost.kernel.types import ArrayType


class Syncthreads(BuiltinDef):
    def check(self, ck: Checking, node):
        ck.args(node, 0, "syncthreads")
        ck.out.has_yield = True
        return None

    def cuda(self, g: CudaBuilding, node, t) -> str:
        return "__syncthreads()"

    def sim(self, g: SimBuilding, node, t) -> str:
        return "(yield _SYNC)"


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
        if not ck.out.is_kernel or ck.loop_depth or node not in [getattr(x, "value", None)
                                                                 for x in ck.src.tree.body]:
            raise ck.src.error(node, "launch_bounds() must be a statement in the body of a kernel (not nested)")
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


DEFINITIONS = [Syncthreads("syncthreads"), GridSync("grid_sync"), LaunchBounds("launch_bounds")]
