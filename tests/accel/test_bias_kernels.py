"""A linear layer's bias kernels (frost/accel/bias.py) in the simulator: the in-place add over rows and the column
sums of the gradient against float64 NumPy twins (one rounding into the output's dtype), several row chunks and a
given output buffer, and F.linear's forward and backward through them against the reference path."""
import ml_dtypes
import numpy as np
import pytest

import frost
import frost.nn.functional as F
from frost import dispatch
from frost.accel import bias as kernels
from frost.ops.matmul import add_bias, sum_rows

from accel_simulation import simulate_only

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


@pytest.fixture
def simulated_kernels(monkeypatch):
    """An empty dispatch table with only the bias kernels, registered for CPU arrays and run in the simulator."""
    return simulate_only(monkeypatch, ("add_bias", kernels.adds_bias, kernels.add_bias_kernels),
                         ("sum_rows", kernels.sums_rows, kernels.sum_rows_kernels_call))


@pytest.mark.parametrize("out_dtype, bias_dtype", [("float32", "float32"), ("bfloat16", "bfloat16"),
                                                   ("float16", "float32")])
def test_bias_is_added_to_every_row_in_float32_and_rounded_once(simulated_kernels, out_dtype, bias_dtype):
    rng = np.random.default_rng(0)
    product = rng.standard_normal((5, 24)).astype(DTYPES[out_dtype])
    bias = rng.standard_normal(24).astype(DTYPES[bias_dtype])
    want = (product.astype(np.float64) + bias.astype(np.float64)).astype(np.float32).astype(product.dtype)
    add_bias(product, bias)
    assert simulated_kernels == ["add_bias_vec8"]
    np.testing.assert_array_equal(product, want)


# one chunk, a whole one, three (the last ragged), 35 (a finalize lane adds two: parts 0 and 32, ...)
@pytest.mark.parametrize("rows", [1, 64, 130, 34 * 64 + 5])
@pytest.mark.parametrize("in_dtype, out_dtype", [("bfloat16", "float32"), ("float32", "float32"),
                                                 ("float16", "float16")])
def test_column_sums_match_float64_and_repeat_exactly(simulated_kernels, rows, in_dtype, out_dtype):
    g = np.random.default_rng(rows).standard_normal((rows, 16)).astype(DTYPES[in_dtype])
    got = sum_rows(g, DTYPES[out_dtype])
    want = g.astype(np.float64).sum(axis=0)
    assert got.dtype == np.dtype(DTYPES[out_dtype]) and got.shape == (16,)
    unit = 2.0**-11 if out_dtype == "float16" else 2.0**-23
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2 * unit, atol=rows * 2.0**-24)
    assert simulated_kernels == ["sum_rows_partial", "sum_rows_finalize"]
    np.testing.assert_array_equal(sum_rows(g, DTYPES[out_dtype]), got)   # a fixed order: the same bits again


def test_column_sums_go_into_a_given_buffer(simulated_kernels):
    g = np.arange(3 * 8, dtype=np.float32).reshape(3, 8)
    dest = np.full(8, np.nan, np.float32)
    assert sum_rows(g, np.float32, out=dest) is dest
    np.testing.assert_array_equal(dest, g.sum(axis=0))


def test_shapes_the_kernels_do_not_take_stay_with_numpy(simulated_kernels):
    g = np.ones((4, 10), np.float32)                      # 10 columns: not whole 16-byte vectors
    np.testing.assert_array_equal(sum_rows(g, g.dtype), np.full(10, 4.0))
    product = np.zeros((4, 16), np.float32)[:, ::2]        # strided
    add_bias(product, np.ones(8, np.float32))
    assert simulated_kernels == [] and (product == 1).all()


def test_linear_through_the_bias_kernels_matches_the_reference(simulated_kernels):
    rng = np.random.default_rng(3)
    x, w, b = (rng.standard_normal(shape).astype(np.float32) for shape in ((2, 3, 8), (16, 8), (16,)))
    g = rng.standard_normal((2, 3, 16)).astype(np.float32)
    results = []
    for fast in (True, False):
        if not fast:
            dispatch._table.clear()
        tensors = [frost.tensor(a, requires_grad=True) for a in (x, w, b)]
        out = F.linear(*tensors)
        out.backward(frost.tensor(g))
        results.append([out.detach().numpy()] + [t.grad.numpy() for t in tensors])
    assert "add_bias_vec8" in simulated_kernels and "sum_rows_partial" in simulated_kernels
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kern", [kernels.add_bias_kernel("bfloat16", "bfloat16"), kernels.add_bias_kernel("float32",
                                                                                                         "float32"),
                                  *kernels.sum_rows_kernels("bfloat16", "float32"),
                                  *kernels.sum_rows_kernels("float32", "float32")],
                         ids=["add_bf16", "add_f32", "partial_bf16", "finalize_bf16", "partial_f32", "finalize_f32"])
def test_kernels_compile_for_sm90_without_spills(kern, tmp_path, monkeypatch):
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    cubin = kern.compile("sm_90")
    assert cubin[:4] == b"\x7fELF" and b".nv.local" not in cubin


@pytest.mark.cuda
@pytest.mark.parametrize("autocast", [False, True])
def test_gpu_linear_with_bias_matches_float64(autocast):
    """F.linear with a bias on the GPU (the kernels above, at a GPT-2-like width) against float64 NumPy: the output
    and every gradient, TF32 or bf16 products (tolerances of their rounding)."""
    rng = np.random.default_rng(4)
    x, w, b = (rng.standard_normal(shape).astype(np.float32) for shape in ((4, 96, 64), (192, 64), (192,)))
    g = rng.standard_normal((4, 96, 192)).astype(np.float32)
    tensors = [frost.tensor(a, device="cuda", requires_grad=True) for a in (x, w, b)]
    with frost.autocast(frost.bfloat16, enabled=autocast):
        out = F.linear(*tensors)
    out.backward(frost.tensor(g.astype(out.dtype.np), device="cuda"))
    x2, g2 = x.reshape(-1, 64).astype(np.float64), g.reshape(-1, 192).astype(np.float64)
    want = [x2 @ w.T.astype(np.float64) + b, g2 @ w.astype(np.float64), g2.T @ x2, g2.sum(axis=0)]
    got = [out.detach().float().cpu().numpy().reshape(-1, 192)] + [t.grad.cpu().numpy().reshape(-1, *t.shape[-1:])
                                                                     for t in tensors]
    rtol = 2e-2 if autocast else 5e-3   # bf16 operands (8 bits), or TF32's 10
    for name, a, ref in zip(("out", "dx", "dw", "db"), got, want):
        scale = np.abs(ref).max()
        assert np.abs(a - ref).max() <= rtol * scale, name
