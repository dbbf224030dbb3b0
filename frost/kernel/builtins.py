"""The kernel language's built-in names: objects to import, so that kernels read as ordinary Python."""
from __future__ import annotations


class Builtin:
    """A name that only means something inside a kernel (tx, sqrt, shared, ...)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<frost.kernel builtin {self.name}>"

    def __call__(self, *args, **kwargs):
        if self.name == "cdiv" and len(args) == 2:
            return -(-args[0] // args[1])
        raise RuntimeError(f"{self.name}() is a kernel built-in: it can be used only inside a @frost.kernel function")


INDEX_NAMES = ("tx", "ty", "tz", "bx", "by", "bz", "bdx", "bdy", "bdz", "gdx", "gdy", "gdz", "warp", "lane")
MATH_1 = ("sqrt", "rsqrt", "exp", "exp2", "log", "log2", "tanh", "sin", "cos", "floor", "ceil", "erf")
MATH_OTHER = ("abs", "min", "max", "fma", "pow", "mulhi", "fast_exp2")
VALUES = ("inf", "nan")
FUNCTIONS = ("cdiv", "len", "range", "grid", "static_range", "shared", "dynamic_shared", "local", "syncthreads",
             "grid_sync", "bar_sync", "bar_arrive", "setmaxnreg_inc", "setmaxnreg_dec",
             "mbarrier_init", "mbarrier_arrive", "mbarrier_arrive_expect_tx", "mbarrier_wait", "cp_async_bulk",
             "cp_async_bulk_tensor", "cp_reduce_async_bulk_add", "cp_async_bulk_commit", "cp_async_bulk_wait",
             "cp_async_bulk_wait_read",
             "atomic_add", "atomic_max", "atomic_min", "atomic_cas", "shfl_xor", "shfl_down", "shfl_up", "shfl_idx",
             "ballot", "cp_async16", "cp_commit", "cp_wait", "ldmatrix_x4", "ldmatrix_x2", "ldmatrix_x4_trans",
             "ldmatrix_x2_trans", "mma_16x8x16", "mma", "load4", "store4", "load2", "store2", "load8", "store8",
             "ldg", "ldg4",
             "launch_bounds", "wgmma_desc", "wgmma_discard", "wgmma_fence", "wgmma_commit", "wgmma_wait", "wgmma_bf16",
             "wgmma_bf16_rs", "wgmma_descriptors_from_bases",
             "fence_proxy_async")
ALL_NAMES = INDEX_NAMES + MATH_1 + MATH_OTHER + VALUES + FUNCTIONS
BUILTINS = {name: Builtin(name) for name in ALL_NAMES}
PYTHON_NAMES = ("abs", "min", "max", "pow", "len", "range")  # Python's own builtins: kernels use them by name
__all__ = [n for n in ALL_NAMES if n not in PYTHON_NAMES]
globals().update({n: BUILTINS[n] for n in __all__})
K_MAJOR, MN_MAJOR = 0, 1   # wgmma_bf16's B_MAJOR: B's K elements contiguous, or its N elements (imm-trans-b)
__all__ += ["K_MAJOR", "MN_MAJOR"]

# Device functions of frost.kernel.lib that a kernel may call without importing them (`acc += a @ b` calls mma_tile):
# lib registers them as it loads (the package imports it), so that the front end below it never imports it back
LIBRARY: dict[str, object] = {}


def register_library(*functions: object) -> None:
    """Make device functions callable by name from every kernel (frost.kernel.lib's warp_sum, mma_tile, ...)."""
    for fn in functions:
        LIBRARY[fn.__name__] = fn
