"""The fused GPU batch-norm kernels (split reductions, statistics merged in the elementwise kernels, + residual
add, + ReLU) vs float64 NumPy and the CPU path."""
import numpy as np
import pytest

import frost
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
    norm.batch_norm_stats_partial.simulate[(S, C), threads](x, pa, pb, n, hw, C, S, U=U)
    if not fused:
        norm.batch_norm_stats_finalize.simulate[C, 32](pa, pb, mean, invstd, rm, rv, n, S, threads * U, momentum,
                                                       EPS, update_running)
    y = np.full_like(x, np.nan)
    flags = dict(relu=relu, add_residual=add_residual, fused=fused, U=apply_U)
    blocks = -(-total // (apply_threads * apply_U))
    norm.batch_norm_apply.simulate[blocks, apply_threads](x, y, pa, pb, mean, invstd, rm, rv, batches, w, b, res,
                                                          total, hw, C, n, S, threads * U, momentum, EPS,
                                                          update_running, count_batch, **flags)
    pg, pgx = np.full(C * S, np.nan, f32), np.full(C * S, np.nan, f32)
    norm.batch_norm_backward_partial.simulate[(S, C), threads](g, x, y, mean, pg, pgx, n, hw, C, S, relu=relu, U=U)
    dw, db = np.full(C, np.nan, f32), np.full(C, np.nan, f32)
    if not fused:
        norm.batch_norm_backward_finalize.simulate[C, 32](pg, pgx, invstd, dw, db, S)
    dx, dres = np.full_like(x, np.nan), np.full_like(x, np.nan)
    norm.batch_norm_backward_input.simulate[blocks, apply_threads](g, x, y, mean, invstd, w, pg, pgx, dw, db, dx,
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
    assert norm.bn_fusable(shape[2] * shape[3], apply_threads, apply_U)
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
    norm.batch_norm_stats_finalize.simulate[C, 32](pm, pv, mean, invstd, rm, rv, n, S, chunk, MOMENTUM, EPS, 0)
    np.testing.assert_allclose(mean, vals.astype(np.float64).mean(axis=1), rtol=1e-5)
    np.testing.assert_allclose(invstd, 1 / np.sqrt(vals.astype(np.float64).var(axis=1) + EPS), rtol=1e-5)
    assert (rm == 0).all() and (rv == 1).all()  # update_running=0 leaves them
    pg, pgx = rng.standard_normal(C * S).astype(np.float32), rng.standard_normal(C * S).astype(np.float32)
    dw, db = np.zeros(C, np.float32), np.zeros(C, np.float32)
    norm.batch_norm_backward_finalize.simulate[C, 32](pg, pgx, invstd, dw, db, S)
    np.testing.assert_allclose(db, pg.reshape(C, S).astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw, pgx.reshape(C, S).astype(np.float64).sum(axis=1) * invstd, rtol=1e-5, atol=1e-5)


def test_split_fills_the_gpu_at_the_seed_shapes():
    # the seed ResNet's layers at batch 32 on a 132-SM H200: 4 blocks per SM wanted
    assert norm.bn_split(32768, 16, 132) == (4, 32)
    assert norm.bn_split(8192, 32, 132) == (2, 16)
    assert norm.bn_split(2048, 64, 132) == (2, 4)
    for n, C in [(2, 1), (7, 3), (32768, 16), (256 * 112 * 112, 64), (10**6, 2048)]:
        U, S = norm.bn_split(n, C, 132)
        assert U in (2, 4, 8, 16)
        assert (S - 1) * norm.BN_THREADS * U < n <= S * norm.BN_THREADS * U


def test_seed_shapes_take_the_fused_path():
    assert norm.BN_APPLY_PER_THREAD == 1 and norm.BN_APPLY_THREADS == 256
    for hw in (32 * 32, 16 * 16, 8 * 8, 7 * 7, 37):  # the seed ResNet's three, ImageNet's last stage
        assert norm.bn_fusable(hw)
    for hw in (1, 16, 32, 36):  # a block of 256 would meet more channel rows than its 8 warps
        assert not norm.bn_fusable(hw)
    assert norm.bn_fusable(64, 64) and not norm.bn_fusable(63, 64) and not norm.bn_fusable(64, 64, 2)


KERNEL_SPECS = [(norm.batch_norm_stats_partial, [dict(U=u) for u in (2, 4, 8, 16)]),
                (norm.batch_norm_stats_finalize, [{}]),
                (norm.batch_norm_apply, [dict(relu=r, add_residual=a, fused=f, U=u) for r in (0, 1) for a in (0, 1)
                                         for f in (0, 1) for u in (1, 4)]),
                (norm.batch_norm_backward_partial, [dict(relu=r, U=u) for r in (0, 1) for u in (2, 4, 8, 16)]),
                (norm.batch_norm_backward_finalize, [{}]),
                (norm.batch_norm_backward_input, [dict(relu=r, add_residual=a, fused=f, U=u) for r in (0, 1)
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
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-6)
    assert counter.item() == 1
    norm.batch_norm_act(x, frost.zeros(3), frost.ones(3), training=False, num_batches_tracked=counter)
    assert counter.item() == 1  # evaluation does not count


@pytest.mark.parametrize("shape", [(2, 3, 8, 8), (4, 1, 7, 7), (2, 3, 4, 4)])  # fused, fused, fallback (hw 16)
def test_gpu_path_launches_in_the_simulator_match_the_generic_path(shape, monkeypatch):
    # batch_norm_act's GPU branch on NumPy arrays, its launches run by the simulator: checks what it passes
    from frost.kernel.api import Kernel
    monkeypatch.setattr(Kernel, "__getitem__", lambda self, cfg: self.simulate[cfg])
    monkeypatch.setattr(norm, "_sms", lambda x: 2)
    x, w, b, res, g = _inputs(shape, seed=9)
    results = []
    for fast in (True, False):
        monkeypatch.setattr(norm, "_gpu_fast_path", lambda *args, fast=fast: fast)
        tx, tw, tb, tr = (frost.tensor(a, requires_grad=True) for a in (x, w, b, res))
        rm, rv, counter = frost.zeros(shape[1]), frost.ones(shape[1]), frost.tensor(3, dtype="int64")
        out = norm.batch_norm_act(tx, rm, rv, tw, tb, True, MOMENTUM, EPS, tr, True, num_batches_tracked=counter)
        out.backward(frost.tensor(g))
        results.append([t.numpy() for t in (out, tx.grad, tw.grad, tb.grad, tr.grad, rm, rv, counter)])
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
    return [t.cpu().numpy() if dev == "cuda" else t.numpy() for t in [out, *grads, rm, rv, counter]]


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


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(32, 32, 16, 16), (16, 8, 4, 4)])  # the fused path, the fallback
def test_gpu_fused_batch_norm_replays_in_a_cuda_graph(shape):
    x, w, b, res, g = _inputs(shape, seed=6)
    C = shape[1]
    tw, tb = (frost.tensor(a, device="cuda", requires_grad=True) for a in (w, b))
    rm, rv = frost.zeros(C, device="cuda"), frost.ones(C, device="cuda")
    counter = frost.tensor(0, dtype="int64", device="cuda")
    gt = frost.tensor(g, device="cuda")

    def step(tx, tr):
        tw.grad = tb.grad = None
        out = norm.batch_norm_act(tx, rm, rv, tw, tb, training=True, residual=tr, relu=True,
                                  num_batches_tracked=counter)
        out.backward(gt)
        return out, tw.grad, tb.grad

    jitted = frost.jit(step)
    rng = np.random.default_rng(1)
    want_rm, want_rv = np.zeros(C), np.ones(C)
    for i in range(5):  # eager twice, capture, then replays with new inputs
        xi = x * (1 + i) + rng.standard_normal(x.shape).astype(np.float32)
        tx, tr = frost.tensor(xi, device="cuda"), frost.tensor(res, device="cuda")
        got = [t.cpu().numpy() for t in jitted(tx, tr)]
        want = _reference64(xi, w, b, res, g, 1, want_rm, want_rv)
        want_rm, want_rv = want["rm"], want["rv"]
        for a, key in zip(got, ("y", "dw", "db")):
            np.testing.assert_allclose(a, want[key], rtol=1e-4, atol=1e-4, err_msg=f"call {i}: {key}")
    assert counter.item() == 5
    np.testing.assert_allclose(rm.cpu().numpy(), want_rm, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(rv.cpu().numpy(), want_rv, rtol=1e-4, atol=1e-4)


@pytest.mark.cuda
@pytest.mark.parametrize("momentum", [0.1, None])
def test_gpu_batchnorm_module_counts_batches_once(momentum):
    rng = np.random.default_rng(8)
    f, c = frost.nn.BatchNorm2d(16, momentum=momentum).cuda(), frost.nn.BatchNorm2d(16, momentum=momentum)
    for step in range(3):
        x = rng.standard_normal((8, 16, 16, 16)).astype(np.float32) * (step + 1)
        np.testing.assert_allclose(f(frost.tensor(x, device="cuda")).cpu().numpy(), c(frost.tensor(x)).numpy(),
                                   rtol=1e-4, atol=1e-4)
    assert f.num_batches_tracked.item() == c.num_batches_tracked.item() == 3
    for name in ("running_mean", "running_var"):
        np.testing.assert_allclose(getattr(f, name).cpu().numpy(), getattr(c, name).numpy(), rtol=1e-4, atol=1e-5)
