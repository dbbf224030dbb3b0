"""A stand-in for CuPy that records what the GPU launch path would load and launch (tests on the CPU)."""
import sys
import types

import numpy as np

from frost.kernel import api, pdl


class FakeArray:
    def __init__(self, a: np.ndarray) -> None:
        self.a = a
        self.dtype, self.shape, self.strides, self.size, self.ndim, self.flags = (
            a.dtype, a.shape, a.strides, a.size, a.ndim, a.flags)
        self.data = types.SimpleNamespace(ptr=a.ctypes.data)


FUNCTIONS = {}  # fake CUfunction handle -> FakeFunction


class FakeFunction:
    def __init__(self, name, launches):
        self.name, self.launches = name, launches
        self.max_dynamic_shared_size_bytes = 0
        self.ptr = id(self)
        FUNCTIONS[self.ptr] = self

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        self.launches.append(dict(name=self.name, grid=grid, block=block, args=args, smem=shared_mem, stream=stream,
                                  opt_in=self.max_dynamic_shared_size_bytes))


def install(monkeypatch):
    launches, loads = [], []

    class Module:
        def load(self, cubin):
            assert cubin[:4] == b"\x7fELF"
            loads.append(cubin)

        def get_function(self, name):
            return FakeFunction(name, launches)

    cp = types.ModuleType("cupy")
    cp.ndarray = FakeArray
    def func_set_attribute(ptr, attribute, value):
        assert attribute == 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        FUNCTIONS[ptr].max_dynamic_shared_size_bytes = value

    cp.cuda = types.SimpleNamespace(
        function=types.SimpleNamespace(Module=Module),
        driver=types.SimpleNamespace(funcSetAttribute=func_set_attribute),
        runtime=types.SimpleNamespace(getDevice=lambda: 0),
        Device=lambda i=0: types.SimpleNamespace(compute_capability="90"),
        get_current_stream=lambda: "current-stream")
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setattr(pdl, "enabled", False)  # CuPy's launch path (test_kernel_pdl.py checks the other)
    monkeypatch.setattr(api, "_warm", [])  # no real kernel.warm compiles queued by a fake first launch
    monkeypatch.setattr(api, "_warmed_devices", {})
    return types.SimpleNamespace(launches=launches, loads=loads)
