"""The fused GPU batch-norm kernels (split reductions, statistics merged in the elementwise kernels, + residual
add, + ReLU), for NCHW and channels-last arrays (float32, and bf16 activations channels-last), vs float64 NumPy and
the CPU path."""
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

import frost
from frost import dispatch
from frost.accel import batch_norm as bn
from frost.layout import as_channels_last, is_channels_last
from frost.ops import norm

EPS, MOMENTUM = 1e-5, 0.1
RM0, RV0, BATCHES0 = 0.5, 2.0, 5  # running stats and num_batches_tracked before the simulated forward


def _reference64(x, w, b, res, g, relu, rm, rv, momentum=MOMENTUM):
    """Forward, gradients and updated running stats of relu(batch_norm(x) * w + b + res) in float64."""
    x, w, b, res, g = (a.astype(np.float64) for a in (x, w, b, res, g))
    axes = (0,) + tuple(range(2, x.ndim))
    cs = (1, -1) + (1,) * (x.ndim - 2)
    n = x.size // x.shape[1]
    mean, var = x.mean(axis=axes), x.var(axis=axes)
    invstd = 1 / np.sqrt(var + EPS)
    xhat = (x - mean.reshape(cs)) * invstd.reshape(cs)
    y = xhat * w.reshape(cs) + b.reshape(cs) + res
    if relu:
        g = np.where(y > 0, g, 0.0)
        y = np.maximum(y, 0.0)
    db, dw = g.sum(axis=axes), (g * xhat).sum(axis=axes)
    dx = (w * invstd).reshape(cs) * (g - db.reshape(cs) / n - xhat * dw.reshape(cs) / n)
    running = ((1 - momentum) * rm + momentum * mean, (1 - momentum) * rv + momentum * var * n / (n - 1))
    return dict(mean=mean, invstd=invstd, y=y, dx=dx, dw=dw, db=db, dres=g, rm=running[0], rv=running[1])


def _simulate(x, w, b, res, g, relu, threads, U, add_residual=1, fused=1, apply_threads=64, apply_U=1,
              momentum=MOMENTUM, count_batch=1, update_running=1):
    """The kernels of batch_norm_act, in the simulator, as batch_norm_act launches them: four (fused=1: the
    elementwise kernels merge the partials) or six (fused=0: separate finalize kernels)."""
    C = x.shape[1]
    total, n = x.size, x.size // C
    hw = n // x.shape[0]
    S = -(-n // (threads * U))
    f32 = np.float32
    mean, invstd = np.full(C, np.nan, f32), np.full(C, np.nan, f32)
    rm, rv = np.full(C, RM0, f32), np.full(C, RV0, f32)
    batches = np.array([BATCHES0], np.int64)
    pa, pb = np.full(C * S, np.nan, f32), np.full(C * S, np.nan, f32)
    bn.batch_norm_stats_partial.simulate[(S, C), threads](x, pa, pb, n, hw, C, S, U=U)
    if not fused:
        bn.batch_norm_stats_finalize.simulate[C, 32](pa, pb, mean, invstd, rm, rv, n, S, threads * U, momentum,
                                                       EPS, update_running)
    y = np.full_like(x, np.nan)
    flags = dict(relu=relu, add_residual=add_residual, fused=fused, U=apply_U)
    blocks = -(-total // (apply_threads * apply_U))
    bn.batch_norm_apply.simulate[blocks, apply_threads](x, y, pa, pb, mean, invstd, rm, rv, batches, w, b, res,
                                                          total, hw, C, n, S, threads * U, momentum, EPS,
                                                          update_running, count_batch, **flags)
    pg, pgx = np.full(C * S, np.nan, f32), np.full(C * S, np.nan, f32)
    bn.batch_norm_backward_partial.simulate[(S, C), threads](g, x, y, mean, pg, pgx, n, hw, C, S, relu=relu, U=U)
    dw, db = np.full(C, np.nan, f32), np.full(C, np.nan, f32)
    if not fused:
        bn.batch_norm_backward_finalize.simulate[C, 32](pg, pgx, invstd, dw, db, S)
    dx, dres = np.full_like(x, np.nan), np.full_like(x, np.nan)
    bn.batch_norm_backward_input.simulate[blocks, apply_threads](g, x, y, mean, invstd, w, pg, pgx, dw, db, dx,
                                                                   dres, total, hw, C, n, S, **flags)
    out = dict(mean=mean, invstd=invstd, y=y, dx=dx, dw=dw, db=db, dres=dres, rm=rm, rv=rv)
    return out, S, int(batches[0])


def _inputs(shape, seed, offset=0.5, scale=2.0):
    rng = np.random.default_rng(seed)
    C = shape[1]
    x = (rng.standard_normal(shape) * scale + offset).astype(np.float32)
    w, b = rng.standard_normal(C).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    res = rng.standard_normal(shape).astype(np.float32)
    g = rng.standard_normal(shape).astype(np.float32)
    return x, w, b, res, g


def _check(got, want, keys=None, rtol=1e-4, atol=1e-5):
    for key in keys or want:
        np.testing.assert_allclose(got[key], want[key], rtol=rtol, atol=atol, err_msg=key)


# Fused path (four kernels): shape, split threads and values per thread, elementwise threads and values per
# thread. Each satisfies bn_fusable(hw, apply_threads, apply_U).
FUSED_CASES = [((2, 3, 10, 13), 32, 2, 64, 1),   # hw = 130 > block: blocks straddle channels and samples
               ((2, 3, 10, 13), 32, 2, 64, 2),   # two values per thread, a block stride apart
               ((4, 2, 8, 8), 32, 2, 64, 1),     # hw = 64 = block: one channel row per block
               ((3, 2, 5, 9), 32, 2, 128, 1),    # hw = 45 < block, not dividing it: 4 rows in a block of 4 warps
               ((2, 3, 7, 7), 64, 4, 256, 1),    # hw = 49: a block of 8 warps meets channels 0..2 of two samples
               ((3, 1, 7, 10), 32, 2, 64, 1),    # C = 1, n = 210: four splits, the last partial
               ((1, 2, 8, 8), 32, 2, 64, 1),     # n = 64: a single split per channel
               ((2, 1, 24, 24), 32, 1, 64, 1)]   # n = 1152: 36 splits, more than a warp's lanes


@pytest.mark.parametrize("relu", [0, 1])
@pytest.mark.parametrize("shape,threads,U,apply_threads,apply_U", FUSED_CASES)
def test_fused_kernels_match_float64(shape, threads, U, apply_threads, apply_U, relu):
    assert bn.bn_fusable(shape[2] * shape[3], apply_threads, apply_U)
    x, w, b, res, g = _inputs(shape, seed=len(shape) + shape[0] + relu)
    got, S, batches = _simulate(x, w, b, res, g, relu, threads, U, apply_threads=apply_threads, apply_U=apply_U)
    assert S == -(-shape[0] * shape[2] * shape[3] // (threads * U))
    _check(got, _reference64(x, w, b, res, g, relu, np.full(shape[1], RM0), np.full(shape[1], RV0)))
    assert batches == BATCHES0 + 1


# Fallback path (six kernels, the finalize kernels merge): n = N*H*W not a multiple of a block's work, one channel,
# a tiny n, a 2-D input (hw = 1), rows longer than a block (hw > threads), rows that divide a block, several splits,
# one split.
CASES = [((2, 3, 3, 4), 32, 2),      # n = 24 < one block's 64: a single, partial split
         ((3, 2, 5, 7), 32, 2),      # hw = 35 > 32 threads; n = 105: two splits, the second partial
         ((4, 1, 6, 6), 32, 2),      # C = 1, n = 144: three splits
         ((2, 3), 32, 2),            # (N, C) input: hw = 1, n = 2
         ((40, 3), 32, 1),           # hw = 1, n = 40: two splits of 32 and 8
         ((8, 2, 4, 4), 32, 2),      # n = 128: exactly two full splits, rows of 16 inside a block of 32
         ((2, 2, 10, 13), 64, 16),   # many values per thread, hw = 130 > 64 threads
         ((5, 3, 3, 3), 64, 4)]      # hw = 9 does not divide the block; channel wraps inside a stride


@pytest.mark.parametrize("relu", [0, 1])
@pytest.mark.parametrize("shape,threads,U", CASES)
def test_fallback_kernels_match_float64(shape, threads, U, relu):
    x, w, b, res, g = _inputs(shape, seed=len(shape) + shape[0] + relu)
    got, _, batches = _simulate(x, w, b, res, g, relu, threads, U, fused=0, apply_threads=32, apply_U=4)
    _check(got, _reference64(x, w, b, res, g, relu, np.full(shape[1], RM0), np.full(shape[1], RV0)))
    assert batches == BATCHES0 + 1


def test_fused_and_fallback_paths_agree_bit_for_bit():
    x, w, b, res, g = _inputs((2, 3, 10, 13), seed=11)
    fused, _, _ = _simulate(x, w, b, res, g, 1, 32, 2)
    fallback, _, _ = _simulate(x, w, b, res, g, 1, 32, 2, fused=0)
    for key in fused:
        np.testing.assert_array_equal(fused[key], fallback[key], err_msg=key)


def test_fused_running_stats_update_once_as_the_generic_path():
    # momentum 0.5: a second update of a channel would move the running stats far off the generic path's
    x, w, b, res, g = _inputs((2, 3, 7, 7), seed=12)
    got, _, batches = _simulate(x, w, b, res, g, 0, 64, 4, add_residual=0, apply_threads=256, momentum=0.5)
    rm, rv = frost.full((3,), RM0), frost.full((3,), RV0)
    counter = frost.tensor(BATCHES0, dtype="int64")
    want = norm.batch_norm_act(frost.tensor(x), rm, rv, frost.tensor(w), frost.tensor(b), training=True,
                               momentum=0.5, eps=EPS, num_batches_tracked=counter)
    np.testing.assert_allclose(got["y"], want.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["rm"], rm.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["rv"], rv.numpy(), rtol=1e-5, atol=1e-6)
    assert batches == counter.item() == BATCHES0 + 1


@pytest.mark.parametrize("fused", [0, 1])
def test_kernels_leave_running_stats_and_counter_alone_when_told(fused):
    x, w, b, res, g = _inputs((2, 2, 8, 8), seed=13)
    got, _, batches = _simulate(x, w, b, res, g, 0, 32, 2, fused=fused, count_batch=0, update_running=0)
    assert batches == BATCHES0
    assert (got["rm"] == np.float32(RM0)).all() and (got["rv"] == np.float32(RV0)).all()
    _check(got, _reference64(x, w, b, res, g, 0, np.full(2, RM0), np.full(2, RV0)), keys=("mean", "invstd", "y"))


def test_simulated_kernels_without_residual_leave_it_alone():
    x, w, b, res, g = _inputs((3, 2, 8, 9), seed=7)
    got, _, _ = _simulate(x, w, b, res.copy(), g, 1, 32, 2, add_residual=0)
    want = _reference64(x, w, b, np.zeros_like(res), g, 1, np.full(2, RM0), np.full(2, RV0))
    _check(got, want, keys=("y", "dx", "dw", "db"))
    assert np.isnan(got["dres"]).all()  # not written


@pytest.mark.parametrize("fused", [0, 1])
def test_statistics_stay_accurate_far_from_zero(fused):
    # mean 1000, std 1: naive sum / sum-of-squares in float32 would lose every digit of the variance
    x, w, b, res, g = _inputs((4, 2, 8, 8), seed=3, offset=1000.0, scale=1.0)
    got, S, _ = _simulate(x, w, b, res, g, 0, 32, 2, fused=fused)
    assert S == 4
    want = _reference64(x, w, b, res, g, 0, np.full(2, RM0), np.full(2, RV0))
    _check(got, want, keys=("mean", "invstd", "rm", "rv"))  # (y is only as exact as float32's ulp of 1000 allows)


def _chunks(a, chunk):
    return [a[i:i + chunk] for i in range(0, a.size, chunk)]


def test_finalize_kernels_merge_more_splits_than_a_warp():
    rng = np.random.default_rng(5)
    C, chunk, n = 3, 16, 16 * 69 + 5   # 70 splits, the last one of 5 values
    vals = (rng.standard_normal((C, n)) * 3 + 7).astype(np.float32)
    parts = [_chunks(v.astype(np.float64), chunk) for v in vals]
    S = len(parts[0])
    pm = np.array([[p.mean() for p in ps] for ps in parts], np.float32).ravel()
    pv = np.array([[((p - p.mean()) ** 2).sum() for p in ps] for ps in parts], np.float32).ravel()
    mean, invstd = np.zeros(C, np.float32), np.zeros(C, np.float32)
    rm, rv = np.zeros(C, np.float32), np.ones(C, np.float32)
    bn.batch_norm_stats_finalize.simulate[C, 32](pm, pv, mean, invstd, rm, rv, n, S, chunk, MOMENTUM, EPS, 0)
    np.testing.assert_allclose(mean, vals.astype(np.float64).mean(axis=1), rtol=1e-5)
    np.testing.assert_allclose(invstd, 1 / np.sqrt(vals.astype(np.float64).var(axis=1) + EPS), rtol=1e-5)
    assert (rm == 0).all() and (rv == 1).all()  # update_running=0 leaves them
    pg, pgx = rng.standard_normal(C * S).astype(np.float32), rng.standard_normal(C * S).astype(np.float32)
    dw, db = np.zeros(C, np.float32), np.zeros(C, np.float32)
    bn.batch_norm_backward_finalize.simulate[C, 32](pg, pgx, invstd, dw, db, S)
    np.testing.assert_allclose(db, pg.reshape(C, S).astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw, pgx.reshape(C, S).astype(np.float64).sum(axis=1) * invstd, rtol=1e-5, atol=1e-5)


def test_split_fills_the_gpu_at_the_seed_shapes():
    # the seed ResNet's layers at batch 32 on a 132-SM H200: 4 blocks per SM wanted
    assert bn.bn_split(32768, 16, 132) == (4, 32)
    assert bn.bn_split(8192, 32, 132) == (2, 16)
    assert bn.bn_split(2048, 64, 132) == (2, 4)
    for n, C in [(2, 1), (7, 3), (32768, 16), (256 * 112 * 112, 64), (10**6, 2048)]:
        U, S = bn.bn_split(n, C, 132)
        assert U in (2, 4, 8, 16)
        assert (S - 1) * bn.BN_THREADS * U < n <= S * bn.BN_THREADS * U


def test_seed_shapes_take_the_fused_path():
    assert bn.BN_APPLY_PER_THREAD == 1 and bn.BN_APPLY_THREADS == 256
    for hw in (32 * 32, 16 * 16, 8 * 8, 7 * 7, 37):  # the seed ResNet's three, ImageNet's last stage
        assert bn.bn_fusable(hw)
    for hw in (1, 16, 32, 36):  # a block of 256 would meet more channel rows than its 8 warps
        assert not bn.bn_fusable(hw)
    assert bn.bn_fusable(64, 64) and not bn.bn_fusable(63, 64) and not bn.bn_fusable(64, 64, 2)


KERNEL_SPECS = [(bn.batch_norm_stats_partial, [dict(U=u) for u in (2, 4, 8, 16)]),
                (bn.batch_norm_stats_finalize, [{}]),
                (bn.batch_norm_apply, [dict(relu=r, add_residual=a, fused=f, U=u) for r in (0, 1) for a in (0, 1)
                                         for f in (0, 1) for u in (1, 4)]),
                (bn.batch_norm_backward_partial, [dict(relu=r, U=u) for r in (0, 1) for u in (2, 4, 8, 16)]),
                (bn.batch_norm_backward_finalize, [{}]),
                (bn.batch_norm_backward_input, [dict(relu=r, add_residual=a, fused=f, U=u) for r in (0, 1)
                                                  for a in (0, 1) for f in (0, 1) for u in (1, 4)])]


@pytest.mark.parametrize("kern,consts", KERNEL_SPECS, ids=[k.__name__ for k, _ in KERNEL_SPECS])
def test_kernels_compile_for_sm90(kern, consts, tmp_path, monkeypatch):
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    for c in consts:
        cubin = kern.compile("sm_90", **c)
        assert cubin[:4] == b"\x7fELF", (kern, c)
        assert b".nv.local" not in cubin, f"{kern.__name__} {c} spills registers to local memory"


def test_fused_op_on_the_cpu_is_the_composition():
    rng = np.random.default_rng(0)
    x = frost.tensor(rng.standard_normal((4, 3, 2, 2)).astype(np.float32), requires_grad=True)
    r = frost.tensor(rng.standard_normal((4, 3, 2, 2)).astype(np.float32))
    counter = frost.tensor(0, dtype="int64")
    out = norm.batch_norm_act(x, None, None, training=True, residual=r, relu=True, num_batches_tracked=counter)
    ref = (norm.batch_norm(x, None, None, training=True) + r).relu()
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=1e-6)
    assert counter.item() == 1
    norm.batch_norm_act(x, frost.zeros(3), frost.ones(3), training=False, num_batches_tracked=counter)
    assert counter.item() == 1  # evaluation does not count


@pytest.mark.parametrize("shape", [(2, 3, 8, 8), (4, 1, 7, 7), (2, 3, 4, 4)])  # fused, fused, fallback (hw 16)
def test_gpu_path_launches_in_the_simulator_match_the_generic_path(shape, monkeypatch):
    # batch_norm_act's GPU branch on NumPy arrays, its launches run by the simulator: checks what it passes
    from frost.kernel.api import Kernel
    monkeypatch.setattr(Kernel, "__getitem__", lambda self, cfg: self.simulate[cfg])
    monkeypatch.setattr(bn, "_sms", lambda x: 2)
    x, w, b, res, g = _inputs(shape, seed=9)
    results = []
    for fast in (True, False):
        monkeypatch.setattr(dispatch, "device_of", lambda array, fast=fast: "cuda" if fast else "cpu")
        tx, tw, tb, tr = (frost.tensor(a, requires_grad=True) for a in (x, w, b, res))
        rm, rv, counter = frost.zeros(shape[1]), frost.ones(shape[1]), frost.tensor(3, dtype="int64")
        out = norm.batch_norm_act(tx, rm, rv, tw, tb, True, MOMENTUM, EPS, tr, True, num_batches_tracked=counter)
        out.backward(frost.tensor(g))
        results.append([t.detach().numpy() for t in (out, tx.grad, tw.grad, tb.grad, tr.grad, rm, rv, counter)])
    assert results[0][-1] == results[1][-1] == 4
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_fused_op_needs_more_than_one_value_per_channel():
    with pytest.raises(ValueError, match=r"batch_norm: expected more than 1 value per channel .* \(1, 3\)"):
        norm.batch_norm_act(frost.ones(1, 3), None, None, training=True, relu=True)


def _run(dev, x, w, b, res, g, relu, residual):
    C = x.shape[1]
    tx, tw, tb, tr = (frost.tensor(a, device=dev, requires_grad=True) for a in (x, w, b, res))
    rm, rv = frost.full((C,), RM0, device=dev), frost.full((C,), RV0, device=dev)
    counter = frost.tensor(BATCHES0, dtype="int64", device=dev)
    out = norm.batch_norm_act(tx, rm, rv, tw, tb, training=True, residual=tr if residual else None, relu=relu,
                              num_batches_tracked=counter)
    out.backward(frost.tensor(g, device=dev))
    grads = [tx.grad, tw.grad, tb.grad] + ([tr.grad] if residual else [])
    return [t.detach().cpu().numpy() for t in [out, *grads, rm, rv, counter]]


# fused: hw = 1024, 256, 64 (the seed's), 49 and 143 (rows straddling blocks); fallback: hw = 36, 1, 1
GPU_SHAPES = [(32, 16, 32, 32), (32, 32, 16, 16), (32, 64, 8, 8), (4, 3, 7, 7), (3, 5, 13, 11), (3, 1, 50, 50),
              (8, 16, 6, 6), (64, 10), (2, 3, 1, 1)]


@pytest.mark.cuda
@pytest.mark.parametrize("shape", GPU_SHAPES)
@pytest.mark.parametrize("relu,residual", [(False, False), (True, False), (True, True)])
def test_gpu_fused_batch_norm_matches_cpu(shape, relu, residual):
    x, w, b, res, g = _inputs(shape, seed=3, offset=1.0, scale=3.0)
    got, want = _run("cuda", x, w, b, res, g, relu, residual), _run("cpu", x, w, b, res, g, relu, residual)
    assert got[-1] == want[-1] == BATCHES0 + 1  # num_batches_tracked, once
    for a, e in zip(got, want):  # y, grads, running mean and var
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-4)


@pytest.mark.cuda
def test_gpu_fused_batch_norm_is_deterministic():
    x, w, b, res, g = _inputs((32, 16, 32, 32), seed=4)
    first = _run("cuda", x, w, b, res, g, True, True)
    for _ in range(3):
        for a, b_ in zip(first, _run("cuda", x, w, b, res, g, True, True)):
            np.testing.assert_array_equal(a, b_)


def _check_replays_in_a_cuda_graph(shape, calls: int, layout=lambda a: a):
    """batch_norm_act + backward in a frost.jit step (eager twice, captured, replayed) on x, residual and dy in
    `layout`: y, dweight, dbias every call, then the running statistics and the counter, against float64."""
    x, w, b, res, g = _inputs(shape, seed=6)
    C = shape[1]
    tw, tb = (frost.tensor(a, device="cuda", requires_grad=True) for a in (w, b))
    rm, rv = frost.zeros(C, device="cuda"), frost.ones(C, device="cuda")
    counter = frost.tensor(0, dtype="int64", device="cuda")

    def on_gpu(a):
        return frost.Tensor(layout(frost.tensor(a, device="cuda").data))
    gt = on_gpu(g)

    def step(tx, tr):
        tw.grad = tb.grad = None
        out = norm.batch_norm_act(tx, rm, rv, tw, tb, training=True, residual=tr, relu=True,
                                  num_batches_tracked=counter)
        out.backward(gt)
        return out, tw.grad, tb.grad

    jitted = frost.jit(step)
    rng = np.random.default_rng(1)
    want_rm, want_rv = np.zeros(C), np.ones(C)
    for i in range(calls):  # eager twice, capture, then replays with new inputs
        xi = x * (1 + i) + rng.standard_normal(x.shape).astype(np.float32)
        got = [t.detach().cpu().numpy() for t in jitted(on_gpu(xi), on_gpu(res))]
        want = _reference64(xi, w, b, res, g, 1, want_rm, want_rv)
        want_rm, want_rv = want["rm"], want["rv"]
        for a, key in zip(got, ("y", "dw", "db")):
            np.testing.assert_allclose(a, want[key], rtol=1e-4, atol=1e-4, err_msg=f"call {i}: {key}")
    assert counter.item() == calls
    np.testing.assert_allclose(rm.cpu().numpy(), want_rm, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(rv.cpu().numpy(), want_rv, rtol=1e-4, atol=1e-4)


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(32, 32, 16, 16), (16, 8, 4, 4)])  # the fused path, the fallback
def test_gpu_fused_batch_norm_replays_in_a_cuda_graph(shape):
    _check_replays_in_a_cuda_graph(shape, calls=5)


@pytest.mark.cuda
@pytest.mark.parametrize("momentum", [0.1, None])
def test_gpu_batchnorm_module_counts_batches_once(momentum):
    rng = np.random.default_rng(8)
    f, c = frost.nn.BatchNorm2d(16, momentum=momentum).cuda(), frost.nn.BatchNorm2d(16, momentum=momentum)
    for step in range(3):
        x = rng.standard_normal((8, 16, 16, 16)).astype(np.float32) * (step + 1)
        np.testing.assert_allclose(f(frost.tensor(x, device="cuda")).detach().cpu().numpy(),
                                   c(frost.tensor(x)).detach().numpy(), rtol=1e-4, atol=1e-4)
    assert f.num_batches_tracked.item() == c.num_batches_tracked.item() == 3
    for name in ("running_mean", "running_var"):
        np.testing.assert_allclose(getattr(f, name).cpu().numpy(), getattr(c, name).numpy(), rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ channels-last (NHWC memory) kernels

@pytest.fixture
def simulated_gpu(monkeypatch):
    """batch_norm_act's GPU branch on NumPy arrays, its launches run by the simulator, blocks of 64 threads; returns
    a function setting the SM count (it sizes the grids) and whether the elementwise kernels may merge (fused)."""
    from frost.kernel.api import Kernel
    monkeypatch.setattr(Kernel, "__getitem__", lambda self, cfg: self.simulate[cfg])
    monkeypatch.setattr(dispatch, "device_of", lambda array: "cuda")  # NumPy arrays take the CUDA fast paths
    monkeypatch.setattr(bn, "BN_NHWC_THREADS", 64)
    split, plan = bn.bn_split_nhwc, bn.bn_plan_nhwc
    launches, one_launch = [], []

    def configure(sms=2, fused=True, one=False):
        """one: allow the one-launch plan (statistics and normalize in one kernel, a grid_sync between)."""
        monkeypatch.setattr(bn, "_sms", lambda x: sms)
        monkeypatch.setattr(bn, "BN_ONE_LAUNCH", one)
        monkeypatch.setattr(bn, "bn_split_nhwc", lambda *a, **k: _record(split(*a, **k), fused))
        monkeypatch.setattr(bn, "bn_plan_nhwc", lambda *a, **k: one_launch.append(plan(*a, **k)) or one_launch[-1])

    def _record(plan, fused):
        plan = plan if fused else plan[:5] + (False,)
        launches.append(plan)
        return plan

    configure.launches = launches
    configure.one_launch = one_launch  # (plan, one) per batch_norm_act call
    return configure


def _run_nhwc(x, w, b, res, g, relu, residual, affine=True, track=True, res_layout=as_channels_last,
              g_layout=as_channels_last, momentum=MOMENTUM, chunk=None):
    """batch_norm_act on a channels-last x, forward and backward: the output, the gradient arrays its backward
    returns (dx, [dweight, dbias], [dresidual]), the leaves' .grad, running stats and counter. chunk: x comes with
    a convolution's partial statistics over splits of `chunk` rows (as its epilogue makes them)."""
    C = x.shape[1]
    tx = frost.Tensor(as_channels_last(x), requires_grad=True)
    if chunk is not None:
        tx._channel_stats = conv_partials(tx.data, chunk)
    tw, tb = (frost.tensor(a, requires_grad=True) if affine else None for a in (w, b))
    tr = frost.Tensor(res_layout(res), requires_grad=True) if residual else None
    rm, rv = (frost.full((C,), RM0), frost.full((C,), RV0)) if track else (None, None)
    counter = frost.tensor(BATCHES0, dtype="int64")
    out = norm.batch_norm_act(tx, rm, rv, tw, tb, training=True, momentum=momentum, eps=EPS, residual=tr, relu=relu,
                              num_batches_tracked=counter)
    returned, backward = [], out._ctx.backward
    out._ctx.backward = lambda grad: returned.extend(backward(grad)) or returned  # keeps what it returns
    out.backward(frost.Tensor(g_layout(g)))
    leaves = [t.grad.numpy() for t in (tx, tw, tb, tr) if t is not None]
    stats = [t.numpy() for t in (rm, rv) if t is not None]
    return out.data, returned, leaves, stats, counter.item()


def _run_generic(x, w, b, res, g, relu, residual, affine=True, track=True, momentum=MOMENTUM):
    """The same through the generic NumPy path: batch_norm, then + residual, then relu (NCHW arrays)."""
    C = x.shape[1]
    tx = frost.tensor(x, requires_grad=True)
    tw, tb = (frost.tensor(a, requires_grad=True) if affine else None for a in (w, b))
    tr = frost.tensor(res, requires_grad=True) if residual else None
    rm, rv = (frost.full((C,), RM0), frost.full((C,), RV0)) if track else (None, None)
    out = norm.batch_norm(tx, rm, rv, tw, tb, training=True, momentum=momentum, eps=EPS)
    out = out + tr if residual else out
    out = out.relu() if relu else out
    out.backward(frost.tensor(g))
    leaves = [t.grad.numpy() for t in (tx, tw, tb, tr) if t is not None]
    stats = [t.numpy() for t in (rm, rv) if t is not None]
    return out.detach().numpy(), leaves, stats


def _check_nhwc_against_generic(x, w, b, res, g, relu, residual, affine=True, track=True, **kw):
    y, returned, leaves, stats, counter = _run_nhwc(x, w, b, res, g, relu, residual, affine, track, **kw)
    want_y, want_leaves, want_stats = _run_generic(x, w, b, res, g, relu, residual, affine, track)
    assert is_channels_last(y), "y is not channels-last"
    assert is_channels_last(returned[0]), "dx is not channels-last"
    if residual:
        assert is_channels_last(returned[-1]), "dresidual is not channels-last"
    np.testing.assert_allclose(y, want_y, rtol=1e-4, atol=1e-5, err_msg="y")
    names = ["dx"] + (["dweight", "dbias"] if affine else []) + (["dresidual"] if residual else [])
    assert len(returned) == len(names)
    for name, got, got_leaf, want in zip(names, returned, leaves, want_leaves):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=name)
        np.testing.assert_allclose(got_leaf, want, rtol=1e-4, atol=1e-4, err_msg=f"{name} (.grad)")
    for name, got, want in zip(("running_mean", "running_var"), stats, want_stats):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)
    assert counter == BATCHES0 + 1  # num_batches_tracked, once (in the kernel)


# shape, SM count (sizes the grid: 64 SMs gives more splits than merging lanes, so a lane merges several); the
# comments give bn_split_nhwc's (cb, G, lanes, U, S) for blocks of 64 threads
NHWC_CASES = [((4, 16, 8, 8), 2),     # (16, 1, 4, 16, 4): 4 rows at a time, 16 per thread
              ((2, 16, 8, 8), 64),    # (16, 1, 4, 1, 32): 8 splits per merging lane
              ((2, 32, 5, 7), 2),     # (32, 1, 2, 16, 3): n = 70, the last split partial
              ((2, 32, 5, 7), 64),    # (32, 1, 2, 4, 9): lanes hold splits q and q + 2 (some)
              ((3, 64, 2, 2), 2),     # (64, 1, 1, 4, 3): tiny H*W, one row at a time, a lane per channel
              ((2, 3, 5, 5), 2),      # (3, 1, 16, 1, 3): C does not divide the block (63 of 64 threads busy)
              ((2, 96, 3, 3), 2)]     # (64, 2, 1, 16, 2): two channel groups, the second half empty


@pytest.mark.parametrize("relu,residual", [(0, 0), (1, 1)])
@pytest.mark.parametrize("shape,sms", NHWC_CASES)
def test_nhwc_kernels_match_the_generic_path(shape, sms, relu, residual, simulated_gpu):
    simulated_gpu(sms)
    _check_nhwc_against_generic(*_inputs(shape, seed=shape[1] + sms + relu), relu, residual)
    assert simulated_gpu.launches[-1][-1]  # the four-launch (fused) path


# shapes whose one-launch plan fits the SM count (64 threads a block): (cb, G, lanes, U, S) = (16, 1, 4, 1, 32),
# (32, 1, 2, 4, 9), (3, 1, 16, 1, 3) and (64, 2, 1, 1, 18) (two channel groups: 36 blocks)
ONE_LAUNCH_CASES = [((2, 16, 8, 8), 64), ((2, 32, 5, 7), 64), ((2, 3, 5, 5), 4), ((2, 96, 3, 3), 40)]


@pytest.mark.parametrize("relu,residual", [(0, 0), (1, 1), (1, 0)])
@pytest.mark.parametrize("shape,sms", ONE_LAUNCH_CASES)
def test_nhwc_one_launch_per_direction_matches_the_generic_path(shape, sms, relu, residual, simulated_gpu):
    simulated_gpu(sms, one=True)
    _check_nhwc_against_generic(*_inputs(shape, seed=shape[1] + sms + relu), relu, residual)
    (cb, groups, lanes, U, S, fused), one = simulated_gpu.one_launch[-1]
    assert one and fused and S * groups <= sms  # every block resident: the grid barrier is safe


def test_one_launch_needs_every_block_resident():
    # the seed ResNet's layers at batch 32 on a 132-SM H200, blocks of 512: one launch each way, <= 132 blocks
    assert bn.bn_plan_nhwc(32768, 16, 132) == ((16, 1, 32, 8, 128, True), True)
    assert bn.bn_plan_nhwc(8192, 32, 132) == ((32, 1, 16, 4, 128, True), True)
    assert bn.bn_plan_nhwc(2048, 64, 132) == ((64, 1, 8, 4, 64, True), True)
    # more rows than 132 blocks of 16 values per thread can hold: the four-launch plan, two blocks per SM
    assert bn.bn_plan_nhwc(524288, 16, 132) == (bn.bn_split_nhwc(524288, 16, 132), False)
    for n, C in [(2, 2), (50, 3), (6272, 256), (49 * 256, 2048), (9, 96), (64, 1000), (10**6, 8)]:
        (cb, groups, lanes, U, S, fused), one = bn.bn_plan_nhwc(n, C, 132)
        assert not one or (fused and S * groups <= 132)


@pytest.mark.parametrize("relu,residual", [(1, 0), (0, 1)])
def test_nhwc_relu_without_residual_and_residual_without_relu(relu, residual, simulated_gpu):
    simulated_gpu(64)
    _check_nhwc_against_generic(*_inputs((2, 32, 5, 7), seed=10), relu, residual)


@pytest.mark.parametrize("shape,sms", [((4, 16, 8, 8), 64), ((2, 32, 5, 7), 2), ((2, 96, 3, 3), 2)])
def test_nhwc_six_launch_path_matches_the_generic_path(shape, sms, simulated_gpu):
    simulated_gpu(sms, fused=False)  # the finalize kernels merge the partials
    _check_nhwc_against_generic(*_inputs(shape, seed=2), 1, 1)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("affine,track", [(False, True), (True, False), (False, False)])
def test_nhwc_without_weight_bias_or_running_stats(affine, track, fused, simulated_gpu):
    simulated_gpu(64, fused)
    _check_nhwc_against_generic(*_inputs((2, 16, 4, 5), seed=4), 1, 1, affine=affine, track=track)


@pytest.mark.parametrize("fused", [True, False])
def test_nhwc_takes_nchw_residual_and_gradient(fused, simulated_gpu):
    # an NCHW residual and an NCHW incoming gradient are converted; dresidual comes back channels-last
    simulated_gpu(2, fused)
    _check_nhwc_against_generic(*_inputs((2, 16, 4, 4), seed=5), 1, 1, res_layout=np.ascontiguousarray,
                                g_layout=np.ascontiguousarray)


def test_nhwc_running_stats_update_once(simulated_gpu):
    # momentum 0.5 and many blocks in two channel groups: a second update of a channel would be far off
    simulated_gpu(64)
    x, w, b, res, g = _inputs((3, 80, 3, 3), seed=6)
    _, _, _, stats, counter = _run_nhwc(x, w, b, res, g, 0, 0, momentum=0.5)
    assert simulated_gpu.launches[-1][1] == 2 and simulated_gpu.launches[-1][4] > 1
    want = _reference64(x, w, b, res, g, 0, np.full(80, RM0), np.full(80, RV0), momentum=0.5)
    np.testing.assert_allclose(stats[0], want["rm"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats[1], want["rv"], rtol=1e-5, atol=1e-6)
    assert counter == BATCHES0 + 1


@pytest.mark.parametrize("fused", [True, False])
def test_nhwc_statistics_stay_accurate_far_from_zero(fused, simulated_gpu):
    # mean 1000, std 1: naive sums of squares in float32 would lose every digit of the variance
    simulated_gpu(64, fused)
    x, w, b, res, g = _inputs((4, 16, 4, 4), seed=3, offset=1000.0, scale=1.0)
    _, returned, _, stats, _ = _run_nhwc(x, w, b, res, g, 0, 0)
    want = _reference64(x, w, b, np.zeros_like(res), g, 0, np.full(16, RM0), np.full(16, RV0))
    assert simulated_gpu.launches[-1][4] > 4  # several splits merged
    np.testing.assert_allclose(stats[0], want["rm"], rtol=1e-6)
    np.testing.assert_allclose(stats[1], want["rv"], rtol=1e-4)
    np.testing.assert_allclose(returned[1], want["dw"], rtol=1e-3, atol=1e-3)


def test_nhwc_gradients_go_into_zeroed_grad_buffers(simulated_gpu):
    from frost.autograd import mark_grad_zero
    simulated_gpu(2)
    x, w, b, res, g = _inputs((2, 16, 4, 4), seed=8)
    tx = frost.Tensor(as_channels_last(x), requires_grad=True)
    tw, tb = frost.tensor(w, requires_grad=True), frost.tensor(b, requires_grad=True)
    tw.grad, tb.grad = frost.zeros(16), frost.zeros(16)
    buffers = (tw.grad.data, tb.grad.data)
    for t in (tw, tb):
        mark_grad_zero(t)
    norm.batch_norm_act(tx, None, None, tw, tb, training=True, relu=True).backward(frost.Tensor(as_channels_last(g)))
    assert tw.grad.data is buffers[0] and tb.grad.data is buffers[1]
    want = _reference64(x, w, b, np.zeros_like(res), g, 1, np.zeros(16), np.ones(16))
    np.testing.assert_allclose(tw.grad.numpy(), want["dw"], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(tb.grad.numpy(), want["db"], rtol=1e-4, atol=1e-4)


def test_nchw_input_keeps_the_nchw_kernels(simulated_gpu):
    simulated_gpu(2)
    x, w, b, res, g = _inputs((2, 4, 4, 4), seed=9)
    out = norm.batch_norm_act(frost.tensor(x), None, None, frost.tensor(w), frost.tensor(b), training=True,
                              residual=frost.Tensor(as_channels_last(res)), relu=True)
    assert simulated_gpu.launches == []  # bn_split_nhwc never asked
    assert out.data.flags.c_contiguous
    np.testing.assert_allclose(out.numpy(), _reference64(x, w, b, res, g, 1, np.zeros(4), np.ones(4))["y"],
                               rtol=1e-4, atol=1e-5)


def test_split_nhwc_at_the_seed_shapes():
    # the seed ResNet's layers at batch 32 on a 132-SM H200, blocks of 512: four launches each
    assert bn.bn_split_nhwc(32768, 16, 132) == (16, 1, 32, 4, 256, True)
    assert bn.bn_split_nhwc(8192, 32, 132) == (32, 1, 16, 4, 128, True)
    assert bn.bn_split_nhwc(2048, 64, 132) == (64, 1, 8, 4, 64, True)
    for n, C in [(2, 2), (50, 3), (32768, 16), (524288, 16), (6272, 256), (49 * 256, 2048), (9, 96), (64, 1000)]:
        cb, groups, lanes, U, S, fused = bn.bn_split_nhwc(n, C, 132)
        rows = bn.BN_NHWC_THREADS // cb
        assert cb * groups >= C > cb * (groups - 1) and lanes <= min(32, rows) and lanes & (lanes - 1) == 0
        assert U in (1, 2, 4, 8, 16) and (S - 1) * rows * U < n <= S * rows * U
        assert fused == (S <= lanes * bn.BN_NHWC_MERGE)
    assert not bn.bn_split_nhwc(524288, 16, 132)[-1]  # too many splits to merge in every block: six launches
    with pytest.raises(ValueError, match="bn_split_nhwc: threads must be a multiple of 32"):
        bn.bn_split_nhwc(100, 16, 132, threads=48)


NHWC_KERNEL_SPECS = [
    (bn.batch_norm_stats_partial_nhwc, [dict(U=u) for u in (1, 2, 4, 8, 16)]),
    (bn.batch_norm_apply_nhwc, [dict(relu=r, add_residual=a, fused=f, U=u) for r in (0, 1) for a in (0, 1)
                                  for f in (0, 1) for u in (1, 16)]
     + [dict(relu=1, add_residual=a, fused=1, U=u, stats=1) for a in (0, 1) for u in (1, 8, 16)]),
    (bn.batch_norm_backward_partial_nhwc, [dict(relu=r, U=u) for r in (0, 1) for u in (1, 4, 16)]),
    (bn.batch_norm_backward_input_nhwc, [dict(relu=r, add_residual=a, fused=f, U=u) for r in (0, 1)
                                           for a in (0, 1) for f in (0, 1) for u in (1, 16)]
     + [dict(relu=1, add_residual=a, fused=1, U=u, sums=1) for a in (0, 1) for u in (1, 8, 16)])]


@pytest.mark.parametrize("kern,consts", NHWC_KERNEL_SPECS, ids=[k.__name__ for k, _ in NHWC_KERNEL_SPECS])
def test_nhwc_kernels_compile_for_sm90(kern, consts, tmp_path, monkeypatch):
    test_kernels_compile_for_sm90(kern, consts, tmp_path, monkeypatch)


def _run_cuda_nhwc(x, w, b, res, g, relu, residual, res_layout=as_channels_last, dtype=frost.float32):
    """batch_norm_act on CUDA with x, residual and dy channels-last in `dtype`: [y, dx, dweight, dbias, (dresidual),
    running mean, running var] as float32 NumPy arrays, and the counter."""
    C = x.shape[1]
    tx = frost.Tensor(as_channels_last(frost.tensor(x, device="cuda").to(dtype).data), requires_grad=True)
    tw, tb = (frost.tensor(a, device="cuda", requires_grad=True) for a in (w, b))
    tr = (frost.Tensor(frost.tensor(res_layout(res), device="cuda").to(dtype).data, requires_grad=True)
          if residual else None)
    rm, rv = frost.full((C,), RM0, device="cuda"), frost.full((C,), RV0, device="cuda")
    counter = frost.tensor(BATCHES0, dtype="int64", device="cuda")
    out = norm.batch_norm_act(tx, rm, rv, tw, tb, training=True, residual=tr, relu=relu, num_batches_tracked=counter)
    assert is_channels_last(out.data) and out.dtype == dtype
    returned = out._ctx.backward(as_channels_last(frost.tensor(g, device="cuda").to(dtype).data))
    assert is_channels_last(returned[0]) and (not residual or is_channels_last(returned[-1]))
    assert returned[0].dtype == out.data.dtype and (not residual or returned[-1].dtype == out.data.dtype)
    assert returned[1].dtype == returned[2].dtype == np.float32  # dweight, dbias
    arrays = [out.detach().cpu().numpy()] + [a.get() for a in returned] + [rm.cpu().numpy(), rv.cpu().numpy()]
    return [a.astype(np.float32) for a in arrays] + [counter.item()]


# four launches at the seed's shapes (batch 32) and small ones; six at (256, 16, 32, 32) and (32, 256, 14, 14) (too
# many splits to merge in every block); C = 3, 96 (not dividing a block), 1000 (two channel groups, one partial)
GPU_NHWC_SHAPES = [(32, 16, 32, 32), (32, 32, 16, 16), (32, 64, 8, 8), (4, 3, 7, 7), (3, 96, 5, 5), (256, 16, 32, 32),
                   (32, 256, 14, 14), (4, 1000, 3, 3), (2, 64, 1, 2)]


@pytest.mark.cuda
@pytest.mark.parametrize("shape", GPU_NHWC_SHAPES)
@pytest.mark.parametrize("relu,residual", [(False, False), (True, True)])
def test_gpu_nhwc_batch_norm_matches_cpu(shape, relu, residual):
    x, w, b, res, g = _inputs(shape, seed=3, offset=1.0, scale=3.0)
    got = _run_cuda_nhwc(x, w, b, res, g, relu, residual)
    want = _reference64(x, w, b, res if residual else np.zeros_like(res), g, relu, np.full(shape[1], RM0),
                        np.full(shape[1], RV0))
    keys = ["y", "dx", "dw", "db"] + (["dres"] if residual else []) + ["rm", "rv"]
    assert got[-1] == BATCHES0 + 1
    for a, key in zip(got, keys):
        np.testing.assert_allclose(a, want[key], rtol=1e-4, atol=1e-4, err_msg=key)


def test_a_plans_first_layer_queues_every_layer_kind():
    """The normalize kernel's variants for layers with or without ReLU and residual are queued together (a cold
    start-up compiles them side by side), each with the plan's constants."""
    asked = []
    recorder = SimpleNamespace(prefetch=lambda **consts: asked.append(consts))
    for _ in range(2):  # queued once: later layers of the plan ask nothing
        bn._prefetch_layer_kinds(recorder, dict(stats=1, fused=1, U=8, M=4))
    assert sorted((c.pop("relu"), c.pop("add_residual")) for c in asked) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert asked == [dict(stats=1, fused=1, U=8, M=4)] * 4


@pytest.mark.cuda
def test_gpu_nhwc_first_layer_queues_the_other_layer_kinds():
    from frost.kernel import compile as kcompile
    x, w, b, res, g = _inputs((8, 48, 6, 6), seed=21)  # a shape no other test uses: its plan's specs are new
    _run_cuda_nhwc(x, w, b, res, g, True, False)
    arch = kcompile.device_arch()
    started = {}
    for spec in bn.NHWC_KERNELS["float32"]["apply"]._specs.values():
        if arch in spec._cubins or arch in spec._pending:
            consts = dict(spec.consts)
            kind = (consts.pop("relu"), consts.pop("add_residual"))
            started.setdefault(tuple(sorted(consts.items())), set()).add(kind)
    assert {(0, 0), (0, 1), (1, 0), (1, 1)} in started.values()


@pytest.mark.cuda
def test_gpu_nhwc_takes_an_nchw_residual_and_is_deterministic():
    x, w, b, res, g = _inputs((32, 32, 16, 16), seed=4)
    first = _run_cuda_nhwc(x, w, b, res, g, True, True, res_layout=np.ascontiguousarray)
    for _ in range(2):
        for a, b_ in zip(first, _run_cuda_nhwc(x, w, b, res, g, True, True)):
            np.testing.assert_array_equal(a, b_)


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(32, 32, 16, 16), (32, 256, 14, 14)])  # one launch each way, six
def test_gpu_nhwc_batch_norm_replays_in_a_cuda_graph(shape):
    _check_replays_in_a_cuda_graph(shape, calls=4, layout=as_channels_last)


# ------------------------------------------------------------------ bf16 activations through the channels-last kernels

BF16 = ml_dtypes.bfloat16


def _bf16_rounded(*arrays):
    """The arrays rounded to bf16, back in float32 (exact): the inputs both paths see."""
    return [a.astype(BF16).astype(np.float32) for a in arrays]


def _mostly_equal(got, want, fraction):
    """At least `fraction` of the bf16 values got equal want rounded to bf16 (round to nearest even, not truncation:
    only values whose float32 twins straddle a rounding boundary may differ)."""
    same = np.mean(got == want.astype(BF16))
    assert same >= fraction, f"only {same:.3f} of the values are want rounded to bf16"


def _check_nhwc_bf16_against_generic(x, w, b, res, g, relu, residual, res_dtype=BF16, affine=True, track=True,
                                     **kw):
    """The bf16 kernels vs the generic path in float32 on the same bf16-rounded x, residual and dy: y and dx (bf16)
    within bf16 rounding, dresidual exact, the float32 running stats, dweight and dbias tightly."""
    x, res, g = _bf16_rounded(x, res, g)
    y, returned, leaves, stats, counter = _run_nhwc(x.astype(BF16), w, b, res.astype(res_dtype), g.astype(BF16),
                                                    relu, residual, affine, track, **kw)
    want_y, want_leaves, want_stats = _run_generic(x, w, b, res, g, relu, residual, affine, track)
    assert y.dtype == BF16 and is_channels_last(y), "y is not channels-last bf16"
    np.testing.assert_allclose(y.astype(np.float32), want_y, rtol=1e-2, atol=1e-4, err_msg="y")
    _mostly_equal(y, want_y, 0.99)
    names = ["dx"] + (["dweight", "dbias"] if affine else []) + (["dresidual"] if residual else [])
    assert len(returned) == len(names) == len(leaves)
    for name, got, leaf, want in zip(names, returned, leaves, want_leaves):
        if name in ("dweight", "dbias"):  # float32 sums over float32-exact values: as the generic path's
            assert got.dtype == leaf.dtype == np.float32, name
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=name)
            np.testing.assert_allclose(leaf, want, rtol=1e-5, atol=1e-5, err_msg=f"{name} (.grad)")
            continue
        assert got.dtype == BF16 and is_channels_last(got), f"{name} is not channels-last bf16"
        if name == "dx":
            np.testing.assert_allclose(got.astype(np.float32), want, rtol=1e-2, atol=1e-3, err_msg=name)
            _mostly_equal(got, want, 0.95)
            assert leaf.dtype == BF16
        else:  # dresidual: dy masked by the ReLU, exact in bf16; its .grad in the residual's own dtype
            np.testing.assert_array_equal(got.astype(np.float32), want, err_msg=name)
            assert leaf.dtype == np.dtype(res_dtype), "the residual's gradient is not in its dtype"
        np.testing.assert_array_equal(leaf.astype(np.float32), got.astype(np.float32), err_msg=f"{name} (.grad)")
    for name, got, want in zip(("running_mean", "running_var"), stats, want_stats):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)
    assert counter == BATCHES0 + 1


@pytest.mark.parametrize("relu,residual", [(0, 0), (1, 1)])
@pytest.mark.parametrize("shape,sms", [((4, 16, 8, 8), 2), ((2, 32, 5, 7), 64), ((2, 3, 5, 5), 2),
                                       ((2, 96, 3, 3), 2)])
def test_nhwc_bf16_kernels_match_the_generic_path(shape, sms, relu, residual, simulated_gpu):
    simulated_gpu(sms)
    _check_nhwc_bf16_against_generic(*_inputs(shape, seed=shape[1] + sms + relu), relu, residual)
    assert simulated_gpu.launches[-1][-1]  # the four-launch (fused) path


@pytest.mark.parametrize("relu,residual,res_dtype", [(1, 0, BF16), (0, 1, BF16), (1, 1, np.float32)])
def test_nhwc_bf16_relu_or_residual_alone_and_a_float32_residual(relu, residual, res_dtype, simulated_gpu):
    simulated_gpu(64)
    _check_nhwc_bf16_against_generic(*_inputs((2, 32, 5, 7), seed=13), relu, residual, res_dtype=res_dtype)


@pytest.mark.parametrize("shape,sms", [((4, 16, 8, 8), 64), ((2, 96, 3, 3), 2)])
def test_nhwc_bf16_six_launch_path_matches_the_generic_path(shape, sms, simulated_gpu):
    simulated_gpu(sms, fused=False)
    _check_nhwc_bf16_against_generic(*_inputs(shape, seed=14), 1, 1)


@pytest.mark.parametrize("fused", [True, False])
def test_nhwc_bf16_without_weight_bias_or_running_stats(fused, simulated_gpu):
    simulated_gpu(64, fused)
    _check_nhwc_bf16_against_generic(*_inputs((2, 16, 4, 5), seed=15), 1, 1, affine=False, track=False)


def test_nhwc_bf16_takes_nchw_residual_and_gradient(simulated_gpu):
    simulated_gpu(2)
    _check_nhwc_bf16_against_generic(*_inputs((2, 16, 4, 4), seed=16), 1, 1, res_dtype=np.float32,
                                     res_layout=np.ascontiguousarray, g_layout=np.ascontiguousarray)


def test_nhwc_bf16_statistics_stay_accurate_far_from_zero(simulated_gpu):
    # mean 100, std 1: bf16 keeps ~3 significant digits of x, the float32 statistics of those values stay exact
    simulated_gpu(64)
    x, w, b, res, g = _inputs((4, 16, 4, 4), seed=17, offset=100.0, scale=1.0)
    x, = _bf16_rounded(x)
    _, _, _, stats, _ = _run_nhwc(x.astype(BF16), w, b, res.astype(BF16), g.astype(BF16), 0, 0)
    want = _reference64(x, w, b, np.zeros_like(res), g, 0, np.full(16, RM0), np.full(16, RV0))
    np.testing.assert_allclose(stats[0], want["rm"], rtol=1e-6)
    np.testing.assert_allclose(stats[1], want["rv"], rtol=1e-4)


BF16_KERNEL_CONSTS = {"stats_partial": [dict(U=u) for u in (1, 16)],
                      "apply": [dict(relu=r, add_residual=a, fused=f, U=u) for r, a in ((0, 0), (1, 1)) for f in (0, 1)
                                for u in (1, 16)],
                      "backward_partial": [dict(relu=r, U=u) for r in (0, 1) for u in (1, 16)],
                      "backward_input": [dict(relu=r, add_residual=a, fused=f, U=u) for r, a in ((0, 0), (1, 1))
                                         for f in (0, 1) for u in (1, 16)]}


@pytest.mark.parametrize("name", BF16_KERNEL_CONSTS)
def test_nhwc_bf16_kernels_compile_for_sm90(name, tmp_path, monkeypatch):
    kern = bn.NHWC_KERNELS["bfloat16"][name]
    assert "frost_bf16* x" in kern.source_for(**BF16_KERNEL_CONSTS[name][0])  # bf16 activations, 2 bytes a value
    test_kernels_compile_for_sm90(kern, BF16_KERNEL_CONSTS[name], tmp_path, monkeypatch)


def test_kernel_dtypes_and_layouts():
    a = np.zeros((2, 3, 4, 5), np.float32)
    arrays = (a, as_channels_last(a), as_channels_last(a.astype(BF16)), a.astype(BF16),
              as_channels_last(a.astype(np.float16)))
    take = [bn._kernel_dtype(frost.Tensor(arr)) for arr in arrays]
    assert take == [True, True, True, False, False]  # bf16 only channels-last; float16 never (cast to float32)
    assert set(bn.NHWC_KERNELS) == {"float32", "bfloat16"}
    assert bn.NHWC_KERNELS["float32"]["apply"] is bn.batch_norm_apply_nhwc
    for kernels in bn.NHWC_KERNELS.values():
        assert len({id(k) for k in kernels.values()}) == 4


def test_autocast_conv_bn_conv_chain_stays_bf16(simulated_gpu):
    """conv -> batch_norm_act -> conv under autocast (the simulated kernels): the normalized activation and the
    gradient batch_norm_act gives its input are bf16 channels-last; the result and gradients match the float32
    chain within bf16 tolerance."""
    from frost.ops.conv import conv2d
    simulated_gpu(2)
    rng = np.random.default_rng(18)
    x = rng.standard_normal((2, 4, 6, 6)).astype(np.float32)
    w1, w2 = (rng.standard_normal(s).astype(np.float32) * 0.3 for s in ((8, 4, 3, 3), (4, 8, 3, 3)))
    gamma, beta = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    g = rng.standard_normal((2, 4, 6, 6)).astype(np.float32)

    def chain(half):
        tx = frost.Tensor(as_channels_last(x))
        tw1, tw2, tg, tb = (frost.tensor(a, requires_grad=True) for a in (w1, w2, gamma, beta))
        with frost.autocast(frost.bfloat16, enabled=half):
            h = conv2d(tx, tw1, padding=1).contiguous(frost.channels_last)
            h.retain_grad()
            if half:
                z = norm.batch_norm_act(h, None, None, tg, tb, training=True, relu=True)
                assert z.dtype == frost.bfloat16 and is_channels_last(z.data), "batch_norm_act left bf16"
            else:  # the float32 oracle: the generic path
                z = norm.batch_norm(h, None, None, tg, tb, training=True).relu()
            z.retain_grad()
            out = conv2d(z, tw2, padding=1)
        out.backward(frost.tensor(g).to(out.dtype))
        return h, [a.astype(np.float32) for a in (out.detach().numpy(), z.grad.numpy(), tw1.grad.numpy(),
                                                 tw2.grad.numpy(), tg.grad.numpy(), tb.grad.numpy())]

    h_half, got = chain(True)
    assert h_half.grad.dtype == frost.bfloat16 and is_channels_last(h_half.grad.data)
    _, want = chain(False)
    for name, a, e in zip(("out", "dz", "dw1", "dw2", "dgamma", "dbeta"), got, want):
        err = np.linalg.norm(a - e) / np.linalg.norm(e)
        assert err < 2e-2, f"{name}: relative error {err:.4f}"


# four launches at the seed's shapes (batch 32) and C = 96; six at (32, 256, 14, 14)
GPU_BF16_SHAPES = [(32, 16, 32, 32), (32, 32, 16, 16), (32, 64, 8, 8), (3, 96, 5, 5), (32, 256, 14, 14)]


@pytest.mark.cuda
@pytest.mark.parametrize("shape", GPU_BF16_SHAPES)
@pytest.mark.parametrize("relu,residual", [(False, False), (True, True)])
def test_gpu_nhwc_bf16_batch_norm_matches_float64(shape, relu, residual):
    x, w, b, res, g = _inputs(shape, seed=3, offset=1.0, scale=3.0)
    x, res, g = _bf16_rounded(x, res, g)
    got = _run_cuda_nhwc(x, w, b, res, g, relu, residual, dtype=frost.bfloat16)
    want = _reference64(x, w, b, res if residual else np.zeros_like(res), g, relu, np.full(shape[1], RM0),
                        np.full(shape[1], RV0))
    keys = ["y", "dx", "dw", "db"] + (["dres"] if residual else []) + ["rm", "rv"]
    assert got[-1] == BATCHES0 + 1
    for a, key in zip(got, keys):
        if key in ("y", "dx"):  # bf16 outputs: one rounding (2^-9 relative) off the exact values
            np.testing.assert_allclose(a, want[key], rtol=1e-2, atol=1e-3, err_msg=key)
        elif key == "dres":
            np.testing.assert_array_equal(a, want[key], err_msg=key)
        else:  # float32 statistics and parameter gradients
            np.testing.assert_allclose(a, want[key], rtol=1e-4, atol=1e-4, err_msg=key)
    _mostly_equal(got[0].astype(BF16), want["y"], 0.99)


@pytest.mark.cuda
def test_gpu_autocast_conv_bn_conv_chain_stays_bf16():
    """Under autocast a channels-last conv -> batch_norm_act -> conv chain has no float32 activation: the batch
    norm reads and writes bf16 (its input gradient too); results and gradients match the float32 chain."""
    from frost.ops.conv import conv2d
    rng = np.random.default_rng(19)
    x = rng.standard_normal((32, 16, 16, 16)).astype(np.float32)
    w1, w2 = (rng.standard_normal(s).astype(np.float32) * 0.1 for s in ((32, 16, 3, 3), (16, 32, 3, 3)))
    gamma, beta = 1 + 0.1 * rng.standard_normal(32).astype(np.float32), rng.standard_normal(32).astype(np.float32)
    g = rng.standard_normal((32, 16, 16, 16)).astype(np.float32)

    def chain(half):
        tx = frost.tensor(x, device="cuda").contiguous(frost.channels_last)
        tw1, tw2, tg, tb = (frost.tensor(a, device="cuda", requires_grad=True) for a in (w1, w2, gamma, beta))
        rm, rv = frost.zeros(32, device="cuda"), frost.ones(32, device="cuda")
        with frost.autocast(frost.bfloat16, enabled=half):
            h = conv2d(tx, tw1, padding=1)
            h.retain_grad()
            z = norm.batch_norm_act(h, rm, rv, tg, tb, training=True, relu=True)
            out = conv2d(z, tw2, padding=1)
        if half:
            assert h.dtype == frost.bfloat16 and is_channels_last(h.data), "the conv gave no channels-last bf16"
            assert z.dtype == frost.bfloat16 and is_channels_last(z.data), "batch_norm_act left bf16"
        out.backward(frost.tensor(g, device="cuda").to(out.dtype))
        if half:
            assert h.grad.dtype == frost.bfloat16 and is_channels_last(h.grad.data)
        return [t.detach().cpu().numpy().astype(np.float32)
                for t in (out, h.grad, tw1.grad, tw2.grad, tg.grad, tb.grad, rm, rv)]

    def torch_chain(half):
        import torch
        dev = torch.device("cuda")
        tx = torch.tensor(x, device=dev).contiguous(memory_format=torch.channels_last)
        tw1, tw2, tg, tb = (torch.tensor(a, device=dev, requires_grad=True) for a in (w1, w2, gamma, beta))
        rm, rv = torch.zeros(32, device=dev), torch.ones(32, device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=half):
            h = torch.nn.functional.conv2d(tx, tw1, padding=1)
            h.retain_grad()
            z = torch.relu(torch.nn.functional.batch_norm(h, rm, rv, tg, tb, training=True))
            out = torch.nn.functional.conv2d(z, tw2, padding=1)
        out.backward(torch.tensor(g, device=dev).to(out.dtype))
        return [t.detach().float().cpu().numpy() for t in (out, h.grad, tw1.grad, tw2.grad, tg.grad, tb.grad, rm, rv)]

    got, want = chain(True), chain(False)
    torch_got, torch_want = torch_chain(True), torch_chain(False)
    names = ("out", "dh", "dw1", "dw2", "dgamma", "dbeta", "running_mean", "running_var")
    for name, a, e, ta, te in zip(names, got, want, torch_got, torch_want):
        err = np.linalg.norm(a - e) / np.linalg.norm(e)
        torch_err = np.linalg.norm(ta - te) / np.linalg.norm(te)
        # bf16 error of the same chain in PyTorch (cuDNN's bf16 batch norm) as the yardstick: the input gradient of
        # batch norm is a difference of per-channel means, so its bf16 error is several roundings (3% measured)
        assert err < max(2e-2, 1.5 * torch_err), f"{name}: relative error {err:.4f}, PyTorch's {torch_err:.4f}"


@pytest.mark.parametrize("one", [False, True])
def test_nhwc_backward_adds_two_gradient_contributions_itself(one, simulated_gpu):
    """An activation used twice (a residual block's input) hands its two gradients to batch norm's backward as a
    GradientPair; the kernels add them as they load them: same result as the generic path's summed gradient."""
    simulated_gpu(64, one=one)
    x, w, b, _, g = _inputs((2, 16, 8, 8), seed=21)
    g2 = np.random.default_rng(22).standard_normal(x.shape).astype(np.float32)
    seen = []
    results = []
    for channels_last in (True, False):
        tx = frost.Tensor(as_channels_last(x) if channels_last else x, requires_grad=True)
        tw, tb = frost.tensor(w, requires_grad=True), frost.tensor(b, requires_grad=True)
        if channels_last:  # the NHWC kernels (simulated)
            out = norm.batch_norm_act(tx, None, None, tw, tb, training=True, relu=True)
        else:  # the generic NumPy path
            out = norm.batch_norm(tx, None, None, tw, tb, training=True).relu()
        if channels_last:
            backward = out._ctx.backward
            assert backward.takes_gradient_pairs

            def spy(grad, backward=backward):
                seen.append(type(grad).__name__)
                return backward(grad)
            spy.takes_gradient_pairs = True
            out._ctx.backward = spy
        a = frost.Tensor(as_channels_last(g) if channels_last else g)
        c = frost.Tensor(as_channels_last(g2) if channels_last else g2)
        ((out * a).sum() + (out * c).sum()).backward()
        results.append([t.grad.numpy() for t in (tx, tw, tb)])
    assert seen == ["GradientPair"]
    for name, got, want in zip(("dx", "dweight", "dbias"), *results):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=name)


def test_backward_buffers_and_parent_grads_follow_the_parents():
    w = frost.tensor(np.ones(3, np.float32), requires_grad=True)
    dweight, dbias, part_g, part_gx = bn._backward_buffers(np, 3, 4, w, None)
    assert dweight.shape == dbias.shape == (3,) and part_g.shape == part_gx.shape == (12,)
    assert dweight.dtype == dbias.dtype == part_g.dtype == np.float32
    dx, dw, db, dres = (np.full(2, v) for v in range(4))
    for weight, bias, residual, want in ((w, w, w, [0, 1, 2, 3]), (None, w, None, [0, 2]), (w, None, w, [0, 1, 3]),
                                         (None, None, None, [0])):
        got = bn._parent_grads(dx, weight, dw, bias, db, residual, dres)
        assert [int(a[0]) for a in got] == want


# ------------------------------------------------------------------ statistics made by the convolution before


def conv_partials(y, chunk):
    """What conv_fprop_mma's epilogue gives batch norm for a channels-last y: float32 mean and M2 of each channel
    over each split of `chunk` consecutive (N, H, W) rows, as [channel][split]."""
    from frost.accel.conv_fprop_mma import ChannelStats
    C = y.shape[1]
    tiles = y.transpose(0, 2, 3, 1).reshape(-1, chunk, C).astype(np.float64)
    mean = tiles.mean(axis=1)
    m2 = ((tiles - mean[:, None]) ** 2).sum(axis=1)
    return ChannelStats(y, mean.T.astype(np.float32).ravel(), m2.T.astype(np.float32).ravel(), tiles.shape[0], chunk)


@pytest.fixture
def launched(monkeypatch):
    """The names of the kernels launched (after simulated_gpu: run by the simulator)."""
    from frost.kernel.api import Kernel
    names, simulated = [], Kernel.__getitem__
    monkeypatch.setattr(Kernel, "__getitem__", lambda self, cfg: names.append(self.fn.__name__) or simulated(self, cfg))
    return names


# (shape, SM count, rows per split, one launch): the splits a lane merges (lanes 4, 2, 1 at 16, 32, 64 channels a
# block of 64 threads): 4 and 9 (merged in the normalize kernel), 24 (more than BN_CONV_STATS_MERGE: finalize)
CONV_STATS_CASES = [((4, 16, 8, 8), 2, 16, False), ((2, 32, 6, 6), 64, 4, True), ((3, 64, 4, 4), 2, 2, False)]


@pytest.mark.parametrize("relu,residual", [(1, 1), (0, 0)])
@pytest.mark.parametrize("shape,sms,chunk,one", CONV_STATS_CASES)
def test_nhwc_batch_norm_merges_the_convolutions_partials(shape, sms, chunk, one, relu, residual, simulated_gpu,
                                                           launched):
    simulated_gpu(sms, one=one)
    _check_nhwc_against_generic(*_inputs(shape, seed=shape[1] + chunk), relu, residual, chunk=chunk)
    forward = launched[:launched.index("batch_norm_apply_nhwc") + 1]
    assert "batch_norm_stats_partial_nhwc" not in forward   # the partials given were merged, none computed
    n = shape[0] * shape[2] * shape[3]
    lanes = bn.bn_split_nhwc(n, shape[1], sms, 64)[2]
    finalized = -(-n // chunk // lanes) > bn.BN_CONV_STATS_MERGE
    assert ("batch_norm_stats_finalize" in forward) == finalized


def test_nhwc_batch_norm_ignores_stale_or_foreign_partials(simulated_gpu, launched):
    simulated_gpu(2)
    x = frost.Tensor(as_channels_last(_inputs((2, 16, 4, 4), seed=3)[0]))
    x._channel_stats = conv_partials(x.data, 8)
    assert bn.conv_stats_of(x) is x._channel_stats
    x.add_(1.0)   # in place: the partials describe the old values
    assert bn.conv_stats_of(x) is None
    x._channel_stats = conv_partials(x.data.copy(order="K"), 8)   # of another array
    assert bn.conv_stats_of(x) is None
    x._channel_stats = conv_partials(x.data, 8)
    x.data = x.data.copy(order="K")
    assert bn.conv_stats_of(x) is None
    y = norm.batch_norm_act(x, None, None, training=True)
    assert "batch_norm_stats_partial_nhwc" in launched
    np.testing.assert_allclose(y.data.mean(axis=(0, 2, 3)), 0, atol=1e-5)
