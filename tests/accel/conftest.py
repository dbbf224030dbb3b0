"""Fixtures of the acceleration layer's tests."""
import pytest

from frost import dispatch
from frost.kernel.api import Kernel


@pytest.fixture
def simulated_gpu(monkeypatch):
    """dispatch takes NumPy arrays for CuPy ones and launches run in the simulator: the CUDA fast paths on the CPU.
    Returns the names of the kernels launched (a test module may define its own fixture of this name instead)."""
    launches = []

    def simulate(self, cfg):
        launches.append(self.__name__)
        return self.simulate[cfg]
    monkeypatch.setattr(Kernel, "__getitem__", simulate)
    monkeypatch.setattr(dispatch, "device_of", lambda array: "cuda")
    return launches
