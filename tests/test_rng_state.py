"""Tests for frost/random.py: saving and restoring the generators' states (CPU, and GPU seed and offset), and
fork_rng. The oracle for the CPU state is NumPy's own PCG64 state; for the GPU, the draws themselves."""
import json

import numpy as np
import pytest

import frost
import frost.nn.functional as F
from frost.backend import cpu
from frost.backend import cuda as backend_cuda
from frost.accel import philox as P


def draws(device: str = "cpu") -> list[np.ndarray]:
    """One of each kind of draw: normal, uniform (float32, an odd count, so a 32-bit half stays cached, and float64),
    integers, a permutation, a dropout mask."""
    out = [frost.randn(5, 7, device=device), frost.rand(3, device=device),
           frost.rand(4, dtype="float64", device=device), frost.randint(0, 10, (64,), device=device),
           frost.randperm(100, device=device), F.dropout(frost.ones(32, 16, device=device), 0.3)]
    return [backend_cuda.to_host(t.data) if device != "cpu" else t.numpy().copy() for t in out]


def assert_same(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)


# ---------------------------------------------------------------- CPU
def test_set_rng_state_repeats_every_kind_of_draw_bit_for_bit():
    frost.manual_seed(7)
    frost.rand(1)  # a float32 draw leaves half a 64-bit word cached: the state must carry it
    state = frost.get_rng_state()
    first = draws()
    assert not all(np.array_equal(x, y) for x, y in zip(first, draws()))  # the stream moves on
    frost.set_rng_state(state)
    assert_same(draws(), first)


def test_the_state_is_numpys_pcg64_state_in_40_little_endian_bytes():
    frost.manual_seed(3)
    frost.rand(1)
    numpy_state = cpu.generator().bit_generator.state
    state = frost.get_rng_state()
    assert state.dtype == frost.uint8 and state.shape == (40,)
    raw = state.numpy().tobytes()
    assert int.from_bytes(raw[:16], "little") == numpy_state["state"]["state"]
    assert int.from_bytes(raw[16:32], "little") == numpy_state["state"]["inc"]
    assert int.from_bytes(raw[32:36], "little") == numpy_state["has_uint32"] == 1
    assert int.from_bytes(raw[36:], "little") == numpy_state["uinteger"]


def test_the_state_round_trips_through_a_checkpoint_and_json(tmp_path):
    frost.manual_seed(11)
    state = frost.get_rng_state()
    expected = draws()
    frost.save({"rng": state}, tmp_path / "rng.safetensors")
    frost.set_rng_state(frost.load(tmp_path / "rng.safetensors")["rng"])
    assert_same(draws(), expected)
    frost.set_rng_state(json.loads(json.dumps(state.tolist())))  # a list of ints, as JSON keeps it
    assert_same(draws(), expected)


def test_set_rng_state_changes_the_generator_in_place():
    held = cpu.generator()
    state = frost.get_rng_state()
    a = held.random(3)
    frost.set_rng_state(state)
    assert cpu.generator() is held
    np.testing.assert_array_equal(held.random(3), a)


def test_the_state_is_that_of_the_generator_the_thread_draws_from():
    """Inside a DataLoader batch (use_generator) the state is the batch's own; the global one is left alone."""
    frost.manual_seed(5)
    outside = frost.get_rng_state()
    with cpu.use_generator(np.random.default_rng(99)):
        inside = frost.get_rng_state()
        a = frost.rand(4).numpy()
        frost.set_rng_state(inside)
        np.testing.assert_array_equal(frost.rand(4).numpy(), a)
    assert not np.array_equal(inside.numpy(), outside.numpy())
    np.testing.assert_array_equal(frost.get_rng_state().numpy(), outside.numpy())


@pytest.mark.parametrize("bad, match", [
    (frost.zeros(40, dtype="uint8")[:39], r"a state has 40 bytes, got 39"),
    (frost.zeros(40), r"a state is a uint8 tensor .* got Tensor of dtype float32"),
    ([1000] * 40, r"a state is a uint8 tensor \(or a list of ints 0..255\)"),
    (bytes(40), r"not a CPU generator state \(increment 0x0 is even"),
], ids=["short", "float", "out-of-range", "even-increment"])
def test_set_rng_state_refuses_what_get_rng_state_cannot_have_made(bad, match):
    before = frost.get_rng_state().numpy().copy()
    with pytest.raises(ValueError, match=r"frost.set_rng_state: " + match):
        frost.set_rng_state(bad)
    np.testing.assert_array_equal(frost.get_rng_state().numpy(), before)


def test_fork_rng_restores_the_state_after_the_block_also_on_an_error():
    frost.manual_seed(2)
    state = frost.get_rng_state()
    expected = draws()
    frost.set_rng_state(state)
    with frost.random.fork_rng():
        draws()
        frost.manual_seed(123)  # a reseed inside is undone too
        draws()
    assert_same(draws(), expected)
    frost.set_rng_state(state)
    with pytest.raises(KeyError):
        with frost.random.fork_rng():
            draws()
            raise KeyError("inside")
    assert_same(draws(), expected)


def test_fork_rng_disabled_forks_nothing():
    frost.manual_seed(2)
    with frost.random.fork_rng(enabled=False):
        frost.rand(10)
    after = frost.rand(3).numpy()
    frost.manual_seed(2)
    frost.rand(10)
    np.testing.assert_array_equal(frost.rand(3).numpy(), after)


# ---------------------------------------------------------------- GPU bookkeeping, on the CPU
class FakePhilox:
    """A PhiloxGenerator's state handling without a GPU: (seed, offset) as the device keeps them, draws from the
    NumPy twin that advance the offset as the kernels do."""

    def __init__(self, seed: int) -> None:
        self.seed(seed)

    def seed(self, seed: int) -> None:
        self.set_state((seed, 0))

    def set_state(self, state) -> None:
        seed, offset = state
        self.key, self.offset = int(seed) % (1 << 64), int(offset) % (1 << 64)

    def get_state(self):
        return self.key, self.offset

    def random(self, n: int) -> np.ndarray:
        out = P.uniform_numpy(self.key, self.offset, n)
        self.offset += P.counters_for(n)
        return out


@pytest.fixture
def fake_gpus(monkeypatch):
    """Two GPUs' generators, made as frost.manual_seed(17) would have made them."""
    generators = {0: FakePhilox(17), 1: FakePhilox(17)}
    monkeypatch.setattr(backend_cuda, "_generators", generators)
    monkeypatch.setattr(backend_cuda, "_seed", 17)
    return generators


def test_cuda_state_is_the_seed_and_the_offset_in_16_little_endian_bytes(fake_gpus):
    big_seed, near_wrap = (1 << 64) - 3, (1 << 64) - 2  # all 64 bits of both survive
    fake_gpus[1].set_state((big_seed, near_wrap))
    state = frost.cuda.get_rng_state("cuda:1")
    assert state.dtype == frost.uint8 and state.shape == (16,)
    raw = state.numpy().tobytes()
    assert (int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little")) == (big_seed, near_wrap)
    fake_gpus[1].random(1000)
    frost.cuda.set_rng_state(state, device=1)
    assert fake_gpus[1].get_state() == (big_seed, near_wrap)
    assert fake_gpus[0].get_state() == (17, 0)  # the other GPU untouched


def test_cuda_state_restores_the_draws(fake_gpus):
    g = fake_gpus[0]
    g.random(10)
    state = frost.cuda.get_rng_state(0)
    a = g.random(33)
    frost.cuda.set_rng_state(state, frost.Device("cuda:0"))
    np.testing.assert_array_equal(g.random(33), a)
    frost.cuda.set_rng_state(json.loads(json.dumps(state.tolist())), 0)
    np.testing.assert_array_equal(g.random(33), a)


def test_cuda_state_errors_name_the_function(fake_gpus):
    with pytest.raises(ValueError, match=r"frost.cuda.set_rng_state: a state has 16 bytes, got 40"):
        frost.cuda.set_rng_state(frost.get_rng_state(), 0)
    with pytest.raises(ValueError, match=r"expected a GPU \(an index, 'cuda' or 'cuda:N'\), got 'cpu'"):
        frost.cuda.get_rng_state("cpu")


def test_fork_rng_restores_every_gpu_and_resets_one_made_inside(fake_gpus, monkeypatch):
    fake_gpus[0].random(8)
    saved = fake_gpus[0].get_state()
    del fake_gpus[1]  # GPU 1's generator does not exist yet: it is made inside the block
    with frost.random.fork_rng():
        fake_gpus[0].random(100)
        fake_gpus[1] = FakePhilox(backend_cuda._seed)
        fake_gpus[1].random(100)
        backend_cuda.manual_seed(99)
        fake_gpus[0].random(5)
    assert fake_gpus[0].get_state() == saved
    assert fake_gpus[1].get_state() == (17, 0)  # as if it were made after the block
    assert backend_cuda._seed == 17


def test_fork_rng_with_devices_forks_only_those(fake_gpus):
    with frost.random.fork_rng(devices=["cuda:1"]):
        fake_gpus[0].random(100)
        fake_gpus[1].random(100)
    assert fake_gpus[1].get_state() == (17, 0)
    assert fake_gpus[0].get_state() == (17, P.counters_for(100))


# ---------------------------------------------------------------- on the GPU
@pytest.mark.cuda
def test_gpu_state_repeats_every_kind_of_draw_bit_for_bit():
    frost.manual_seed(8)
    frost.rand(3, device="cuda")
    state = frost.cuda.get_rng_state()
    seed, offset = backend_cuda.generator().get_state()
    assert state.numpy().tobytes() == seed.to_bytes(8, "little") + offset.to_bytes(8, "little")
    first = draws("cuda")
    frost.cuda.set_rng_state(state)
    assert_same(draws("cuda"), first)
    after = backend_cuda.generator().get_state()
    with frost.random.fork_rng():
        draws("cuda")
    assert backend_cuda.generator().get_state() == after


@pytest.mark.cuda
def test_gpu_state_resumes_a_jitted_step_across_replays():
    """The offset that replays advance on the device is in the state: restoring it repeats the replays' masks."""
    def step(x):
        return F.dropout(x * 1.0, 0.5)

    x = frost.ones(64, 64, device="cuda")
    jitted = frost.jit(step)
    frost.manual_seed(12)
    for _ in range(4):  # warm-up, capture, replays
        jitted(x)
    state = frost.cuda.get_rng_state()
    masks = [backend_cuda.to_host(jitted(x).data).copy() for _ in range(3)]
    frost.cuda.set_rng_state(state)
    again = [backend_cuda.to_host(jitted(x).data).copy() for _ in range(3)]
    for a, b in zip(masks, again):
        np.testing.assert_array_equal(b, a)
    seed, offset = (int.from_bytes(state.numpy().tobytes()[i:i + 8], "little") for i in (0, 8))
    keep = P.uniform_numpy(seed, offset, 4096).reshape(64, 64) >= np.float32(0.5)
    np.testing.assert_array_equal(masks[0] != 0, keep)
