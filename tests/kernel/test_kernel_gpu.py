"""GPU launches (`pytest -m cuda`): kernels on CuPy arrays agree with the simulator and NumPy."""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import frost
from frost.kernel import Array, bx, f32, kernel, tx

from examples_loader import EXAMPLES, load_example
from test_kernel_language import FAST_EXP2_INPUTS, fast_exp2_kernel, fast_exp2_want

pytestmark = pytest.mark.cuda


@pytest.fixture
def cp():
    import cupy
    return cupy


def test_relu_forward_backward(cp):
    mod = load_example("relu")
    n = 100_003
    x = cp.random.standard_normal(n, dtype=cp.float32)
    dy = cp.random.standard_normal(n, dtype=cp.float32)
    y, dx = cp.empty_like(x), cp.empty_like(x)
    mod.relu_forward[256, 256](x, y, n)
    mod.relu_backward[256, 256](x, dy, dx, n)
    np.testing.assert_array_equal(cp.asnumpy(y), np.maximum(cp.asnumpy(x), 0))
    np.testing.assert_array_equal(cp.asnumpy(dx), np.where(cp.asnumpy(x) > 0, cp.asnumpy(dy), 0))


def test_adamw_matches_simulator_and_numpy(cp):
    mod = load_example("adamw")
    n = 5000
    rng = np.random.default_rng(0)
    host = [rng.standard_normal(n).astype(np.float32) for _ in range(2)] + [np.zeros(n, np.float32) for _ in range(2)]
    dev = [cp.asarray(a) for a in host]
    mod.adamw_step(*dev, step=3)
    sim = [a.copy() for a in host]
    mod.adamw_step(*sim, step=3, simulate=True)
    want = mod.adamw_numpy(host[0].astype(np.float64), host[1], host[2], host[3], 3)
    for d, s, w in zip((dev[0], dev[2], dev[3]), (sim[0], sim[2], sim[3]), want):
        np.testing.assert_allclose(cp.asnumpy(d), s, rtol=2e-6, atol=1e-7)
        np.testing.assert_allclose(cp.asnumpy(d), w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant", ["scalar", "vec4", "vec4_ilp1", "vec4_ilp2", "vec4_ilp4"])
def test_every_adamw_variant_matches_simulator_and_numpy(cp, variant):
    mod = load_example("adamw")
    assert variant in mod.VARIANTS
    for n in (5003, 1 << 20):  # a tail of 3; and enough elements for several grid-stride rounds
        rng = np.random.default_rng(n)
        host = [rng.standard_normal(n).astype(np.float32) for _ in range(2)] + [
            (rng.standard_normal(n) * 0.1).astype(np.float32), (rng.random(n) * 0.1).astype(np.float32)]
        dev = [cp.asarray(a) for a in host]
        mod.adamw_step(*dev, step=3, variant=variant, blocks_per_sm=1)
        want = mod.adamw_numpy(host[0].astype(np.float64), host[1], host[2], host[3], 3)
        for d, w in zip((dev[0], dev[2], dev[3]), want):
            np.testing.assert_allclose(cp.asnumpy(d), w, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(cp.asnumpy(dev[1]), host[1])
        if n < 10_000:
            sim = [a.copy() for a in host]
            mod.adamw_step(*sim, step=3, simulate=True, variant=variant)
            for d, s_ in zip((dev[0], dev[2], dev[3]), (sim[0], sim[2], sim[3])):
                np.testing.assert_allclose(cp.asnumpy(d), s_, rtol=2e-6, atol=1e-7)


def test_vector_kernel_rejects_a_misaligned_view(cp):
    mod = load_example("adamw")
    p, g, m, v = (cp.zeros(1001, cp.float32) for _ in range(4))
    with pytest.raises(ValueError, match="argument 'p' is accessed 16 bytes at a time"):
        mod.adamw_step(p[1:], g[1:], m[1:], v[1:], step=1, variant="vec4")


def test_frost_tensors_are_accepted(cp):
    mod = load_example("relu")
    x = frost.randn(1000).cuda()
    y = frost.zeros(1000).cuda()
    mod.relu_forward[4, 256](x, y, 1000)
    np.testing.assert_array_equal(y.numpy(), np.maximum(x.numpy(), 0))


def test_block_reductions(cp):
    mod = load_example("block_reduce")
    n = 1 << 20
    x = cp.random.standard_normal(n, dtype=cp.float32)
    want = float(cp.asnumpy(x).astype(np.float64).sum())
    for k, grid, block in ((mod.reduce_sum, 264, 256), (mod.reduce_sum_tree, n // 256, 256)):
        out = cp.zeros(1, cp.float32)
        k[grid, block](x, out, n)
        assert float(out[0]) == pytest.approx(want, rel=1e-4, abs=0.5)


def test_row_softmax(cp):
    mod = load_example("softmax")
    x = cp.random.standard_normal((37, 1000), dtype=cp.float32) * 5
    y = cp.empty_like(x)
    mod.softmax_rows[37, 256](x, y)
    np.testing.assert_allclose(cp.asnumpy(y), mod.softmax_numpy(cp.asnumpy(x).astype(np.float64)), rtol=1e-5,
                               atol=1e-8)
    xs = cp.asnumpy(x[:2, :100])  # the simulator agrees on a small slice
    ys = np.empty_like(xs)
    mod.softmax_rows.simulate[2, 64](xs, ys)
    yg = cp.empty((2, 100), cp.float32)
    mod.softmax_rows[2, 64](cp.asarray(xs), yg)
    np.testing.assert_allclose(cp.asnumpy(yg), ys, rtol=1e-5, atol=1e-8)


def test_two_d_strided_views(cp):
    @kernel
    def transpose(a: Array[f32, 2], b: Array[f32, 2]):
        r = bx
        c = tx
        if c < a.shape[1]:
            b[c, r] = a[r, c]
    a = cp.arange(64 * 48, dtype=cp.float32).reshape(64, 48)[::2, 1:]  # a strided, offset view
    b = cp.zeros((47, 32), cp.float32)
    transpose[32, 64](a, b)
    np.testing.assert_array_equal(cp.asnumpy(b), cp.asnumpy(a).T)


def test_launch_errors_name_the_argument(cp):
    mod = load_example("relu")
    x = cp.zeros(10, cp.float32)
    with pytest.raises(TypeError, match=r"relu_forward\(\) takes 3 arguments"):
        mod.relu_forward[1, 32](x, x)
    with pytest.raises(TypeError, match="argument 'y' is Array\\[f32\\] but got an array of dtype int32"):
        mod.relu_forward[1, 32](x, cp.zeros(10, cp.int32), 10)
    with pytest.raises(TypeError, match="argument 'x' .* must be a CUDA tensor or CuPy array"):
        mod.relu_forward[1, 32](np.zeros(10, np.float32), x, 10)


def test_cuda_source_launch(cp):
    k = frost.cuda_source('extern "C" __global__ void scale(float* x, float a, int n) {'
                          ' int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= a; }', "scale")
    x = cp.ones(1000, cp.float32)
    k[4, 256](x, 3.0, 1000)
    assert float(x.sum()) == 3000.0
    with pytest.raises(TypeError, match="takes 3 arguments"):
        k[4, 256](x, 3.0)
    with pytest.raises(TypeError, match="argument 'x' \\(float\\*\\) must be a CUDA tensor"):
        k[4, 256](1.0, 3.0, 1000)


def test_launch_on_a_stream_and_with_dynamic_shared_memory(cp):
    from frost.kernel import dynamic_shared, syncthreads

    @kernel
    def rev(x: Array[f32], y: Array[f32]):
        s = dynamic_shared(f32)
        s[tx] = x[tx]
        syncthreads()
        y[tx] = s[len(s) - 1 - tx]
    x = cp.arange(128, dtype=cp.float32)
    y = cp.zeros_like(x)
    stream = cp.cuda.Stream()
    rev[1, 128, 128 * 4, stream](x, y)
    stream.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(y), cp.asnumpy(x)[::-1])


GPU_SCRIPT = """
import json, sys, time, importlib.util
t0 = time.perf_counter()
spec = importlib.util.spec_from_file_location("ex", {path!r})
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
import cupy as cp
from frost.kernel import api, compile_stats
api._warm.clear()  # this process counts the example's own compile, not kernel.warm's
x = cp.ones(1000, cp.float32); y = cp.empty_like(x)
mod.relu_forward[4, 256](x, y, 1000)
cp.cuda.runtime.deviceSynchronize()
assert float(y.sum()) == 1000.0
print(json.dumps(dict(compile_stats, seconds=time.perf_counter() - t0)))
"""


def test_second_process_launches_without_compiling(tmp_path):
    env = dict(os.environ, FROST_CACHE_DIR=str(tmp_path))
    code = GPU_SCRIPT.format(path=str(EXAMPLES / "relu.py"))
    runs = [json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                      check=True).stdout.strip().splitlines()[-1]) for _ in range(2)]
    print("first process:", runs[0], "second process:", runs[1])
    assert runs[0]["nvrtc_compiles"] == 1 and runs[1]["nvrtc_compiles"] == 0 and runs[1]["disk_hits"] == 1


def test_tensor_core_gemm_matches_numpy_and_simulator(cp):
    import ml_dtypes
    gemm = load_example("gemm")
    rng = np.random.default_rng(0)
    for (m, n, k), tiles in (((256, 256, 512), {}), ((128, 192, 96), gemm.SMALL)):
        a = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
        b = rng.standard_normal((k, n)).astype(ml_dtypes.bfloat16)
        c = cp.zeros((m, n), cp.float32)
        gemm.gemm(cp.asarray(a.view(np.uint16)), cp.asarray(b.view(np.uint16)), c, **tiles)
        np.testing.assert_allclose(cp.asnumpy(c), a.astype(np.float64) @ b.astype(np.float64), rtol=1e-3, atol=1e-2)
    a = rng.standard_normal((64, 64)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((64, 64)).astype(ml_dtypes.bfloat16)
    sim = np.zeros((64, 64), np.float32)
    gemm.gemm(a, b, sim, simulate=True, **gemm.SMALL)
    c = cp.zeros((64, 64), cp.float32)
    gemm.gemm(cp.asarray(a.view(np.uint16)), cp.asarray(b.view(np.uint16)), c, **gemm.SMALL)
    np.testing.assert_allclose(cp.asnumpy(c), sim, rtol=1e-5, atol=1e-4)


def test_every_benchmarked_gemm_configuration_is_correct(cp):
    """Each tile configuration benchmarks/kernels.py times (padded and swizzled kernels) on a 256 x 256 x 512 GEMM."""
    import ml_dtypes
    gemm = load_example("gemm")
    spec = importlib.util.spec_from_file_location("frost_bench_kernels", EXAMPLES.parents[1] / "benchmarks" /
                                                  "kernels.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((256, 512)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((512, 256)).astype(ml_dtypes.bfloat16)
    want = a.astype(np.float64) @ b.astype(np.float64)
    ag, bg = cp.asarray(a.view(np.uint16)), cp.asarray(b.view(np.uint16))
    for cfg in bench.CONFIGS:
        c = cp.full((256, 256), cp.nan, cp.float32)
        gemm.gemm(ag, bg, c, **cfg)
        np.testing.assert_allclose(cp.asnumpy(c), want, rtol=1e-3, atol=1e-2, err_msg=bench.config_name(cfg))
    sim = np.zeros((64, 64), np.float32)
    gemm.gemm(a[:64, :128], b[:128, :64], sim, simulate=True, kernel="swizzled", **gemm.SMALL_FAST)
    c = cp.zeros((64, 64), cp.float32)
    gemm.gemm(cp.asarray(a[:64, :128].view(np.uint16)), cp.asarray(b[:128, :64].view(np.uint16)), c,
              kernel="swizzled", **gemm.SMALL_FAST)
    np.testing.assert_allclose(cp.asnumpy(c), sim, rtol=1e-5, atol=1e-4)


def test_single_warp_fragments_agree_with_the_simulator(cp):
    """The simulator's ldmatrix/mma fragment layouts are checked against the hardware here."""
    import ml_dtypes
    from frost.kernel import (bf16, lane, ldmatrix_x2_trans, ldmatrix_x4, local, mma_16x8x16, shared, static_range,
                              syncthreads)

    @kernel
    def mma_once(a: Array[bf16, 2], b: Array[bf16, 2], c: Array[f32, 2]):
        sa = shared(bf16, (16, 16))
        sb = shared(bf16, (16, 8))
        for k in static_range(8):
            sa[tx // 2, (tx % 2) * 8 + k] = a[tx // 2, (tx % 2) * 8 + k]
        for k in static_range(4):
            sb[tx // 2, (tx % 2) * 4 + k] = b[tx // 2, (tx % 2) * 4 + k]
        syncthreads()
        af = local(bf16, 8)
        bf = local(bf16, 4)
        acc = local(f32, 4)
        for q in static_range(4):
            acc[q] = f32(lane * 4 + q)   # a distinct start value per fragment slot exposes the C layout too
        ldmatrix_x4(af, sa, (lane % 16, lane // 16 * 8))
        ldmatrix_x2_trans(bf, sb, (lane % 16, 0))
        mma_16x8x16(acc, af, bf)
        for q in static_range(4):
            c[lane * 4 + q, 0] = acc[q]
    rng = np.random.default_rng(0)
    a = rng.standard_normal((16, 16)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((16, 8)).astype(ml_dtypes.bfloat16)
    sim = np.zeros((128, 1), np.float32)
    mma_once.simulate[1, 32](a, b, sim)
    c = cp.zeros((128, 1), cp.float32)
    mma_once[1, 32](cp.asarray(a.view(np.uint16)), cp.asarray(b.view(np.uint16)), c)
    np.testing.assert_allclose(cp.asnumpy(c), sim, rtol=1e-5, atol=1e-5)


def test_tf32_fragments_agree_with_the_simulator(cp):
    """ldmatrix of a shared f32 tile and the m16n8k8 TF32 step on the hardware: the simulator's layouts and its
    reading of the operands (the low 13 mantissa bits dropped) against the GPU's sums."""
    from test_kernel_tensor_cores import _tf32, tf32_mma_once
    rng = np.random.default_rng(3)
    a = rng.standard_normal((16, 8)).astype(np.float32)
    b = rng.standard_normal((8, 8)).astype(np.float32)
    k = tf32_mma_once()
    sim = np.zeros((16, 8), np.float32)
    k.simulate[1, 32](a, b, sim)
    c = cp.zeros((16, 8), cp.float32)
    k[1, 32](cp.asarray(a), cp.asarray(b), c)
    np.testing.assert_allclose(cp.asnumpy(c), _tf32(a) @ _tf32(b) + 1, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(cp.asnumpy(c), sim, rtol=1e-6, atol=1e-6)


def test_fast_exp2_on_the_gpu_flushes_like_the_simulator(cp):
    out = cp.zeros(16, cp.float32)
    fast_exp2_kernel[1, 16](cp.asarray(FAST_EXP2_INPUTS), out)
    np.testing.assert_allclose(out.get(), fast_exp2_want(FAST_EXP2_INPUTS), rtol=2e-6, atol=0)   # ex2.approx: 2^-22
