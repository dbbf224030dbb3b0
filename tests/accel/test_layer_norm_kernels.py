"""The LayerNorm / RMSNorm kernels (frost.accel.layer_norm) vs PyTorch float64 and the reference path: values and
every gradient in the CPU simulator (the ops' CUDA branch on NumPy arrays), compiled by NVRTC, and on the GPU."""
import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import frost
from frost import dispatch
from frost.accel import add as add_accel
from frost.accel import bias as bias_accel
from frost.accel import cast as cast_accel
from frost.autocast import kept_copy
from frost.accel import layer_norm as ln
from frost.kernel.api import Kernel
from frost.ops.norm import layer_norm, rms_norm

from accel_simulation import simulate_only

EPS = 1e-5
# the unit roundoff of each dtype: one rounding of a result into it is off by at most this relative amount
ROUNDOFF = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}


@pytest.fixture
def simulated_gpu(monkeypatch):
    """dispatch takes NumPy arrays for CuPy ones, and launches run in the simulator: the CUDA fast path on the CPU."""
    monkeypatch.setattr(Kernel, "__getitem__", lambda self, cfg: self.simulate[cfg])
    monkeypatch.setattr(dispatch, "device_of", lambda array: "cuda")
    return monkeypatch


def _inputs(shape, norm_dims, dtype, seed, affine=True):
    """x (with an offset, so that the mean matters), weight, bias and an upstream gradient, rounded to dtype."""
    rng = np.random.default_rng(seed)
    pshape = shape[len(shape) - norm_dims:]
    x = rng.standard_normal(shape) * 2.0 + 0.5
    w = 1.0 + 0.5 * rng.standard_normal(pshape) if affine else None
    b = 0.3 * rng.standard_normal(pshape) if affine else None
    g = rng.standard_normal(shape)
    rounded = [None if a is None else a.astype(frost.dtype.to_dtype(dtype).np) for a in (x, w, b, g)]
    return rounded


def _torch64(a):
    return None if a is None else torch.tensor(a.astype(np.float64), requires_grad=True)


def _run_frost(op, x, w, b, g, norm_dims, device="cpu"):
    """op's output and gradients of x, weight and bias (None where not given) as NumPy float64."""
    shape = x.shape[x.ndim - norm_dims:]
    tx, tw, tb = (None if a is None else frost.tensor(a, device=device, requires_grad=True) for a in (x, w, b))
    out = layer_norm(tx, shape, tw, tb, EPS) if op == "layer_norm" else rms_norm(tx, shape, tw, EPS)
    assert out.dtype == tx.dtype and out.shape == tx.shape
    out.backward(frost.tensor(g, device=device))
    results = [out] + [None if t is None else t.grad for t in (tx, tw, tb)]
    return [None if t is None else t.detach().cpu().numpy().astype(np.float64) for t in results]


def _run_torch(op, x, w, b, g, norm_dims):
    shape = x.shape[x.ndim - norm_dims:]
    tx, tw, tb = _torch64(x), _torch64(w), _torch64(b)
    out = F.layer_norm(tx, shape, tw, tb, EPS) if op == "layer_norm" else F.rms_norm(tx, shape, tw, EPS)
    out.backward(torch.tensor(g.astype(np.float64)))
    return [t if t is None else t.detach().numpy() for t in (out, tx.grad, None if tw is None else tw.grad,
                                                             None if tb is None else tb.grad)]


def _assert_close(got, want, dtype, rows):
    """got vs float64: one rounding into dtype (relative ROUNDOFF, twice for slack), plus float32 arithmetic whose
    error grows with the terms summed (the weight and bias gradients add `rows` terms) relative to the largest
    value (at least 1); bf16/fp16 results are also compared relative to it, as near-zero values cancel."""
    for name, a, e in zip(("out", "dx", "dweight", "dbias"), got, want):
        if e is None:
            assert a is None, name
            continue
        scale = max(float(np.abs(e).max()), 1.0)  # inputs and gradients are O(1): all-zero results too
        rtol = 2 * ROUNDOFF[dtype] + 1e-5
        atol = (rtol + 1e-6 * rows) * scale
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=f"{name} ({dtype})")


# widths: odd and small, not a multiple of 4 (no vec4), multiples of 4 (vec4 forward), a GPT width; 2-D shapes
CASES = [((3, 5), 1), ((2, 3, 33), 1), ((4, 37), 1), ((5, 64), 1), ((2, 384), 1), ((2, 1001), 1), ((3, 4, 6), 2),
         ((1, 1), 1)]


@pytest.mark.parametrize("shape,norm_dims", CASES)
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_float32_matches_torch_float64(simulated_gpu, op, shape, norm_dims):
    x, w, b, g = _inputs(shape, norm_dims, "float32", seed=sum(shape))
    b = b if op == "layer_norm" else None
    tensors = [None if a is None else frost.tensor(a) for a in (x, w, b)]
    assert dispatch.lookup(op, *tensors[:3 if op == "layer_norm" else 2], shape=shape[len(shape) - norm_dims:])
    rows = int(np.prod(shape[:len(shape) - norm_dims]))
    _assert_close(_run_frost(op, x, w, b, g, norm_dims), _run_torch(op, x, w, b, g, norm_dims), "float32", rows)


@pytest.mark.parametrize("affine", ["none", "weight", "both"])
def test_without_weight_or_bias(simulated_gpu, affine):
    x, w, b, g = _inputs((3, 36), 1, "float32", seed=3)
    w = None if affine == "none" else w
    b = b if affine == "both" else None
    for op in ("layer_norm", "rms_norm"):
        bb = b if op == "layer_norm" else None
        _assert_close(_run_frost(op, x, w, bb, g, 1), _run_torch(op, x, w, bb, g, 1), "float32", 3)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_half_precision_matches_torch_float64(simulated_gpu, op, dtype):
    x, w, b, g = _inputs((6, 96), 1, dtype, seed=7)
    b = b if op == "layer_norm" else None
    got = _run_frost(op, x, w, b, g, 1)
    _assert_close(got, _run_torch(op, x, w, b, g, 1), dtype, 6)


def _record_launches(monkeypatch) -> list:
    """The names of the kernels launched from here on (the simulated GPU's launches go on as before)."""
    launches = []
    launch = Kernel.__getitem__

    def recording(self, cfg):
        launches.append(self.__name__)
        return launch(self, cfg)
    monkeypatch.setattr(Kernel, "__getitem__", recording)
    return launches


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("shape", [(5, 44), (17, 264), (9, 768)])
def test_half_precision_rows_of_every_kind(simulated_gpu, op, dtype, shape):
    """44: no 16-byte accesses (one-value kernels); 264 = 33 chunks of 8: a second round of chunks that only lane 0
    holds; 768: three rounds. Two backward blocks, so warps loop over rows and blocks add their partials."""
    simulated_gpu.setattr(ln, "LN_BACKWARD_BLOCKS", 2)
    x, w, b, g = _inputs(shape, 1, dtype, seed=shape[1])
    b = b if op == "layer_norm" else None
    launches = _record_launches(simulated_gpu)
    got = _run_frost(op, x, w, b, g, 1)
    _assert_close(got, _run_torch(op, x, w, b, g, 1), dtype, shape[0])
    vec8 = shape[1] % 8 == 0
    assert launches[:2] == (["layer_norm_forward_vec8", "layer_norm_backward_vec8"] if vec8 else
                            ["layer_norm_forward", "layer_norm_backward"])
    for a, e in zip(_run_frost(op, x, w, b, g, 1), got):
        assert np.array_equal(a, e)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("shape", [(5, 44), (17, 264), (9, 768)])
def test_float32_rows_of_a_multiple_of_8_take_the_warp_backward(simulated_gpu, op, shape):
    """44: the block backward; 264 and 768: a warp a row, 8 values a lane a chunk in two 16-byte accesses."""
    simulated_gpu.setattr(ln, "LN_BACKWARD_BLOCKS", 2)
    x, w, b, g = _inputs(shape, 1, "float32", seed=shape[1])
    b = b if op == "layer_norm" else None
    launches = _record_launches(simulated_gpu)
    got = _run_frost(op, x, w, b, g, 1)
    _assert_close(got, _run_torch(op, x, w, b, g, 1), "float32", shape[0])
    assert launches[1] == ("layer_norm_backward_vec8" if shape[1] % 8 == 0 else "layer_norm_backward")
    for a, e in zip(_run_frost(op, x, w, b, g, 1), got):
        assert np.array_equal(a, e)


def test_half_precision_backward_plan():
    assert ln.ln_backward_vec8_plan(16384, 384) == (ln.LN_BACKWARD_BLOCKS, 2)  # 48 chunks: lanes 0-15 take two
    assert ln.ln_backward_vec8_plan(20, 768) == (3, 3)
    assert ln.ln_backward_vec8_plan(1, 2048) == (1, ln.LN_WARP_ROWS_MAX_CHUNKS)


def test_half_precision_rows_too_wide_for_the_warp_kernel_take_the_block_kernel(simulated_gpu):
    C = 8 * 32 * ln.LN_WARP_ROWS_MAX_CHUNKS + 8
    x, w, b, g = _inputs((2, C), 1, "bfloat16", seed=2)
    launches = _record_launches(simulated_gpu)
    _assert_close(_run_frost("layer_norm", x, w, b, g, 1), _run_torch("layer_norm", x, w, b, g, 1), "bfloat16", 2)
    assert launches[:2] == ["layer_norm_forward_vec8", "layer_norm_backward"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fast_path_matches_the_reference_path(simulated_gpu, dtype):
    x, w, b, g = _inputs((4, 3, 40), 1, dtype, seed=11)
    fast = _run_frost("layer_norm", x, w, b, g, 1)
    simulated_gpu.setattr(dispatch, "device_of", lambda array: "cpu")
    reference = _run_frost("layer_norm", x, w, b, g, 1)
    # both compute in float32 and round once; only the order of the float32 sums differs
    for a, e in zip(fast, reference):
        np.testing.assert_allclose(a, e, rtol=2 * ROUNDOFF[dtype] + 1e-5, atol=1e-4 * float(np.abs(e).max()))


def test_many_rows_per_block_and_repeated_runs_are_bit_identical(simulated_gpu):
    # 2 backward blocks for 13 rows: each loops over several rows, the second kernel adds 2 partials per column
    simulated_gpu.setattr(ln, "LN_BACKWARD_BLOCKS", 2)
    x, w, b, g = _inputs((13, 20), 1, "float32", seed=5)
    first = _run_frost("layer_norm", x, w, b, g, 1)
    _assert_close(first, _run_torch("layer_norm", x, w, b, g, 1), "float32", 13)
    for a, e in zip(_run_frost("layer_norm", x, w, b, g, 1), first):
        assert np.array_equal(a, e)


def test_kernels_launch_with_the_planned_grids(simulated_gpu):
    launches = []
    record = Kernel.__getitem__

    def recording(self, cfg):
        launches.append((self.__name__, cfg))
        return record(self, cfg)
    simulated_gpu.setattr(Kernel, "__getitem__", recording)
    x, w, b, g = _inputs((18, 64), 1, "float32", seed=1)
    _run_frost("layer_norm", x, w, b, g, 1)
    x, w, b, g = _inputs((18, 60), 1, "float32", seed=1)   # 60: 16-byte accesses forward, not chunks of 8 backward
    _run_frost("layer_norm", x, w, b, g, 1)
    blocks, threads, _ = ln.ln_backward_plan(18, 60)
    warp_blocks, _ = ln.ln_backward_vec8_plan(18, 64)
    assert launches == [("layer_norm_forward_vec4", (3, ln.LN_FORWARD_THREADS)),
                        ("layer_norm_backward_vec8", (warp_blocks, ln.LN_WARP_ROWS_THREADS)),
                        ("layer_norm_param_grads", (2, ln.LN_FINALIZE_THREADS)),
                        ("layer_norm_forward_vec4", (3, ln.LN_FORWARD_THREADS)),
                        ("layer_norm_backward", (blocks, threads)),
                        ("layer_norm_param_grads", (2, ln.LN_FINALIZE_THREADS))]


@pytest.fixture
def layer_norm_and_casts(monkeypatch):
    """An empty dispatch table with only the LayerNorm and cast kernels, registered for CPU arrays and run in the
    simulator (products stay NumPy's); returns the names of the kernels launched."""
    return simulate_only(monkeypatch, ("layer_norm", ln._fits_layer_norm, ln.layer_norm_kernels),
                         ("cast", cast_accel.applies, cast_accel.cast_kernels))


def _norm_then_linear(x, w, b, weight, g, half, drop_copy=False):
    """layer_norm then a linear layer under autocast(half): [output, the kept copy, x's, w's, b's, weight's grads]."""
    xt, wt, bt, lin = (frost.tensor(a, requires_grad=True) for a in (x, w, b, weight))
    with frost.autocast(half):
        y = layer_norm(xt, (x.shape[-1],), wt, bt)
        copy = y.__dict__.pop("_autocast_copy") if drop_copy else y.__dict__.get("_autocast_copy")
        z = frost.nn.functional.linear(y, lin).float()
    z.backward(frost.tensor(g))
    return [z.detach().numpy(), copy] + [t.grad.numpy() for t in (xt, wt, bt, lin)]


@pytest.mark.parametrize("half", ["bfloat16", "float16"])
def test_under_autocast_the_forward_writes_the_copy_the_linear_layer_takes(layer_norm_and_casts, half):
    """Under autocast a float32 LayerNorm (rows of a multiple of 4) also writes its output rounded once into the
    region's dtype, and the linear layer after it takes that copy instead of a cast kernel's; the linear layer
    gives the LayerNorm its gradient in float32 (no cast kernel back either). Output and every gradient the same
    bits as with the copy thrown away (the cast kernel's)."""
    x, w, b, _ = _inputs((6, 32), 1, "float32", seed=3)
    rng = np.random.default_rng(4)
    weight, g = rng.standard_normal((16, 32)).astype(np.float32), rng.standard_normal((6, 16)).astype(np.float32)
    fused = _norm_then_linear(x, w, b, weight, g, half)
    assert layer_norm_and_casts == ["layer_norm_forward_vec4", "cast_from_f32",   # the weight's cast only
                                    "cast_to_f32", "cast_from_f32",               # z.float() and its gradient
                                    "layer_norm_backward_vec8", "layer_norm_param_grads"]
    y = layer_norm(frost.tensor(x), (32,), frost.tensor(w), frost.tensor(b)).numpy()
    np.testing.assert_array_equal(fused[1][2].view(np.uint16), y.astype(frost.dtype.to_dtype(half).np).view(np.uint16))
    unfused = _norm_then_linear(x, w, b, weight, g, half, drop_copy=True)
    assert layer_norm_and_casts.count("cast_from_f32") == 2 + 3   # this time y's cast too
    assert layer_norm_and_casts.count("cast_to_f32") == 2   # z.float()'s: y's gradient comes back in float32
    for got, want in zip(fused[:1] + fused[2:], unfused[:1] + unfused[2:]):
        np.testing.assert_array_equal(got, want)


def test_a_kept_copy_is_not_used_once_its_tensor_changes(layer_norm_and_casts):
    x, w, b, _ = _inputs((4, 16), 1, "float32", seed=6)
    assert "_autocast_copy" not in layer_norm(frost.tensor(x), (16,)).__dict__   # none outside autocast
    with frost.autocast(frost.bfloat16):
        y = layer_norm(frost.tensor(x), (16,), frost.tensor(w), frost.tensor(b))
    assert kept_copy(y, ml_dtypes.bfloat16) is not None and kept_copy(y, np.float16) is None
    y.mul_(2.0)
    assert kept_copy(y, ml_dtypes.bfloat16) is None
    with frost.autocast(frost.bfloat16):
        z = frost.nn.functional.linear(y, frost.eye(16))
    np.testing.assert_array_equal(z.float().numpy(), y.numpy().astype(ml_dtypes.bfloat16).astype(np.float32))


@pytest.mark.parametrize("C", [64, 60])   # the warp-a-row backward adds in its pass; the other one after it
@pytest.mark.parametrize("branch", ["bfloat16", "float16"])
def test_the_backward_adds_the_streams_gradient_so_far_as_the_autograd_would(monkeypatch, C, branch):
    """s = x + h (float32 stream, 16-bit branch) feeds a LayerNorm and, before it, another op: the LayerNorm's
    backward takes s's gradient so far, adds its own (and writes h's 16-bit copy of the sum, which the add's backward
    takes), the same bits as the autograd summing the two and casting; a 60-wide row adds after its kernel."""
    launched = simulate_only(monkeypatch, ("layer_norm", ln._fits_layer_norm, ln.layer_norm_kernels),
                             ("add", add_accel.applies, add_accel.add_kernels),
                             ("cast", cast_accel.applies, cast_accel.cast_kernels))
    rng = np.random.default_rng(C)
    x0, h0, k = (rng.standard_normal((6, C)).astype(np.float32) for _ in range(3))
    results, backward_kernels = [], []
    for adds in (True, False):
        monkeypatch.setattr(ln, "ADDS_TO_GRADIENTS", adds)
        x = frost.tensor(x0, requires_grad=True)
        h = frost.tensor(h0.astype(frost.dtype.to_dtype(branch).np), requires_grad=True)
        s = x + h
        out = s.exp() * frost.tensor(k) + layer_norm(s, (C,))
        start = len(launched)
        out.backward(frost.tensor(k))
        results.append((x.grad.numpy(), h.grad.numpy()))
        backward_kernels.append(launched[start:])
    for got, want in zip(*results):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    adding, summing = backward_kernels
    # the autograd's sum of s's two gradients; with LayerNorm adding, none (a 60-wide row: LayerNorm's own, after)
    assert adding.count("add_vec8") == (C == 60) and summing.count("add_vec8") == 1
    assert adding.count("cast_from_f32") == (C == 60) and summing.count("cast_from_f32") == 1   # h's, if no copy


def test_a_branch_from_a_linear_layer_gets_its_bias_gradients_partial_sums(monkeypatch):
    """s = x + linear(h) under autocast, then a LayerNorm: its backward also sums the columns of the branch's bf16
    gradient it writes, and the linear layer's bias gradient is their finalize (float32 sums of the same bf16 values
    in another order than sum_rows_partial's)."""
    launched = simulate_only(monkeypatch, ("layer_norm", ln._fits_layer_norm, ln.layer_norm_kernels),
                             ("add", add_accel.applies, add_accel.add_kernels),
                             ("cast", cast_accel.applies, cast_accel.cast_kernels),
                             ("sum_rows", bias_accel.sums_rows, bias_accel.sum_rows_kernels_call))
    rng = np.random.default_rng(11)
    x0, h0, k = (rng.standard_normal((130, 64)).astype(np.float32) for _ in range(3))
    w0, b0 = rng.standard_normal((64, 64)).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    results, backward_kernels = [], []
    for adds in (True, False):
        monkeypatch.setattr(ln, "ADDS_TO_GRADIENTS", adds)
        x, h, w, b = (frost.tensor(a, requires_grad=True) for a in (x0, h0, w0, b0))
        with frost.autocast(frost.bfloat16):
            s = x + frost.nn.functional.linear(h, w, b)
        out = s.exp() * frost.tensor(k) + layer_norm(s, (64,))
        start = len(launched)
        out.backward(frost.tensor(k))
        results.append([t.grad.numpy() for t in (x, h, w, b)])
        backward_kernels.append(launched[start:])
    assert "sum_rows_partial" not in backward_kernels[0] and "sum_rows_partial" in backward_kernels[1]
    for got, want in zip(results[0][:3], results[1][:3]):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(results[0][3], results[1][3], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("C", [1, 5, 384, 768, 1024, 1600, 4097, ln.LN_MAX_WIDTH])
def test_backward_plan_covers_the_row(C):
    blocks, threads, K = ln.ln_backward_plan(10_000, C)
    assert threads % 32 == 0 and threads <= 1024 and 1 <= K <= ln.LN_MAX_PER_THREAD
    assert K * threads >= C > (K - 1) * threads
    assert blocks == ln.LN_BACKWARD_BLOCKS and ln.ln_backward_plan(7, C)[0] == 7


def test_shapes_the_kernels_do_not_take_run_the_reference_path(simulated_gpu):
    x = frost.randn(4, 8)
    assert dispatch.lookup("layer_norm", x, None, None, shape=(8,)) is ln.layer_norm_kernels
    assert dispatch.lookup("layer_norm", x.double(), None, None, shape=(8,)) is None        # float64
    assert dispatch.lookup("layer_norm", x.t(), None, None, shape=(4,)) is None             # not contiguous
    assert dispatch.lookup("layer_norm", x, frost.ones(8).bfloat16(), None, shape=(8,)) is None  # mixed dtypes
    wide = frost.zeros(1, ln.LN_MAX_WIDTH + 1)
    assert dispatch.lookup("layer_norm", wide, None, None, shape=(ln.LN_MAX_WIDTH + 1,)) is None
    assert dispatch.lookup("layer_norm", frost.zeros(0, 8), None, None, shape=(8,)) is None
    assert dispatch.lookup("rms_norm", x, None, shape=(8,)) is ln.rms_norm_kernels


def test_the_cpu_runs_the_reference_path():
    assert dispatch.lookup("layer_norm", frost.randn(2, 8), None, None, shape=(8,)) is None


def test_errors_are_checked_before_the_fast_path(simulated_gpu):
    with pytest.raises(RuntimeError, match=r"layer_norm: normalized_shape \(5,\) does not match"):
        layer_norm(frost.randn(2, 4), (5,))
    with pytest.raises(RuntimeError, match=r"layer_norm: weight of shape \(3,\) does not fit input of shape"):
        layer_norm(frost.randn(2, 4), (4,), frost.ones(3))


SPECS = [(kernels["forward"], dict(WEIGHT=w, BIAS=b, RMS=r)) for kernels in ln.LN_KERNELS.values()
         for w in (False, True) for b in (False, True) for r in (False, True)]
SPECS += [(kernels["param_grads"], dict(WEIGHT=w, BIAS=b)) for kernels in ln.LN_KERNELS.values()
          for w in (False, True) for b in (False, True)]
SPECS += [(ln.layer_norm_forward_vec4, dict(WEIGHT=w, BIAS=b, RMS=r)) for w in (False, True) for b in (False, True)
          for r in (False, True)]
SPECS += [(kernel, dict(WEIGHT=True, BIAS=True, RMS=False, COPY=True)) for kernel in ln.LN_FORWARD_VEC4.values()]
SPECS += [(kernel, dict(K=3, WEIGHT=True, RMS=False, ADD=True, COPY=True, SUMS=True))
          for kernel in ln.LN_BACKWARD_VEC8.values()]
SPECS += [(kernels["backward"], dict(K=k, WEIGHT=w, RMS=r)) for kernels in ln.LN_KERNELS.values()
          for k in (1, 4, ln.LN_MAX_PER_THREAD) for w in (False, True) for r in (False, True)]
HALF_KERNELS = [ln.LN_KERNELS["bfloat16"], ln.LN_KERNELS["float16"]]
SPECS += [(kernels["forward_vec8"], dict(WEIGHT=w, BIAS=b, RMS=r)) for kernels in HALF_KERNELS
          for w in (False, True) for b in (False, True) for r in (False, True)]
SPECS += [(kernels["backward_vec8"], dict(K=k, WEIGHT=w, RMS=r)) for kernels in ln.LN_KERNELS.values()
          for k in (1, 3, ln.LN_WARP_ROWS_MAX_CHUNKS) for w in (False, True) for r in (False, True)]


def test_kernels_compile_for_sm90_without_spills(tmp_path, monkeypatch):
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    for kern, consts in SPECS:
        cubin = kern.compile("sm_90", **consts)
        assert cubin[:4] == b"\x7fELF", (kern.__name__, consts)
        assert b".nv.local" not in cubin, f"{kern.__name__} {consts} spills registers to local memory"


# ------------------------------------------------------------------ on the GPU

GPU_CASES = [((64, 256, 768), "float32"), ((8, 1024, 768), "bfloat16"), ((4, 128, 1600), "bfloat16"),
             ((16, 384), "float16"), ((3, 1027), "float32"), ((5, 7, 1001), "bfloat16")]


@pytest.mark.cuda
@pytest.mark.parametrize("shape,dtype", GPU_CASES)
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_gpu_matches_torch_float64(op, shape, dtype):
    x, w, b, g = _inputs(shape, 1, dtype, seed=len(shape))
    b = b if op == "layer_norm" else None
    params = [None] * (2 if op == "layer_norm" else 1)
    assert dispatch.lookup(op, frost.tensor(x, device="cuda"), *params, shape=shape[-1:]) is not None
    rows = int(np.prod(shape[:-1]))
    got = _run_frost(op, x, w, b, g, 1, device="cuda")
    _assert_close(got, _run_torch(op, x, w, b, g, 1), dtype, rows)


@pytest.mark.cuda
def test_gpu_runs_are_bit_identical():
    x, w, b, g = _inputs((32, 512, 768), 1, "bfloat16", seed=2)
    first = _run_frost("layer_norm", x, w, b, g, 1, device="cuda")
    for a, e in zip(_run_frost("layer_norm", x, w, b, g, 1, device="cuda"), first):
        assert np.array_equal(a, e)
