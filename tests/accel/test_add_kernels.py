"""The add kernels (frost.accel.add): a + b for every pair of float32/bf16/f16 operands and output dtype, bit for bit
as the NumPy twin (float32 sum rounded once), ragged lengths; the op `add` and the autograd's sum of gradient
contributions through them; the rules of the fast path; NVRTC compiles; and on the GPU against CuPy."""
import itertools

import ml_dtypes
import numpy as np
import pytest

import frost
from frost import dispatch
from frost.accel import add as add_accel

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _operand(n: int, dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)
    x[:3] = [np.inf, -0.0, 1e-30]
    return x.astype(DTYPES[dtype])


def _twin(a, b, out_dtype):
    with np.errstate(over="ignore"):
        return (a.astype(np.float32) + b.astype(np.float32)).astype(DTYPES[out_dtype])


@pytest.mark.parametrize("a_dtype,b_dtype,out_dtype",
                         [(a, b, o) for a, b in itertools.product(DTYPES, repeat=2) for o in sorted({"float32", a})])
@pytest.mark.parametrize("n", [16, 1003])   # whole chunks of 8; a ragged end one value at a time
def test_sums_match_the_twin_bit_for_bit(simulated_gpu, a_dtype, b_dtype, out_dtype, n):
    a, b = _operand(n, a_dtype, 1), _operand(n, b_dtype, 2)
    got = add_accel.add_kernels(a, b, DTYPES[out_dtype])
    want = _twin(a, b, out_dtype)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    assert simulated_gpu == ["add_vec8"]


def test_a_float32_stream_plus_a_bf16_branch_is_one_launch_each_way(simulated_gpu):
    rng = np.random.default_rng(3)
    x = frost.Tensor(rng.standard_normal((4, 16)).astype(np.float32), requires_grad=True)
    y = frost.Tensor(rng.standard_normal((4, 16)).astype(ml_dtypes.bfloat16), requires_grad=True)
    out = x + y
    assert out.dtype == frost.float32 and simulated_gpu == ["add_vec8"]
    np.testing.assert_array_equal(out.detach().numpy(), _twin(x.detach().numpy(), y.detach().numpy(), "float32"))
    g = rng.standard_normal((4, 16)).astype(np.float32)
    out.backward(frost.Tensor(g))
    np.testing.assert_array_equal(x.grad.numpy(), g)
    np.testing.assert_array_equal(y.grad.numpy().view(np.uint16), g.astype(ml_dtypes.bfloat16).view(np.uint16))
    assert simulated_gpu == ["add_vec8", "cast_from_f32"]   # y's gradient rounded by the cast kernel


def test_gradient_contributions_are_summed_by_the_kernel(simulated_gpu):
    x = frost.Tensor(np.arange(32, dtype=np.float32).reshape(4, 8), requires_grad=True)
    h = x * 2.0
    (h * 3.0 + h * 1.0).sum().backward()   # h's gradient has two contributions
    np.testing.assert_array_equal(x.grad.numpy(), np.full((4, 8), 8.0, np.float32))
    assert "add_vec8" in simulated_gpu


@pytest.mark.parametrize("narrow", ["bfloat16", "float16"])
@pytest.mark.parametrize("n", [16, 1003])
def test_a_sum_in_two_dtypes_matches_the_sum_and_its_cast_bit_for_bit(simulated_gpu, narrow, n):
    a, b = _operand(n, "float32", 4), _operand(n, "float32", 5)
    got = add_accel.sum_in_two_dtypes(a, b, (DTYPES[narrow], np.float32))
    want = _twin(a, b, "float32")
    np.testing.assert_array_equal(got[1].view(np.uint8), want.view(np.uint8))
    np.testing.assert_array_equal(got[0].view(np.uint8), want.astype(DTYPES[narrow]).view(np.uint8))
    assert simulated_gpu == ["add_in_two_dtypes_vec8"]


def test_a_residual_streams_two_gradients_are_summed_once_for_both_operands(simulated_gpu):
    """s = x + y (a float32 stream plus a bf16 branch) used twice: its backward gets the two contributions unsummed
    (a GradientPair) and writes x's float32 sum and y's bf16 rounding of it in one launch, the same bits as the sum
    kernel and the cast kernel."""
    rng = np.random.default_rng(7)
    x0, y0 = rng.standard_normal((4, 16)).astype(np.float32), rng.standard_normal((4, 16)).astype(ml_dtypes.bfloat16)
    g = rng.standard_normal((4, 16)).astype(np.float32)
    grads = []
    for fused in (True, False):
        x, y = frost.Tensor(x0, requires_grad=True), frost.Tensor(y0, requires_grad=True)
        s = x + y
        with dispatch.disabled(*(() if fused else ("sum_in_dtypes",))):
            (s * 2.0 + s.exp()).backward(frost.Tensor(g))
        grads.append((x.grad.numpy(), y.grad.numpy()))
    assert simulated_gpu.count("add_in_two_dtypes_vec8") == 1 and simulated_gpu.count("cast_from_f32") == 1
    for got, want in zip(*grads):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    s64 = x0.astype(np.float64) + y0.astype(np.float64)
    np.testing.assert_allclose(grads[0][0], g * 2.0 + g * np.exp(s64), rtol=1e-6)


def test_what_the_kernels_do_not_take_is_the_reference_add():
    a = np.zeros(64, np.float32)
    assert add_accel.applies(a, a.astype(ml_dtypes.bfloat16), dtype=np.float32)
    assert not add_accel.applies(a, np.zeros(32, np.float32), dtype=np.float32)            # shapes differ
    assert not add_accel.applies(a, a, dtype=np.float64)                                       # float64 result
    assert not add_accel.applies(a, np.zeros(128, np.float32)[::2], dtype=np.float32)     # b not C order
    assert not add_accel.applies(a[1:], a[:-1], dtype=np.float32)                           # not 16-byte aligned
    assert not add_accel.applies(a, a.astype(np.int32), dtype=np.float32)
    assert dispatch.lookup("add", a, a, dtype=np.float32) is None                           # a CPU array


def test_kernels_compile_for_sm90_without_spills(tmp_path, monkeypatch):
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    for triple in [("float32", "float32", "float32"), ("float32", "bfloat16", "float32"),
                   ("bfloat16", "bfloat16", "bfloat16"), ("float16", "float32", "float32")]:
        cubin = add_accel.add_kernel(*triple).compile("sm_90")
        assert cubin[:4] == b"\x7fELF" and b".nv.local" not in cubin, triple
    for pair in [("float32", "bfloat16"), ("float32", "float16")]:
        cubin = add_accel.sum_in_two_dtypes_kernel(*pair).compile("sm_90")
        assert cubin[:4] == b"\x7fELF" and b".nv.local" not in cubin, pair


@pytest.mark.cuda
@pytest.mark.parametrize("a_dtype,b_dtype,out_dtype", [("float32", "bfloat16", "float32"),
                                                       ("float32", "float32", "float32"),
                                                       ("bfloat16", "bfloat16", "bfloat16")])
def test_gpu_sums_match_the_twin(a_dtype, b_dtype, out_dtype):
    n = 3 * 2**20 + 5
    a, b = _operand(n, a_dtype, 4), _operand(n, b_dtype, 5)
    da, db = (frost.tensor(v, device="cuda").data for v in (a, b))
    assert dispatch.lookup("add", da, db, dtype=DTYPES[out_dtype]) is not None
    got = add_accel.add_kernels(da, db, DTYPES[out_dtype])
    np.testing.assert_array_equal(frost.Tensor(got).cpu().numpy().view(np.uint8), _twin(a, b, out_dtype).view(np.uint8))
