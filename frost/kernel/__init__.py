"""The kernel language: GPU kernels written in Python (`@frost.kernel`), compiled by NVRTC, simulated on the CPU."""
import sys
import types as _types

from frost.kernel.api import CudaSource, DeviceFunction, Kernel, cuda_source, device, kernel
from frost.kernel.builtins import *  # noqa: F401,F403 (tx, bx, sqrt, shared, ...: the language's names)
from frost.kernel.builtins import BUILTINS
from frost.kernel.compile import stats as compile_stats
from frost.kernel.frontend import KernelError
from frost.kernel.simulate import SimulationError
from frost.kernel.types import Array, Const, bf16, f16, f32, f64, i32, i64, u32, u8
from frost.kernel.types import boolean as bool_
from frost.kernel.lib import mma_tile, warp_max, warp_min, warp_sum

kernel.device = device


class _CallableModule(_types.ModuleType):
    """`frost.kernel` is both this package and the decorator: `@frost.kernel`, `@frost.kernel.device`."""

    def __call__(self, fn):
        return kernel(fn)


sys.modules[__name__].__class__ = _CallableModule
