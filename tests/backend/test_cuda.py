"""Tests for frost/backend/cuda.py on a machine without a usable GPU: Frost's message, whatever CuPy raises."""
import sys
import types

import pytest

import frost
from frost.backend import cuda
from frost.accel.philox import PhiloxGenerator


class CUDARuntimeError(RuntimeError):
    """CuPy's error type for a failed CUDA runtime call (cupy_backends.cuda.api.runtime.CUDARuntimeError)."""


def broken_cupy(probe):
    """A CuPy that imports but whose CUDA calls fail as `probe` does; allocating would fail with CuPy's own error."""
    def alloc(*args, **kwargs):
        raise CUDARuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime "
                               "version (reached CuPy: the check came too late)")

    runtime = types.SimpleNamespace(getDeviceCount=probe, getDevice=alloc)
    return types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime, Device=alloc), asarray=alloc, full=alloc)


def raises(message):
    def probe():
        raise CUDARuntimeError(message)
    return probe


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(cuda, "_gpu_seen", False, raising=False)
    return monkeypatch


@pytest.mark.parametrize("probe, reason", [
    (raises("cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version"),
     "CuPy reports cudaErrorInsufficientDriver: CUDA driver version is insufficient"),
    (raises("cudaErrorNoDevice: no CUDA-capable device is detected"), "CuPy reports cudaErrorNoDevice"),
    (lambda: 0, "CUDA sees no GPU"),
])
def test_no_usable_gpu_raises_frosts_message_whatever_cupy_says(fresh, probe, reason):
    fresh.setattr(cuda, "cupy", lambda: broken_cupy(probe))
    assert not frost.cuda.is_available()
    for make in (lambda: frost.ones(2).to("cuda"), lambda: frost.ones(2).cuda(), lambda: frost.zeros(2, device="cuda"),
                 lambda: frost.randn(2, device="cuda"), lambda: frost.tensor([1.0], device="cuda:1")):
        with pytest.raises(RuntimeError) as info:
            make()
        message = str(info.value)
        assert "too late" not in message
        assert message.startswith("frost: CUDA is not available (") and reason in message
        assert "pip install frost-dl[cuda]" in message and "frost.cuda.is_available()" in message
        assert isinstance(info.value, frost.cuda.CudaUnavailableError)


def test_missing_cupy_gives_the_same_message(fresh):
    fresh.setattr(cuda, "_cupy", None)
    fresh.setitem(sys.modules, "cupy", None)  # `import cupy` raises ImportError
    assert not frost.cuda.is_available()
    with pytest.raises(RuntimeError, match=r"^frost: CUDA is not available \(CuPy is not installed\); Frost's GPU "
                                           r"path needs CuPy \(install with `pip install frost-dl\[cuda\]`\)"):
        frost.ones(2).to("cuda")


def test_a_gpu_that_answered_once_is_not_asked_again(fresh):
    calls = []
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(
        getDeviceCount=lambda: calls.append(1) or 1)))
    fresh.setattr(cuda, "cupy", lambda: fake)
    assert cuda.gpu_cupy() is fake and cuda.gpu_cupy() is fake
    assert calls == [1]  # the check costs one runtime call per process, not one per op


def test_restore_generators_resets_only_those_made_since_the_snapshot(monkeypatch):
    class Generator:
        def __init__(self, seed):
            self.seeded = seed

        def seed(self, seed):
            self.seeded = seed

    monkeypatch.setattr(cuda, "_seed", 5)
    monkeypatch.setattr(cuda, "_generators", {0: Generator(5)})
    snapshot = cuda.generators_snapshot()
    cuda.manual_seed(9)  # inside a fork: a reseed, and a generator made on another GPU
    cuda._generators[1] = Generator(9)
    cuda.restore_generators(snapshot)
    assert cuda._seed == 5 and snapshot == (5, frozenset({0}))
    assert cuda._generators[1].seeded == 5  # made since: reset to the snapshot's seed
    assert cuda._generators[0].seeded == 9  # existed: left for fork_rng to set its saved state


def test_the_gpu_generator_comes_from_the_factory_that_frost_accel_philox_registered(monkeypatch):
    assert cuda._generator_factory is PhiloxGenerator   # registered by importing frost
    made = []
    monkeypatch.setattr(cuda, "_generator_factory", PhiloxGenerator)   # put back after the test's registration
    monkeypatch.setattr(cuda, "_generators", {})
    monkeypatch.setattr(cuda, "_seed", 7)
    cuda.register_generator_factory(lambda seed, index: made.append((seed, index)) or f"gen{index}")
    assert cuda.generator(3) == "gen3" and cuda.generator(3) == "gen3"   # one per device, made once
    assert made == [(7, 3)]
    assert cuda.new_generator(11, 3) == "gen3" and made == [(7, 3), (11, 3)]   # a generator of its own: made anew


def test_a_missing_generator_registration_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(cuda, "_generators", {})
    monkeypatch.setattr(cuda, "_generator_factory", None)
    with pytest.raises(RuntimeError, match=r"^frost.backend.cuda.generator: no GPU generator is registered; import "
                                           r"frost \(or frost.accel.philox"):
        cuda.generator(0)
    with pytest.raises(RuntimeError, match=r"^frost.backend.cuda.new_generator: no GPU generator is registered"):
        cuda.new_generator(0, 0)
    with pytest.raises(TypeError, match="register_generator_factory: factory must be callable, got int"):
        cuda.register_generator_factory(5)
