"""The fused dropout kernel (frost/accel/dropout.py) in the kernel simulator against the NumPy twin of Frost's CUDA
generator (frost.accel.philox.uniform_numpy): the same draws as the reference path's `generator.random(shape) >= p`,
bit for bit, forward and backward; the routing (element-wise dropout only, 0 < p < 1); and on a GPU the fast path
equal to the reference path from the same seed."""
import ml_dtypes
import numpy as np
import pytest

import frost
import frost.nn.functional as F
from frost import dispatch
from frost.accel import dropout as fused
from frost.kernel.api import Kernel
from frost.accel.philox import philox_advance, seed_key, uniform_numpy

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _state(seed: int, offset: int) -> np.ndarray:
    return np.array([*seed_key(seed), offset & 0xFFFFFFFF, offset >> 32], np.uint32)


def _twin(x: np.ndarray, seed: int, offset: int, p: float) -> np.ndarray:
    """The reference's dropout of x with the generator at (seed, offset): x * (keep * scale rounded to x's dtype)."""
    keep = uniform_numpy(seed, offset, x.size).reshape(x.shape) >= np.float32(p)
    scaled_mask = keep.astype(x.dtype) * x.dtype.type(1.0 / (1.0 - p))
    return x * scaled_mask


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, offset", [(1001, 5), (64, (1 << 32) - 3)])   # a ragged end; the offset's low word wraps
@pytest.mark.parametrize("aligned", [True, False])   # load4/store4, or one element at a time
def test_the_simulated_kernel_draws_the_generators_mask_bit_for_bit(dtype, n, offset, aligned):
    x = np.empty(n + 1, DTYPES[dtype])[0 if aligned else 1:][:n]   # the view is 2 or 4 bytes past the allocation
    x[...] = np.random.default_rng(1).standard_normal(n)
    assert (x.ctypes.data % (4 * x.itemsize) == 0) == aligned
    seed = 0x1234_5678_9ABC
    got = fused.apply_mask(np, x, _state(seed, offset), 0.3)
    want = _twin(x, seed, offset, 0.3)
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))
    assert 0.6 < (got != 0).mean() < 0.8


@pytest.fixture
def simulated_gpu(monkeypatch):
    """NumPy arrays take the CUDA fast path, launches run in the simulator, and the generator's state is a NumPy
    (seed, offset) pair that the path's snapshot reads and moves on."""
    monkeypatch.setattr(Kernel, "__getitem__", lambda self, cfg: self.simulate[cfg])
    monkeypatch.setattr(dispatch, "device_of", lambda array: "cuda")
    state = _state(42, 7)

    def snapshot(n):
        before = state.copy()
        philox_advance.simulate[1, 32](state, fused.counters_for(n))
        return before
    monkeypatch.setattr(fused, "_state_snapshot", snapshot)
    return state


def test_the_op_takes_the_fast_path_forward_and_backward(simulated_gpu):
    x = np.random.default_rng(2).standard_normal((3, 5, 7)).astype(np.float32)
    g = np.random.default_rng(3).standard_normal(x.shape).astype(np.float32)
    tx = frost.tensor(x, requires_grad=True)
    out = F.dropout(tx, 0.25, training=True)
    out.backward(frost.tensor(g))
    np.testing.assert_array_equal(out.detach().numpy(), _twin(x, 42, 7, 0.25))
    np.testing.assert_array_equal(tx.grad.numpy(), _twin(g, 42, 7, 0.25))   # the same mask, drawn again
    assert tuple(simulated_gpu[2:]) == (7 + fused.counters_for(x.size), 0)  # moved past the draw, as the reference
    again = F.dropout(frost.tensor(x), 0.25, training=True).numpy()
    np.testing.assert_array_equal(again, _twin(x, 42, 7 + fused.counters_for(x.size), 0.25))


def test_channel_dropout_and_p_of_one_stay_with_the_reference(simulated_gpu):
    x = frost.tensor(np.ones((2, 3, 4, 4), np.float32))
    assert dispatch.lookup("dropout", x, mask_shape=(2, 3, 1, 1), p=0.5) is None
    assert dispatch.lookup("dropout", x, mask_shape=x.shape, p=1.0) is None
    assert dispatch.lookup("dropout", frost.tensor(np.ones(4)), mask_shape=(4,), p=0.5) is None   # float64
    assert dispatch.lookup("dropout", x, mask_shape=x.shape, p=0.5) is fused.dropout_kernels


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_on_the_gpu_the_fast_path_equals_the_reference_from_the_same_seed(dtype):
    x = np.random.default_rng(4).standard_normal((64, 257)).astype(np.float32)
    results = []
    for fast in (True, False):
        frost.manual_seed(9)
        tx = frost.tensor(x, dtype=dtype, device="cuda", requires_grad=True)
        if fast:
            out = F.dropout(tx, 0.2, training=True)
        else:
            with dispatch.disabled("dropout"):
                out = F.dropout(tx, 0.2, training=True)
        out.backward(frost.ones_like(out) * 3)
        following = frost.rand(5, device="cuda")   # the generator moved on by as much
        results.append([a.float().cpu().numpy() for a in (out.detach(), tx.grad, following)])
    for fast_result, reference in zip(*results):
        np.testing.assert_array_equal(fast_result, reference)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_kernel_compiles_for_sm90(dtype, tmp_path, monkeypatch):
    pytest.importorskip("cuda.bindings")
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    for vector in (False, True):
        assert fused.DROPOUT_KERNELS[dtype].compile("sm_90", VECTOR=vector)[:4] == b"\x7fELF"
    ptx = fused.DROPOUT_KERNELS[dtype].ptx("sm_90", VECTOR=True)
    assert ("ld.global.v4.f32" if dtype == "float32" else "ld.global.v2.u32") in ptx
