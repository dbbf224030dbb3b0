"""frost.Generator: a random generator of one's own, as torch.Generator, for the `generator=` argument of Frost's
random ops (rand, randn, randint, randperm, multinomial, bernoulli, normal, and the in-place uniform_, normal_,
exponential_, bernoulli_ ...):

    g = frost.Generator().manual_seed(0)
    a = frost.randn(3, generator=g)      # draws from g only: the global generator (frost.manual_seed) is untouched
    g.manual_seed(0)
    b = frost.randn(3, generator=g)      # the same numbers as a

On the CPU it draws from its own NumPy PCG64 generator; on a GPU (device="cuda") from its own Philox4x32-10 generator
(frost.accel.philox), so a Generator gives the same numbers as the global generator of its device seeded alike.
get_state / set_state use the byte formats of frost.get_rng_state (40 bytes, CPU) and frost.cuda.get_rng_state
(16 bytes, GPU). A new Generator starts from PyTorch's default seed, 67280421310721.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from frost.backend import Device, cpu
from frost.backend import cuda as backend_cuda
from frost.random import CUDA_STATE_BYTES, _as_bytes, _byte_tensor, _words, pcg64_state, set_pcg64_state
from frost.tensor import Tensor

__all__ = ["Generator", "DEFAULT_SEED"]

DEFAULT_SEED = 67280421310721  # PyTorch's default_rng_seed_val: a new torch.Generator's initial_seed()
_SEED_MODULUS = 1 << 64  # seeds are unsigned 64-bit, as PyTorch's: manual_seed(-1) is 2**64 - 1


class Generator:
    """A random generator on one device, with PyTorch's methods: manual_seed, seed, initial_seed, get_state and
    set_state (manual_seed and set_state return the generator, so they chain)."""

    def __init__(self, device: str | Device = "cpu") -> None:
        self.device = Device(device)
        self._initial_seed = DEFAULT_SEED
        self._engine: Any = None
        self.manual_seed(DEFAULT_SEED)

    def __repr__(self) -> str:
        return f"frost.Generator(device='{self.device}')"

    def manual_seed(self, seed: int) -> "Generator":
        """Restart from `seed` (an int; negative ones wrap to unsigned 64 bits, as PyTorch's)."""
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"Generator.manual_seed: the seed must be an int, got {type(seed).__name__} {seed!r}")
        self._initial_seed = int(seed) % _SEED_MODULUS
        if self.device.type == "cpu":
            self._engine = np.random.default_rng(self._initial_seed)
        elif self._engine is None:
            self._engine = backend_cuda.new_generator(self._initial_seed, self.device.index)
        else:  # in place: CUDA graphs captured with this generator follow the reseed
            self._engine.seed(self._initial_seed)
        return self

    def seed(self) -> int:
        """Restart from a seed drawn from the operating system's entropy, and return that seed."""
        fresh = int(np.random.SeedSequence().generate_state(1, np.uint64)[0])
        self.manual_seed(fresh)
        return fresh

    def initial_seed(self) -> int:
        """The seed this generator was last started from (by manual_seed or seed)."""
        return self._initial_seed

    def get_state(self) -> Tensor:
        """The state as a uint8 Tensor: 40 bytes (PCG64) on the CPU, 16 (Philox seed and offset) on a GPU."""
        if self.device.type == "cpu":
            return pcg64_state(self._engine.bit_generator)
        seed, offset = self._engine.get_state()
        return _byte_tensor(seed.to_bytes(8, "little") + offset.to_bytes(8, "little"))

    def set_state(self, new_state: Any) -> "Generator":
        """Restore a state that get_state returned (or its tolist())."""
        if self.device.type == "cpu":
            set_pcg64_state(self._engine.bit_generator, new_state, "Generator.set_state")
        else:
            seed, offset = _words(_as_bytes(new_state, CUDA_STATE_BYTES, "Generator.set_state"), (8, 8))
            self._engine.set_state((seed, offset))
        return self

    def engine_for(self, device: Device, who: str) -> Any:
        """The array generator to draw from for a result on `device` (NumPy's or Philox), which must be this
        generator's device: a draw never moves between devices silently."""
        if Device(device) != self.device:
            raise RuntimeError(f"{who}: the generator is on {self.device} but the result is on {device}; make the "
                               f"generator with frost.Generator(device='{device}')")
        return self._engine


def engine(generator: Any, device: Device, who: str) -> Any:
    """The array generator a random op draws from: `generator`'s (a frost.Generator on `device`), else the global
    one of the device (frost.manual_seed's; on the CPU, the calling thread's)."""
    if generator is None:
        return _global_engine(device)
    if not isinstance(generator, Generator):
        raise TypeError(f"{who}: generator must be a frost.Generator, got {type(generator).__name__}")
    return generator.engine_for(device, who)


def _global_engine(device: Device) -> Any:
    if device.type == "cpu":
        return cpu.generator()
    backend_cuda.gpu_cupy()  # Frost's message where there is no usable GPU, not CuPy's from inside a new generator
    return backend_cuda.generator(device.index)
