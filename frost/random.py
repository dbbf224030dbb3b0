"""The state of Frost's random generators: save it, restore it, or run a block on a fork of it.

As torch.get_rng_state / set_rng_state, torch.cuda.get_rng_state / set_rng_state and torch.random.fork_rng:

    state = frost.get_rng_state()        # the CPU generator's state
    a = frost.randn(3)
    frost.set_rng_state(state)
    b = frost.randn(3)                   # the same numbers as a, bit for bit

    with frost.random.fork_rng():        # the draws inside change no state outside
        frost.rand(10)

A state is a uint8 Tensor (a byte string, as PyTorch's ByteTensor states), so that it goes into a checkpoint with
frost.save and into JSON as `state.tolist()` (a list of ints, which set_rng_state accepts back); no pickle:

- CPU (40 bytes): NumPy's PCG64 state as four little-endian integers: the 128-bit state, the 128-bit increment (odd),
  then has_uint32 and uinteger (32 bits each: the half of a 64-bit word kept for the next 32-bit draw). It is the
  state of the generator the calling thread draws from: the global one (reseeded by frost.manual_seed), or inside a
  DataLoader batch that batch's own (frost.backend.cpu.use_generator).
- CUDA (16 bytes, per GPU; frost.cuda.get_rng_state): the Philox key as one 64-bit seed and the 64-bit offset, the
  next unused counter (frost.accel.philox), as PyTorch's CUDA state is seed and offset. The offset lives on the device,
  where every draw and every frost.jit replay advances it: reading it waits for the work queued so far, so it is
  the state after every replay launched before, and it cannot be read inside a captured step. set_rng_state writes
  seed and offset in place with a kernel, so that steps captured earlier draw from the restored state.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator

import numpy as np

from frost.backend import Device, cpu
from frost.backend import cuda as backend_cuda
from frost.tensor import Tensor

__all__ = ["get_rng_state", "set_rng_state", "fork_rng", "get_cuda_rng_state", "set_cuda_rng_state"]

CPU_STATE_BYTES = 40  # PCG64: state and increment (16 bytes each), has_uint32 and uinteger (4 bytes each)
CUDA_STATE_BYTES = 16  # Philox: seed and offset (8 bytes each)


# ---------------------------------------------------------------- states as bytes
def _as_bytes(state: Any, expected: int, who: str) -> bytes:
    """A state as get_rng_state returns it (a uint8 Tensor), or as a NumPy array, bytes or a list of ints (its
    tolist(), from JSON): `expected` bytes, else a ValueError naming `who`."""
    kind = type(state).__name__
    if isinstance(state, Tensor):
        state = state.detach().numpy()  # a copy from a GPU
    if isinstance(state, (bytes, bytearray)):
        raw = bytes(state)
    else:
        values = np.asarray(state)
        if values.dtype != np.uint8 and not (values.dtype.kind in "iu" and values.size and
                                             0 <= values.min() and values.max() <= 255):
            raise ValueError(f"{who}: a state is a uint8 tensor (or a list of ints 0..255) as get_rng_state returns "
                             f"it, got {kind} of dtype {values.dtype}")
        raw = values.astype(np.uint8).tobytes()
    if len(raw) != expected:
        raise ValueError(f"{who}: a state has {expected} bytes, got {len(raw)}; pass what get_rng_state returned")
    return raw


def _byte_tensor(raw: bytes) -> Tensor:
    return Tensor(np.frombuffer(raw, dtype=np.uint8).copy())


def _words(raw: bytes, sizes: Iterable[int]) -> list[int]:
    """Little-endian unsigned integers of these byte sizes, read one after the other."""
    out, at = [], 0
    for size in sizes:
        out.append(int.from_bytes(raw[at:at + size], "little"))
        at += size
    return out


# ---------------------------------------------------------------- CPU
def _pcg64(who: str):
    bit_generator = cpu.generator().bit_generator
    if bit_generator.state["bit_generator"] != "PCG64":
        raise TypeError(f"{who}: the calling thread draws from a {bit_generator.state['bit_generator']} generator; "
                        f"only Frost's PCG64 generators (numpy.random.default_rng) have a saved state format")
    return bit_generator


def pcg64_state(bit_generator) -> Tensor:
    """A PCG64 bit generator's state as a 40-byte uint8 Tensor (see the module docstring); frost.Generator's too."""
    state = bit_generator.state
    words = (state["state"]["state"], state["state"]["inc"], state["has_uint32"], state["uinteger"])
    return _byte_tensor(b"".join(int(w).to_bytes(n, "little") for w, n in zip(words, (16, 16, 4, 4))))


def set_pcg64_state(bit_generator, new_state: Any, who: str) -> None:
    """Write pcg64_state()'s Tensor (or its tolist()) into a PCG64 bit generator, in place; errors name `who`."""
    state, inc, has_uint32, uinteger = _words(_as_bytes(new_state, CPU_STATE_BYTES, who), (16, 16, 4, 4))
    if inc % 2 == 0 or has_uint32 > 1:  # PCG64's increment is always odd: these bytes were not made by get_rng_state
        raise ValueError(f"{who}: not a CPU generator state (increment {inc:#x} is even or has_uint32 {has_uint32} "
                         f"is not 0 or 1)")
    bit_generator.state = {"bit_generator": "PCG64", "state": {"state": state, "inc": inc},
                           "has_uint32": has_uint32, "uinteger": uinteger}


def get_rng_state() -> Tensor:
    """The CPU generator's state as a 40-byte uint8 Tensor (see the module docstring)."""
    return pcg64_state(_pcg64("frost.get_rng_state"))


def set_rng_state(new_state: Any) -> None:
    """Restore the CPU generator's state from get_rng_state()'s Tensor (or its tolist()); the generator is changed in
    place, so code holding it (frost.backend.cpu.generator()) follows."""
    set_pcg64_state(_pcg64("frost.set_rng_state"), new_state, "frost.set_rng_state")


# ---------------------------------------------------------------- CUDA
def _device_index(device: int | str | Device | None) -> int | None:
    """The GPU a state belongs to: None for the current one ('cuda' too, as in PyTorch), else its index."""
    if device is None or (isinstance(device, str) and device == "cuda"):
        return None
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    spec = Device(device)
    if spec.type != "cuda":
        raise ValueError(f"frost.cuda RNG state: expected a GPU (an index, 'cuda' or 'cuda:N'), got {device!r}")
    return spec.index


def _resolved(index: int | None) -> int:
    """A GPU index, the current GPU's for None (fixed on entering fork_rng: the block may change devices)."""
    return backend_cuda.gpu_cupy().cuda.Device().id if index is None else index


def get_cuda_rng_state(device: int | str | Device | None = None) -> Tensor:
    """A GPU's Philox state (seed, offset) as a 16-byte uint8 Tensor; reads the device (see the module docstring)."""
    seed, offset = backend_cuda.generator(_device_index(device)).get_state()
    return _byte_tensor(seed.to_bytes(8, "little") + offset.to_bytes(8, "little"))


def set_cuda_rng_state(new_state: Any, device: int | str | Device | None = None) -> None:
    """Restore a GPU's Philox seed and offset from get_cuda_rng_state()'s Tensor, in place on the device."""
    seed, offset = _words(_as_bytes(new_state, CUDA_STATE_BYTES, "frost.cuda.set_rng_state"), (8, 8))
    backend_cuda.generator(_device_index(device)).set_state((seed, offset))


# ---------------------------------------------------------------- fork_rng
@contextlib.contextmanager
def fork_rng(devices: Iterable[int | str | Device] | None = None, enabled: bool = True) -> Iterator[None]:
    """Run a block whose draws leave Frost's generators as they were: the CPU state and the GPUs' states are saved on
    entry and restored on exit (also on an exception), as torch.random.fork_rng.

    devices=None forks every GPU: those whose generator exists are restored, a generator first made inside the
    block is reset to the seed it was made with (offset 0, as if it were made after the block), and a reseed by
    frost.manual_seed inside is undone. Otherwise only the listed GPUs are forked. enabled=False does nothing."""
    if not enabled:
        yield
        return
    cpu_state = get_rng_state()
    snapshot = backend_cuda.generators_snapshot()
    indices = snapshot[1] if devices is None else {_resolved(_device_index(d)) for d in devices}
    gpu_states = {index: get_cuda_rng_state(index) for index in indices}
    try:
        yield
    finally:
        set_rng_state(cpu_state)
        for index, state in gpu_states.items():
            set_cuda_rng_state(state, index)
        if devices is None:
            backend_cuda.restore_generators(snapshot)
