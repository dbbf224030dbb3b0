"""The fused GPU batch-norm kernels (split reductions, + residual add, + ReLU) vs float64 NumPy and the CPU path."""
import numpy as np
import pytest

import frost
from frost.ops import norm

EPS, MOMENTUM = 1e-5, 0.1


def _reference64(x, w, b, res, g, relu, rm, rv):
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
    running = ((1 - MOMENTUM) * rm + MOMENTUM * mean, (1 - MOMENTUM) * rv + MOMENTUM * var * n / (n - 1))
    return dict(mean=mean, invstd=invstd, y=y, dx=dx, dw=dw, db=db, dres=g, rm=running[0], rv=running[1])


def _simulate(x, w, b, res, g, relu, threads, U, add_residual=1):
    """The six kernels of batch_norm_act, in the simulator, as batch_norm_act launches them."""
    C = x.shape[1]
    total, n = x.size, x.size // C
    hw = n // x.shape[0]
    S = -(-n // (threads * U))
    f32 = np.float32
    mean, invstd, rm, rv = np.zeros(C, f32), np.zeros(C, f32), np.full(C, 0.5, f32), np.full(C, 2.0, f32)
    pa, pb = np.full(C * S, np.nan, f32), np.full(C * S, np.nan, f32)
    norm.batch_norm_stats_partial.simulate[(S, C), threads](x, pa, pb, n, hw, C, S, U=U)
    norm.batch_norm_stats_finalize.simulate[C, 32](pa, pb, mean, invstd, rm, rv, n, S, threads * U, MOMENTUM, EPS, 1)
    y = np.full_like(x, np.nan)
    flags = dict(relu=relu, add_residual=add_residual)
    blocks = -(-total // (threads * 4))
    norm.batch_norm_apply.simulate[blocks, threads](x, y, mean, invstd, w, b, res, total, hw, C, **flags, U=4)
    pg, pgx = np.full(C * S, np.nan, f32), np.full(C * S, np.nan, f32)
    norm.batch_norm_backward_partial.simulate[(S, C), threads](g, x, y, mean, pg, pgx, n, hw, C, S, relu=relu, U=U)
    dw, db = np.full(C, np.nan, f32), np.full(C, np.nan, f32)
    norm.batch_norm_backward_finalize.simulate[C, 32](pg, pgx, invstd, dw, db, S)
    dx, dres = np.full_like(x, np.nan), np.full_like(x, np.nan)
    norm.batch_norm_backward_input.simulate[blocks, threads](g, x, y, mean, invstd, w, dw, db, dx, dres, total, hw,
                                                             C, n, **flags, U=4)
    return dict(mean=mean, invstd=invstd, y=y, dx=dx, dw=dw, db=db, dres=dres, rm=rm, rv=rv), S


def _inputs(shape, seed, offset=0.5, scale=2.0):
    rng = np.random.default_rng(seed)
    C = shape[1]
    x = (rng.standard_normal(shape) * scale + offset).astype(np.float32)
    w, b = rng.standard_normal(C).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    res = rng.standard_normal(shape).astype(np.float32)
    g = rng.standard_normal(shape).astype(np.float32)
    return x, w, b, res, g


# shape, threads, values per thread: n = N*H*W not a multiple of a block's work, one channel, a tiny n, a 2-D input
# (hw = 1), rows longer than a block (hw > threads), rows that divide a block, several splits, one split.
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
def test_simulated_kernels_match_float64(shape, threads, U, relu):
    x, w, b, res, g = _inputs(shape, seed=len(shape) + shape[0] + relu)
    got, _ = _simulate(x, w, b, res, g, relu, threads, U)
    want = _reference64(x, w, b, res, g, relu, np.full(shape[1], 0.5), np.full(shape[1], 2.0))
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-4, atol=1e-5, err_msg=key)


def test_simulated_kernels_without_residual_leave_it_alone():
    x, w, b, res, g = _inputs((3, 2, 4, 5), seed=7)
    got, _ = _simulate(x, w, b, res.copy(), g, 1, 32, 2, add_residual=0)
    want = _reference64(x, w, b, np.zeros_like(res), g, 1, np.full(2, 0.5), np.full(2, 2.0))
    for key in ("y", "dx", "dw", "db"):
        np.testing.assert_allclose(got[key], want[key], rtol=1e-4, atol=1e-5, err_msg=key)
    assert np.isnan(got["dres"]).all()  # not written


def test_statistics_stay_accurate_far_from_zero():
    # mean 1000, std 1: naive sum / sum-of-squares in float32 would lose every digit of the variance
    x, w, b, res, g = _inputs((4, 2, 8, 8), seed=3, offset=1000.0, scale=1.0)
    got, S = _simulate(x, w, b, res, g, 0, 32, 2)
    assert S == 4
    want = _reference64(x, w, b, res, g, 0, np.full(2, 0.5), np.full(2, 2.0))
    for key in ("mean", "invstd", "rm", "rv"):  # (y itself is only as exact as float32's ulp of 1000 allows)
        np.testing.assert_allclose(got[key], want[key], rtol=1e-4, atol=1e-5, err_msg=key)


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


KERNEL_SPECS = [(norm.batch_norm_stats_partial, [dict(U=u) for u in (2, 4, 8, 16)]),
                (norm.batch_norm_stats_finalize, [{}]),
                (norm.batch_norm_apply, [dict(relu=r, add_residual=a) for r in (0, 1) for a in (0, 1)]),
                (norm.batch_norm_backward_partial, [dict(relu=r, U=u) for r in (0, 1) for u in (2, 4, 8, 16)]),
                (norm.batch_norm_backward_finalize, [{}]),
                (norm.batch_norm_backward_input, [dict(relu=r, add_residual=a) for r in (0, 1) for a in (0, 1)])]


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
    out = norm.batch_norm_act(x, None, None, training=True, residual=r, relu=True)
    ref = (norm.batch_norm(x, None, None, training=True) + r).relu()
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-6)


def test_fused_op_needs_more_than_one_value_per_channel():
    with pytest.raises(ValueError, match=r"batch_norm: expected more than 1 value per channel .* \(1, 3\)"):
        norm.batch_norm_act(frost.ones(1, 3), None, None, training=True, relu=True)


def _run(dev, x, w, b, res, g, relu, residual):
    C = x.shape[1]
    tx, tw, tb, tr = (frost.tensor(a, device=dev, requires_grad=True) for a in (x, w, b, res))
    rm, rv = frost.zeros(C, device=dev), frost.ones(C, device=dev)
    out = norm.batch_norm_act(tx, rm, rv, tw, tb, training=True, residual=tr if residual else None, relu=relu)
    out.backward(frost.tensor(g, device=dev))
    grads = [tx.grad, tw.grad, tb.grad] + ([tr.grad] if residual else [])
    return [t.cpu().numpy() if dev == "cuda" else t.numpy() for t in [out, *grads, rm, rv]]


GPU_SHAPES = [(8, 16, 6, 6), (32, 16, 32, 32), (32, 32, 16, 16), (32, 64, 8, 8), (64, 10), (3, 1, 5, 5),
              (2, 3, 1, 1)]


@pytest.mark.cuda
@pytest.mark.parametrize("shape", GPU_SHAPES)
@pytest.mark.parametrize("relu,residual", [(False, False), (True, False), (True, True)])
def test_gpu_fused_batch_norm_matches_cpu(shape, relu, residual):
    x, w, b, res, g = _inputs(shape, seed=3, offset=1.0, scale=3.0)
    for got, want in zip(_run("cuda", x, w, b, res, g, relu, residual), _run("cpu", x, w, b, res, g, relu, residual)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.cuda
def test_gpu_fused_batch_norm_is_deterministic():
    x, w, b, res, g = _inputs((32, 16, 32, 32), seed=4)
    first = _run("cuda", x, w, b, res, g, True, True)
    for _ in range(3):
        for a, b_ in zip(first, _run("cuda", x, w, b, res, g, True, True)):
            np.testing.assert_array_equal(a, b_)


@pytest.mark.cuda
def test_gpu_fused_batch_norm_replays_in_a_cuda_graph():
    x, w, b, res, g = _inputs((32, 32, 16, 16), seed=6)
    tw, tb = (frost.tensor(a, device="cuda", requires_grad=True) for a in (w, b))
    rm, rv = frost.zeros(32, device="cuda"), frost.ones(32, device="cuda")
    gt = frost.tensor(g, device="cuda")

    def step(tx, tr):
        tw.grad = tb.grad = None
        out = norm.batch_norm_act(tx, rm, rv, tw, tb, training=True, residual=tr, relu=True)
        out.backward(gt)
        return out, tw.grad, tb.grad

    jitted = frost.jit(step)
    rng = np.random.default_rng(1)
    for i in range(5):  # eager twice, capture, then replays with new inputs
        xi = x * (1 + i) + rng.standard_normal(x.shape).astype(np.float32)
        tx, tr = frost.tensor(xi, device="cuda"), frost.tensor(res, device="cuda")
        got = [t.cpu().numpy() for t in jitted(tx, tr)]
        want = _reference64(xi, w, b, res, g, 1, np.zeros(32), np.ones(32))
        for a, key in zip(got, ("y", "dw", "db")):
            np.testing.assert_allclose(a, want[key], rtol=1e-4, atol=1e-4, err_msg=f"call {i}: {key}")
