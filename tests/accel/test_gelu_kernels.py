"""The GELU kernels (frost.accel.gelu, exact erf and tanh forms) vs PyTorch float64 and the reference path: values
and gradients in the CPU simulator (the op's CUDA branch on NumPy arrays), compiled by NVRTC, and on the GPU."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import frost
from frost import dispatch
from frost.accel import bias as bias_accel
from frost.accel import gelu as gelu_accel
from frost.kernel.api import Kernel
from frost.ops.elementwise import gelu

from accel_simulation import simulate_only

# the unit roundoff of each dtype: one rounding of a result into it is off by at most this relative amount
ROUNDOFF = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}


@pytest.fixture
def simulated_gpu(monkeypatch):
    """dispatch takes NumPy arrays for CuPy ones, and launches run in the simulator: the CUDA fast path on the CPU.
    Returns the list of (kernel name, launch configuration) the op made."""
    launches = []

    def simulate(self, cfg):
        launches.append((self.__name__, cfg))
        return self.simulate[cfg]
    monkeypatch.setattr(Kernel, "__getitem__", simulate)
    monkeypatch.setattr(dispatch, "device_of", lambda array: "cuda")
    return launches


def _inputs(shape, dtype, seed):
    """x over GELU's interesting range (both tails, the bend near 0) and an upstream gradient, rounded to dtype."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-6, 6, shape)
    g = rng.standard_normal(shape)
    np_dtype = frost.dtype.to_dtype(dtype).np
    return x.astype(np_dtype), g.astype(np_dtype)


def _run_frost(x, g, approximate, device="cpu"):
    tx = frost.tensor(x, device=device, requires_grad=True)
    out = gelu(tx, approximate)
    assert out.dtype == tx.dtype and out.shape == tx.shape
    out.backward(frost.tensor(g, device=device))
    return out.detach().cpu().numpy().astype(np.float64), tx.grad.cpu().numpy().astype(np.float64)


def _run_torch(x, g, approximate):
    tx = torch.tensor(x.astype(np.float64), requires_grad=True)
    out = F.gelu(tx, approximate=approximate)
    out.backward(torch.tensor(g.astype(np.float64)))
    return out.detach().numpy(), tx.grad.numpy()


def _assert_close(got, want, dtype):
    """One rounding into dtype (2 roundoffs for slack) plus float32 maths (tanhf/erff within a few ulp: 1e-6).
    In the negative tail the tanh form's slope subtracts nearly equal float32 values (1 + t and 1 - t*t, t -> -1),
    the same formula as the reference path's: an absolute error of a few float32 ulps of terms that reach ~10 for
    |x| <= 6, hence 64 ulps of 1 absolute on top of the relative tolerance."""
    rtol = 2 * ROUNDOFF[dtype] + 1e-6
    for name, a, e in zip(("out", "dx"), got, want):
        np.testing.assert_allclose(a, e, rtol=rtol, atol=rtol + 64 * 2.0**-24, err_msg=f"{name} ({dtype})")


# sizes: a multiple of 4 (vec4 only), odd (vec4 and a tail of 3 in the last thread), below one vector, 2-D
SHAPES = [(64,), (1027,), (3,), (5, 33)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_float32_matches_torch_float64(simulated_gpu, shape, approximate):
    x, g = _inputs(shape, "float32", seed=sum(shape))
    _assert_close(_run_frost(x, g, approximate), _run_torch(x, g, approximate), "float32")
    assert [name for name, _ in simulated_gpu] == ["gelu_forward_vec4", "gelu_backward_vec4"]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_half_precision_matches_torch_float64(simulated_gpu, dtype, approximate):
    x, g = _inputs((7, 45), dtype, seed=3)  # 315 values: 39 threads of 8 and a tail of 3
    _assert_close(_run_frost(x, g, approximate), _run_torch(x, g, approximate), dtype)
    assert [name for name, _ in simulated_gpu] == ["gelu_forward_vec8", "gelu_backward_vec8"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_unaligned_arrays_take_the_one_value_kernels(simulated_gpu, dtype):
    x, g = _inputs((65,), dtype, seed=4)
    tx = frost.Tensor(x[1:], requires_grad=True)  # a view 2 or 4 bytes past a 16-byte boundary: no 16-byte loads
    assert tx.data.ctypes.data % 16 != 0
    out = gelu(tx, "tanh")
    out.backward(frost.tensor(g[1:]))
    assert [name for name, _ in simulated_gpu] == ["gelu_forward", "gelu_backward"]
    _assert_close((out.detach().numpy().astype(np.float64), tx.grad.numpy().astype(np.float64)),
                  _run_torch(x[1:], g[1:], "tanh"), dtype)


def test_half_precision_vector_and_one_value_kernels_agree_bit_for_bit(simulated_gpu):
    x, g = _inputs((8 * 37 + 5,), "bfloat16", seed=6)
    aligned = _run_frost(x, g, "none")
    shifted = np.empty(x.size + 1, x.dtype)[1:]  # 2 bytes past a 16-byte boundary
    shifted[...] = x
    tx = frost.Tensor(shifted, requires_grad=True)
    out = gelu(tx, "none")
    out.backward(frost.tensor(g))
    one_value = out.detach().numpy().astype(np.float64), tx.grad.numpy().astype(np.float64)
    assert [name for name, _ in simulated_gpu] == ["gelu_forward_vec8", "gelu_backward_vec8", "gelu_forward",
                                                   "gelu_backward"]
    for a, e in zip(aligned, one_value):
        assert np.array_equal(a, e)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_fast_path_matches_the_reference_path(simulated_gpu, monkeypatch, dtype, approximate):
    x, g = _inputs((3, 50), dtype, seed=9)
    fast = _run_frost(x, g, approximate)
    monkeypatch.setattr(dispatch, "device_of", lambda array: "cpu")
    reference = _run_frost(x, g, approximate)
    # the same float32 formulas and one rounding; only NumPy's and the kernel's maths functions differ in the last bit
    for a, e in zip(fast, reference):
        np.testing.assert_allclose(a, e, rtol=2 * ROUNDOFF[dtype] + 1e-6, atol=1e-6)


def test_repeated_runs_are_bit_identical(simulated_gpu):
    x, g = _inputs((130,), "bfloat16", seed=1)
    first = _run_frost(x, g, "tanh")
    for a, e in zip(_run_frost(x, g, "tanh"), first):
        assert np.array_equal(a, e)


def test_inputs_the_kernels_do_not_take_run_the_reference_path(simulated_gpu):
    x = frost.randn(4, 8)
    assert dispatch.lookup("gelu", x, approximate="tanh") is gelu_accel.gelu_kernels
    assert dispatch.lookup("gelu", x.double(), approximate="tanh") is None   # float64
    assert dispatch.lookup("gelu", x.t(), approximate="none") is None        # not contiguous
    assert dispatch.lookup("gelu", frost.zeros(0), approximate="none") is None


def test_the_cpu_runs_the_reference_path():
    assert dispatch.lookup("gelu", frost.randn(8), approximate="none") is None


def test_bad_approximate_is_refused_before_the_fast_path(simulated_gpu):
    with pytest.raises(ValueError, match=r"gelu: approximate must be 'none' or 'tanh', got 'fast'"):
        gelu(frost.randn(4), "fast")


KERNELS = ([k for pair in gelu_accel.GELU_KERNELS.values() for k in pair]
           + [k for _, *pair in gelu_accel.GELU_VECTOR_KERNELS.values() for k in pair]
           + list(gelu_accel.GELU_SUM_ROWS_KERNELS.values()))


def _linear_then_gelu(x, w, b, g, dtype, approximate):
    """gelu(linear(x)) under autocast(bfloat16), or not for float32: (output, every leaf's gradient)."""
    leaves = [frost.tensor(a, requires_grad=True) for a in (x, w, b)]
    with frost.autocast("bfloat16", enabled=dtype != "float32"):
        y = gelu(frost.nn.functional.linear(*leaves), approximate=approximate)
    y.float().backward(frost.tensor(g))
    return [y.float().detach().numpy()] + [t.grad.numpy() for t in leaves]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rows", [70, 64 * 3 + 1])   # a chunk and a bit; three and one row
def test_the_backward_makes_the_linear_layers_bias_gradient_bit_for_bit(monkeypatch, dtype, rows):
    """After a linear layer with a bias, GELU's backward also sums its gradient's columns per chunk of rows, as
    sum_rows_partial would read them, and the layer's bias gradient is only their finalize: the same bits."""
    launched = simulate_only(monkeypatch, ("gelu", gelu_accel._fits_kernels, gelu_accel.gelu_kernels),
                             ("sum_rows", bias_accel.sums_rows, bias_accel.sum_rows_kernels_call))
    rng = np.random.default_rng(rows)
    x, w, b = (rng.standard_normal(shape).astype(np.float32) for shape in ((rows, 16), (24, 16), (24,)))
    g = rng.standard_normal((rows, 24)).astype(np.float32)
    fused = _linear_then_gelu(x, w, b, g, dtype, "tanh")
    assert launched[-2:] == ["gelu_backward_sum_rows", "sum_rows_finalize"]
    monkeypatch.setattr(gelu_accel, "linear_bias_of", lambda *args: None)
    del launched[:]
    apart = _linear_then_gelu(x, w, b, g, dtype, "tanh")
    assert "sum_rows_partial" in launched and "gelu_backward_sum_rows" not in launched
    for got, want in zip(fused, apart):
        np.testing.assert_array_equal(got, want)


def test_kernels_compile_for_sm90_without_spills(tmp_path, monkeypatch):
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    for kern in KERNELS:
        for tanh_form in (False, True):
            cubin = kern.compile("sm_90", TANH=tanh_form)
            assert cubin[:4] == b"\x7fELF", (kern.__name__, tanh_form)
            assert b".nv.local" not in cubin, f"{kern.__name__} TANH={tanh_form} spills registers to local memory"


# ------------------------------------------------------------------ on the GPU

@pytest.mark.cuda
@pytest.mark.parametrize("shape,dtype", [((64, 256, 1536), "float32"), ((8, 1024, 3072), "bfloat16"),
                                         ((16, 4 * 384), "float16"), ((1001,), "float32"), ((3, 7, 5), "bfloat16")])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gpu_matches_torch_float64(shape, dtype, approximate):
    x, g = _inputs(shape, dtype, seed=len(shape))
    assert dispatch.lookup("gelu", frost.tensor(x, device="cuda"), approximate=approximate) is not None
    _assert_close(_run_frost(x, g, approximate, device="cuda"), _run_torch(x, g, approximate), dtype)


@pytest.mark.cuda
def test_gpu_runs_are_bit_identical():
    x, g = _inputs((4, 1024, 3072), "bfloat16", seed=2)
    first = _run_frost(x, g, "tanh", device="cuda")
    for a, e in zip(_run_frost(x, g, "tanh", device="cuda"), first):
        assert np.array_equal(a, e)


@pytest.mark.cuda
def test_gpu_bias_gradient_through_the_gelu_backward_matches_the_column_sums(monkeypatch):
    rng = np.random.default_rng(9)
    x, w, b = (rng.standard_normal(shape).astype(np.float32) for shape in ((1000, 768), (3072, 768), (3072,)))
    g = rng.standard_normal((1000, 3072)).astype(np.float32)

    def run():
        leaves = [frost.tensor(a, device="cuda", requires_grad=True) for a in (x, w, b)]
        with frost.autocast("bfloat16"):
            y = gelu(frost.nn.functional.linear(*leaves), approximate="tanh")
        y.float().backward(frost.tensor(g, device="cuda"))
        return [t.grad.cpu().numpy() for t in leaves]
    fused = run()
    monkeypatch.setattr(gelu_accel, "linear_bias_of", lambda *args: None)
    for got, want in zip(fused, run()):
        np.testing.assert_array_equal(got, want)
