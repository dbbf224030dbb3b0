"""The GPU's matrix products (frost/accel/matmul.py), registered with frost.dispatch for the core's matmul_arrays: the
registration, the routing (cuDNN, the plain float32 kernel with TF32 off, 4-D products folded to 3-D, the core's
xp.matmul where the path declines) with NumPy arrays standing in for CuPy ones, the float32 kernel in the simulator
against float64, and on a GPU the whole path against NumPy."""
import numpy as np
import pytest

from frost import backends, dispatch
from frost.accel import matmul as accel_matmul
from frost.backend import cudnn
from frost.ops.matmul import matmul_arrays


def test_the_layer_registers_matmul_arrays_on_cuda_for_float_types():
    (path,) = dispatch.registered("matmul_arrays")
    assert (path.fn, path.device, path.applies) == (accel_matmul.matmul_arrays_cuda, "cuda",
                                                    accel_matmul.folds_or_fits)
    assert path.dtypes == {"float16", "bfloat16", "float32", "float64"}


@pytest.fixture
def on_a_gpu_with_cudnn(monkeypatch):
    """NumPy arrays answered as CuPy ones (the CUDA path takes them); cuDNN's matmul recorded, computed by NumPy."""
    calls = []
    monkeypatch.setattr(dispatch, "device_of", lambda array: "cuda")
    monkeypatch.setattr(cudnn, "available", lambda: True)

    def cudnn_matmul(a, b, out=None):
        calls.append((a.shape, b.shape, out is not None))
        return np.matmul(a, b, out=out)
    monkeypatch.setattr(cudnn, "matmul", cudnn_matmul)
    monkeypatch.setattr(backends, "allow_tf32", True)
    return calls


def _operands(a_shape, b_shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(a_shape).astype(dtype), rng.standard_normal(b_shape).astype(dtype)


@pytest.mark.parametrize("a_shape, b_shape", [((5, 7), (7, 3)), ((2, 5, 7), (7, 3)), ((2, 5, 7), (2, 7, 3))])
def test_matrices_go_to_cudnn(on_a_gpu_with_cudnn, a_shape, b_shape):
    a, b = _operands(a_shape, b_shape)
    got = matmul_arrays(np, a, b)
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    assert on_a_gpu_with_cudnn == [(a_shape, b_shape, False)]


def test_four_dimensional_products_fold_into_one_3d_cudnn_call_and_fill_out(on_a_gpu_with_cudnn):
    a, b = _operands((2, 3, 4, 5), (1, 3, 5, 6))
    out = np.empty((2, 3, 4, 6), np.float32)
    assert matmul_arrays(np, a, b, out=out) is out
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    assert on_a_gpu_with_cudnn == [((6, 4, 5), (6, 5, 6), False)]


def test_float32_without_tf32_runs_the_plain_float32_kernel(on_a_gpu_with_cudnn, monkeypatch):
    monkeypatch.setattr(backends, "allow_tf32", False)
    a, b = _operands((3, 20, 7), (7, 18))
    out = np.empty((3, 20, 18), np.float32)
    assert matmul_arrays(np, a, b, out=out) is out      # the kernel's simulator for NumPy arrays
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    assert on_a_gpu_with_cudnn == []


@pytest.mark.parametrize("a_shape, b_shape, dtype", [((7,), (7, 3), np.float32), ((5, 7), (7,), np.float32),
                                                     ((5, 7), (7, 3), np.int64), ((2, 3, 4, 5), (5, 6), np.int32)])
def test_vectors_and_integer_types_stay_with_the_core(on_a_gpu_with_cudnn, a_shape, b_shape, dtype):
    a, b = _operands(a_shape, b_shape, dtype)
    assert dispatch.lookup("matmul_arrays", a, b) is None
    np.testing.assert_array_equal(matmul_arrays(np, a, b), np.matmul(a, b))
    assert on_a_gpu_with_cudnn == []


def test_empty_operands_or_no_cudnn_multiply_with_xp(on_a_gpu_with_cudnn, monkeypatch):
    a, b = _operands((2, 0), (0, 3))
    np.testing.assert_array_equal(matmul_arrays(np, a, b), np.zeros((2, 3), np.float32))
    monkeypatch.setattr(cudnn, "available", lambda: False)
    a, b = _operands((5, 7), (7, 3))
    np.testing.assert_allclose(matmul_arrays(np, a, b), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    assert on_a_gpu_with_cudnn == []


def test_on_the_cpu_the_path_is_not_asked():
    a, b = _operands((5, 7), (7, 3))
    assert dispatch.lookup("matmul_arrays", a, b) is None


@pytest.mark.parametrize("a_shape, b_shape", [((5, 33), (33, 17)), ((3, 20, 7), (7, 18)), ((1, 4, 40), (2, 40, 3)),
                                              ((16, 16), (16, 16)), ((2, 0), (0, 3))])
def test_exact_float32_kernel_in_the_simulator_matches_float64(a_shape, b_shape):
    a, b = _operands(a_shape, b_shape, seed=1)
    got = accel_matmul.matmul_float32_exact(np, a, b)
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    out = np.empty(want.shape, np.float32)
    assert accel_matmul.matmul_float32_exact(np, a, b, out=out) is out
    with pytest.raises(ValueError, match="out must be a C-contiguous float32 array"):
        accel_matmul.matmul_float32_exact(np, a, b, out=np.empty((1, 1), np.float32))
    with pytest.raises(ValueError, match=r"matmul: shapes \(2, 3, 4\) and \(3, 4, 5\) do not fit"):
        accel_matmul.matmul_float32_exact(np, *_operands((2, 3, 4), (3, 4, 5)))


@pytest.mark.cuda
@pytest.mark.parametrize("allow_tf32", [True, False])
@pytest.mark.parametrize("a_shape, b_shape", [((64, 32), (32, 48)), ((2, 3, 16, 8), (2, 3, 8, 16)), ((3, 5), (5,))])
def test_on_the_gpu_the_path_matches_numpy(monkeypatch, allow_tf32, a_shape, b_shape):
    cp = pytest.importorskip("cupy")
    monkeypatch.setattr(backends, "allow_tf32", allow_tf32)
    a, b = _operands(a_shape, b_shape)
    out = cp.empty(np.matmul(a, b).shape, cp.float32)
    assert matmul_arrays(cp, cp.asarray(a), cp.asarray(b), out=out) is out
    tolerance = 1e-2 if allow_tf32 else 1e-5   # TF32: a 10-bit mantissa
    np.testing.assert_allclose(out.get(), a.astype(np.float64) @ b, rtol=tolerance, atol=tolerance)
