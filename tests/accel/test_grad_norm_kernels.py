"""clip_grad_norm_'s kernels (frost/accel/grad_norm.py) in the simulator: the squared 2-norm against a float64 NumPy
twin (ragged ends, several grid-stride rounds per block, the same bits on a second run), the in-place scale against
NumPy's float32 multiply, and clip_grad_norm_ through both against PyTorch in float64; on the GPU, the captured
path against the CPU."""
import numpy as np
import pytest
import torch

import frost
import frost.nn.utils
from frost import dispatch, nn
from frost.accel import grad_norm


@pytest.fixture
def simulated_kernels(monkeypatch, simulated_gpu):
    """Only the two kernels' fast paths, for NumPy arrays, run in the simulator."""
    monkeypatch.setattr(dispatch, "_table", {})
    for op, fn in (("sum_of_squares", grad_norm.sum_of_squares), ("scale_", grad_norm.scale_)):
        dispatch.register(op, device="cuda", dtypes=("float32",), applies=grad_norm.dense_float32)(fn)
    return simulated_gpu


@pytest.mark.parametrize("n", [1, 7, 8, 2055, 3 * 8 * grad_norm.THREADS + 13])
def test_sum_of_squares_is_the_float64_sum_to_float32_rounding(simulated_kernels, monkeypatch, n):
    monkeypatch.setattr(grad_norm, "MAX_BLOCKS", 2)  # the longer vectors take several rounds per block
    a = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    got = grad_norm.sum_of_squares(a)
    assert got.shape == () and got.dtype == np.float32
    assert simulated_kernels == ["sum_of_squares_partial", "sum_of_squares_finalize"]
    np.testing.assert_allclose(got, np.sum(a.astype(np.float64) ** 2), rtol=2e-6)
    assert grad_norm.sum_of_squares(a).tobytes() == got.tobytes()   # a fixed order: the same bits again


@pytest.mark.parametrize("n", [5, 8, 4099])
def test_scale_multiplies_in_place_as_numpy_does(simulated_kernels, n):
    a = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    coef = np.array(0.3712, np.float32)
    want = a * coef
    grad_norm.scale_(a, coef)
    assert simulated_kernels == ["scale_vec8"]
    np.testing.assert_array_equal(a, want)


def test_fast_paths_take_dense_aligned_float32_vectors_only():
    a = np.zeros(64, np.float32)
    assert grad_norm.dense_float32(a) and grad_norm.dense_float32(a, coef=np.zeros((), np.float32))
    assert not grad_norm.dense_float32(a[1:])                       # 4 bytes past a 16-byte boundary
    assert not grad_norm.dense_float32(a[::2]) and not grad_norm.dense_float32(a.reshape(8, 8).T)
    assert grad_norm.dense_float32(a.reshape(8, 8))
    assert not grad_norm.dense_float32(a.astype(np.float64))
    assert not grad_norm.dense_float32(a, coef=np.zeros((), np.float64))


def test_clip_grad_norm_through_the_kernels_equals_pytorch(simulated_kernels):
    rng = np.random.default_rng(4)
    grads = [rng.standard_normal(s).astype(np.float32) * 3 for s in [(40, 24), (24,), (3, 5, 8)]]
    fp = [nn.Parameter(frost.zeros(g.shape)) for g in grads]
    tp = [torch.nn.Parameter(torch.zeros(g.shape, dtype=torch.float64)) for g in grads]
    for f, t, g in zip(fp, tp, grads):
        f.grad, t.grad = frost.tensor(g.copy()), torch.tensor(g.astype(np.float64))
    norm = frost.nn.utils.clip_grad_norm_(fp, max_norm=1.0)
    want = torch.nn.utils.clip_grad_norm_(tp, max_norm=1.0)
    assert simulated_kernels.count("sum_of_squares_finalize") == 3 and simulated_kernels.count("scale_vec8") == 3
    np.testing.assert_allclose(norm.item(), want.item(), rtol=2e-6)
    for f, t in zip(fp, tp):
        np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy(), rtol=5e-6, atol=1e-7)


@pytest.mark.parametrize("kern", [grad_norm.sum_of_squares_partial, grad_norm.sum_of_squares_finalize,
                                  grad_norm.scale_vec8], ids=["partial", "finalize", "scale"])
def test_kernels_compile_for_sm90_without_spills(kern, tmp_path, monkeypatch):
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    cubin = kern.compile("sm_90")
    assert cubin[:4] == b"\x7fELF" and b".nv.local" not in cubin


@pytest.mark.cuda
def test_on_the_gpu_a_captured_clip_equals_the_cpu(monkeypatch):
    """Flat AdamW buffers on the GPU: the norm and the clipped gradients of four jitted steps equal the CPU's
    reference path (float32 products on both: TF32's would differ by 1e-3)."""
    monkeypatch.setattr(frost.backends, "allow_tf32", False)
    rng = np.random.default_rng(6)
    x, y = rng.standard_normal((64, 33)).astype(np.float32), rng.standard_normal((64, 5)).astype(np.float32)
    results = []
    for device in ("cpu", "cuda"):
        frost.manual_seed(0)
        model = nn.Sequential(nn.Linear(33, 200), nn.Tanh(), nn.Linear(200, 5)).to(device)
        opt = frost.optim.AdamW(model.parameters(), lr=1e-3)
        xt, yt = frost.tensor(x, device=device), frost.tensor(y, device=device)

        def step():
            opt.zero_grad()
            ((model(xt) - yt) ** 2).sum().backward()
            norm = frost.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
            opt.step()
            return norm
        step = frost.jit(step) if device == "cuda" else step
        norms = [float(step().item()) for _ in range(4)]
        results.append((norms, [p.grad.cpu().numpy() for p in model.parameters()]))
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-4)
    for gpu, cpu in zip(results[1][1], results[0][1]):
        np.testing.assert_allclose(gpu, cpu, rtol=1e-3, atol=1e-7)
