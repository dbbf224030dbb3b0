"""The GPU's matrix products (frost/accel/matmul.py), registered with frost.dispatch for the core's matmul_arrays: the
registration, the routing (cuBLAS in eager code, cuDNN while a step is captured, the plain float32 kernel with TF32
off, 4-D products folded to 3-D, the core's xp.matmul where the path declines) with NumPy arrays standing in for
CuPy ones, the float32 kernel in the simulator against float64, and on a GPU cuBLAS's layouts and the whole path
against NumPy."""
import ml_dtypes
import numpy as np
import pytest

import frost
import frost.nn.functional as F
from frost import backends, dispatch
from frost.accel import matmul as accel_matmul
from frost.backend import cublas, cudnn
from frost.ops.matmul import matmul_arrays


def test_the_layer_registers_matmul_arrays_on_cuda_for_float_types():
    (path,) = dispatch.registered("matmul_arrays")
    assert (path.fn, path.device, path.applies) == (accel_matmul.matmul_arrays_cuda, "cuda",
                                                    accel_matmul.folds_or_fits)
    assert path.dtypes == {"float16", "bfloat16", "float32"}  # float64: CuPy's own cuBLAS call


class Libraries(list):
    """The calls made to the two libraries, as (library, a's shape, b's shape, out given?); `capturing` says
    whether a call is eager (False), made while a step is "captured", or in a jitted step's "warming up" call."""
    capturing: bool | str = False
    refuse_bias: bool = False   # cuDNN builds no graph with the bias in the epilogue


@pytest.fixture
def on_a_gpu_with_cudnn(monkeypatch):
    """NumPy arrays answered as CuPy ones (the CUDA path takes them); cuBLAS's and cuDNN's matmuls recorded,
    computed by NumPy."""
    calls = Libraries()
    monkeypatch.setattr(dispatch, "device_of", lambda array: "cuda")
    monkeypatch.setattr(accel_matmul, "capturing", lambda: calls.capturing == "captured")
    monkeypatch.setattr(accel_matmul, "warming_up", lambda: calls.capturing == "warming up")
    for library in (cublas, cudnn):
        monkeypatch.setattr(library, "available", lambda: True)

        def recorded(a, b, out=None, bias=None, accumulate=False, name=library.__name__.rsplit(".", 1)[1]):
            if bias is not None:   # cuDNN's graph with the bias in its epilogue, or its refusal
                calls.append((name + " + bias", a.shape, b.shape, calls.refuse_bias))
                return None if calls.refuse_bias else np.matmul(a, b) + bias
            if accumulate:   # cuBLAS's beta = 1: out + a @ b
                calls.append((name + " + C", a.shape, b.shape, True))
                out += np.matmul(a, b)
                return out
            calls.append((name, a.shape, b.shape, out is not None))
            return np.matmul(a, b, out=out)
        monkeypatch.setattr(library, "matmul", recorded)
    monkeypatch.setattr(backends, "allow_tf32", True)
    return calls


def _operands(a_shape, b_shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(a_shape).astype(dtype), rng.standard_normal(b_shape).astype(dtype)


@pytest.mark.parametrize("a_shape, b_shape", [((5, 7), (7, 3)), ((2, 5, 7), (7, 3)), ((2, 5, 7), (2, 7, 3))])
@pytest.mark.parametrize("capturing, library", [(False, "cublas"), ("captured", "cudnn"), ("warming up", "cudnn")])
def test_matrices_go_to_cublas_or_while_captured_to_cudnn(on_a_gpu_with_cudnn, a_shape, b_shape, capturing, library):
    on_a_gpu_with_cudnn.capturing = capturing
    a, b = _operands(a_shape, b_shape)
    got = matmul_arrays(np, a, b)
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    assert on_a_gpu_with_cudnn == [(library, a_shape, b_shape, False)]


def test_mixed_dtypes_skip_cublas(on_a_gpu_with_cudnn):
    a, b = _operands((5, 7), (7, 3))
    matmul_arrays(np, a, b.astype(np.float16))
    assert [call[0] for call in on_a_gpu_with_cudnn] == ["cudnn"]


def test_four_dimensional_products_fold_into_one_3d_cudnn_call_and_fill_out(on_a_gpu_with_cudnn):
    a, b = _operands((2, 3, 4, 5), (1, 3, 5, 6))
    out = np.empty((2, 3, 4, 6), np.float32)
    assert matmul_arrays(np, a, b, out=out) is out
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    assert on_a_gpu_with_cudnn == [("cublas", (6, 4, 5), (6, 5, 6), False)]


def test_captured_float32_without_tf32_runs_the_plain_float32_kernel(on_a_gpu_with_cudnn, monkeypatch):
    on_a_gpu_with_cudnn.capturing = "captured"  # eagerly, cuBLAS multiplies in float32 itself
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


def test_empty_operands_or_no_library_multiply_with_xp(on_a_gpu_with_cudnn, monkeypatch):
    a, b = _operands((2, 0), (0, 3))
    np.testing.assert_array_equal(matmul_arrays(np, a, b), np.zeros((2, 3), np.float32))
    monkeypatch.setattr(cublas, "available", lambda: False)
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


def _layouts(cp, rng, dtype):
    """(a, b) CuPy operands in the layouts cuBLAS reads in place or that must be copied first: row-major,
    transposed views, a batch broadcast with stride 0, a sliced (strided) batch, a reversed batch, 2-D with 3-D."""
    def arr(*shape):
        return cp.asarray(rng.standard_normal(shape).astype(np.float32)).astype(dtype)
    return [
        (arr(4, 5, 7), arr(4, 7, 3)),
        (arr(4, 7, 5).transpose(0, 2, 1), arr(4, 3, 7).transpose(0, 2, 1)),
        (arr(1, 5, 7), arr(4, 7, 3)),
        (arr(5, 7), arr(4, 7, 3)),
        (cp.broadcast_to(arr(1, 5, 7), (4, 5, 7)), arr(4, 7, 3)),
        (arr(8, 5, 7)[::2], arr(4, 7, 9)[:, :, 2:5]),
        (arr(4, 5, 7)[::-1], arr(4, 7, 3)),
        (arr(1, 7), arr(7, 1)),
        (arr(6, 7)[:, ::2], arr(4, 3)),
    ]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_on_the_gpu_cublas_reads_every_layout_like_numpy(monkeypatch, dtype):
    cp = pytest.importorskip("cupy")
    monkeypatch.setattr(backends, "allow_tf32", False)
    dt = np.dtype(dtype) if dtype != "bfloat16" else ml_dtypes.bfloat16
    for a, b in _layouts(cp, np.random.default_rng(0), dt):
        assert cublas.supports(a, b)
        expected = np.matmul(a.get().astype(np.float64), b.get().astype(np.float64))
        got = cublas.matmul(a, b).get().astype(np.float64)
        tolerance = {"float64": 1e-12, "float32": 1e-5, "float16": 1e-2, "bfloat16": 5e-2}[dtype]
        np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance)


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


@pytest.mark.cuda
@pytest.mark.parametrize("library", ["cublas", "cudnn"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_on_the_gpu_16_bit_operands_write_an_unrounded_float32_product(library, dtype):
    """A linear layer's weight gradient under autocast: 16-bit operands, the float32 sums written as they are
    (products of 16-bit values are exact in float32, so only the summation order rounds)."""
    cp = pytest.importorskip("cupy")
    dt = np.dtype(dtype) if dtype != "bfloat16" else ml_dtypes.bfloat16
    rng = np.random.default_rng(2)
    a = cp.asarray(rng.standard_normal((96, 512)).astype(dt)).T   # (512, 96) read transposed, as g2.T
    b = cp.asarray(rng.standard_normal((96, 40)).astype(dt))
    out = cp.empty((512, 40), cp.float32)
    assert getattr({"cublas": cublas, "cudnn": cudnn}[library], "matmul")(a, b, out=out) is out
    expected = a.get().astype(np.float64) @ b.get().astype(np.float64)
    np.testing.assert_allclose(out.get(), expected, rtol=1e-5, atol=1e-5)   # a 16-bit result would miss by 1e-3


@pytest.mark.parametrize("capturing, refused, expected", [
    (False, False, [("cublas + C", (6, 8), (8, 16), True)]),   # the bias rows in cuBLAS's C
    ("captured", False, [("cudnn + bias", (6, 8), (8, 16), False)]),
    ("warming up", True, [("cudnn + bias", (6, 8), (8, 16), True), ("cudnn", (6, 8), (8, 16), False), "add_bias_vec8"]),
])
def test_a_linear_bias_rides_in_cudnns_epilogue_while_captured_in_cublass_c_when_eager_else_is_added_after(
        on_a_gpu_with_cudnn, simulated_gpu, capturing, refused, expected):
    on_a_gpu_with_cudnn.capturing, on_a_gpu_with_cudnn.refuse_bias = capturing, refused
    rng = np.random.default_rng(9)   # a bias wider than the rows checks that rows_of repeats it per row
    x, w, b = (rng.standard_normal(shape).astype(np.float32) for shape in ((6, 8), (16, 8), (16,)))
    out = F.linear(frost.tensor(x), frost.tensor(w), frost.tensor(b))
    np.testing.assert_allclose(out.numpy(), x.astype(np.float64) @ w.T + b, rtol=1e-5, atol=1e-5)
    assert list(on_a_gpu_with_cudnn) + simulated_gpu == expected


def test_the_fused_bias_is_off_with_its_switch(on_a_gpu_with_cudnn, simulated_gpu, monkeypatch):
    monkeypatch.setattr(accel_matmul, "FUSED_BIAS", False)
    on_a_gpu_with_cudnn.capturing = "captured"
    x, w, b = np.ones((6, 8), np.float32), np.ones((16, 8), np.float32), np.ones(16, np.float32)
    F.linear(frost.tensor(x), frost.tensor(w), frost.tensor(b))
    assert [call[0] for call in on_a_gpu_with_cudnn] == ["cudnn"] and simulated_gpu == ["add_bias_vec8"]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_on_the_gpu_cudnns_product_with_its_bias_matches_float64(monkeypatch, dtype):
    """The fused graph itself (the one a captured linear layer runs): the bias added to the float32 product, one
    rounding into the output's dtype."""
    cp = pytest.importorskip("cupy")
    monkeypatch.setattr(backends, "allow_tf32", True)
    dt = np.dtype(dtype) if dtype != "bfloat16" else ml_dtypes.bfloat16
    rng = np.random.default_rng(3)
    x, w, b = (cp.asarray(rng.standard_normal(shape).astype(dt)) for shape in ((96, 64), (192, 64), (192,)))
    got = cudnn.matmul(x, w.T, bias=b)
    assert got is not None and got.dtype == x.dtype and got.shape == (96, 192), cudnn.refusals()
    want = x.get().astype(np.float64) @ w.get().astype(np.float64).T + b.get().astype(np.float64)
    rtol = {"float32": 5e-3, "bfloat16": 1e-2}[dtype]   # TF32's 10-bit operands; one bf16 rounding of the sum
    assert np.abs(got.get().astype(np.float64) - want).max() <= rtol * np.abs(want).max()


@pytest.mark.cuda
@pytest.mark.parametrize("captured", [False, True])
def test_on_the_gpu_a_bf16_linear_rounds_its_product_and_bias_once_eager_or_captured(monkeypatch, captured):
    """257 (exact in float32, halfway between bf16's 256 and 258) + 0.75 is 258 rounded once; a product rounded to
    bf16 first (256, ties to even) plus 0.75 gives 256. Eager (cuBLAS, the bias in its C) and captured (cuDNN's
    epilogue) linear layers compute the same step."""
    pytest.importorskip("cupy")
    monkeypatch.setattr(accel_matmul, "capturing", lambda: captured)
    bf16 = ml_dtypes.bfloat16
    x = frost.tensor(np.ones((4, 257), bf16), device="cuda")
    w = frost.tensor(np.ones((24, 257), bf16), device="cuda")
    b = frost.tensor(np.full(24, 0.75, bf16), device="cuda")
    out = F.linear(x, w, b)
    assert out.dtype == frost.bfloat16
    np.testing.assert_array_equal(out.float().cpu().numpy(), np.full((4, 24), 258.0, np.float32))
