"""The fused GPU cross-entropy kernels (warp-per-row log-sum-exp and loss, one-thread-per-logit gradient) vs
float64 NumPy and the generic path, in the simulator, compiled by NVRTC and on the GPU."""
import ml_dtypes
import numpy as np
import pytest

import frost
from frost import dispatch
from frost.accel import cross_entropy as xent
from frost.ops.loss import cross_entropy

IGNORE = -100


def _inputs(N, C, ignored, seed, scale=3.0):
    """Logits, int64 targets (with ignored rows: none, some, or all) and an upstream gradient."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((N, C)) * scale).astype(np.float32)
    t = rng.integers(0, C, N).astype(np.int64)
    if ignored == "some":
        t[::3] = IGNORE
    elif ignored == "all":
        t[:] = IGNORE
    return x, t, np.float32(rng.uniform(0.5, 2.0))


def _reference64(x, t, g, reduction):
    """Loss, count of counted rows and d(loss)/dx in float64 (mean of no rows: NaN loss, zero gradient)."""
    x = x.astype(np.float64)
    valid = t != IGNORE
    m = x.max(axis=1, keepdims=True)
    lse = np.log(np.exp(x - m).sum(axis=1)) + m[:, 0]
    col = np.where(valid, t, 0)
    rows = np.where(valid, lse - x[np.arange(len(t)), col], 0.0)
    count = valid.sum()
    with np.errstate(invalid="ignore", divide="ignore"):
        loss = rows.sum() / count if reduction == "mean" else rows.sum()
        coef = g / count if reduction == "mean" else g
    d = np.exp(x - lse[:, None])
    d[np.arange(len(t)), col] -= 1
    d = np.where(valid[:, None], coef * d, 0.0)
    return loss, count, d


def _simulate(x, t, g, reduction, blocks=1, threads=xent.XENT_THREADS):
    """The kernels as cross_entropy_kernels launches them (blocks > 1: partial sums, then the finalize kernel)."""
    N, C = x.shape
    f32 = np.float32
    mean = int(reduction == "mean")
    lse, loss, count = np.full(N, np.nan, f32), np.full(1, np.nan, f32), np.full(1, np.nan, f32)
    part_loss, part_count = np.full(blocks, np.nan, f32), np.full(blocks, np.nan, f32)
    xent.cross_entropy_forward.simulate[blocks, threads](x.ravel(), t, lse, loss, count, part_loss, part_count, N, C,
                                                      IGNORE, mean)
    if blocks > 1:
        xent.cross_entropy_finalize.simulate[1, threads](part_loss, part_count, loss, count, blocks, mean)
    dx = np.full(N * C, np.nan, f32)
    xent.cross_entropy_backward.simulate[-(-N * C // 64), 64](x.ravel(), t, lse, count, np.array([g], f32), dx, N, C,
                                                          IGNORE, mean)
    return loss[0], count[0], dx.reshape(N, C)


def _check_against_reference(got, want):
    loss, count, dx = got
    want_loss, want_count, want_dx = want
    assert count == want_count
    if np.isnan(want_loss):
        assert np.isnan(loss)
    else:
        np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-4, atol=1e-6)


SHAPES = [(N, C) for N in (1, 3, 32, 70) for C in (2, 10, 33)] + [(1, 1000), (3, 1000)]


@pytest.mark.parametrize("ignored", ["none", "some"])
@pytest.mark.parametrize("N,C", SHAPES)
def test_kernels_match_float64(N, C, ignored):
    x, t, g = _inputs(N, C, ignored, seed=N * 7 + C)
    for reduction in ("mean", "sum"):  # blocks of 2 warps (the op launches 32): a quicker simulation
        _check_against_reference(_simulate(x, t, g, reduction, threads=64), _reference64(x, t, g, reduction))


def test_kernels_match_float64_with_a_thousand_classes():
    # 70 rows: 9 for some warps of the block; the lanes loop 32 times over each row
    x, t, g = _inputs(70, 1000, "some", seed=70)
    _check_against_reference(_simulate(x, t, g, "sum"), _reference64(x, t, g, "sum"))


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_all_rows_ignored(reduction):
    # mean: 0/0 is NaN with a zero gradient (the generic path and PyTorch); sum: 0
    x, t, g = _inputs(5, 7, "all", seed=1)
    loss, count, dx = _simulate(x, t, g, reduction)
    assert count == 0 and (dx == 0).all()
    assert np.isnan(loss) if reduction == "mean" else loss == 0


@pytest.mark.parametrize("blocks,threads", [(3, 64), (5, 32), (16, 64)])  # 16 blocks: some have no rows
def test_partial_sums_and_finalize(blocks, threads):
    x, t, g = _inputs(70, 10, "some", seed=blocks)
    for reduction in ("mean", "sum"):
        got = _simulate(x, t, g, reduction, blocks=blocks, threads=threads)
        _check_against_reference(got, _reference64(x, t, g, reduction))


def test_finalize_adds_more_partials_than_a_block_has_threads():
    rng = np.random.default_rng(4)
    parts = 300
    part_loss = rng.uniform(0, 5, parts).astype(np.float32)
    part_count = rng.integers(0, 9, parts).astype(np.float32)
    loss, count = np.full(1, np.nan, np.float32), np.full(1, np.nan, np.float32)
    xent.cross_entropy_finalize.simulate[1, 64](part_loss, part_count, loss, count, parts, 1)
    assert count[0] == part_count.sum()
    np.testing.assert_allclose(loss[0], part_loss.astype(np.float64).sum() / part_count.sum(), rtol=1e-5)


def test_out_of_range_targets_wrap_as_the_generic_path_on_cupy():
    # only reachable inside a capture (elsewhere the op raises first): CuPy's fancy indexing wraps the index
    x, _, g = _inputs(4, 5, "none", seed=2)
    t = np.array([7, -1, -6, 2], np.int64)
    wrapped = t % 5
    for reduction in ("mean", "sum"):
        _check_against_reference(_simulate(x, t, g, reduction), _reference64(x, wrapped, g, reduction))


def test_large_logits_are_stable():
    x, t, g = _inputs(6, 9, "none", seed=3, scale=1.0)
    x[:, 0] += 1e4  # exp would overflow without the max shift
    x[1] -= 3e4
    _check_against_reference(_simulate(x, t, g, "mean"), _reference64(x, t, g, "mean"))


def test_seed_shape_takes_one_launch_each_way():
    assert xent.xent_blocks(32) == 1 and xent.xent_blocks(xent.XENT_ROWS_PER_BLOCK) == 1
    assert xent.xent_blocks(xent.XENT_ROWS_PER_BLOCK + 1) == 2
    assert xent.xent_blocks(10**7) == xent.XENT_MAX_BLOCKS
    assert xent.xent_blocks(32, 10) == 1 and xent.xent_blocks(64 * 256, 65) == 17    # the seed's, shakespeare-char's
    assert xent.xent_blocks(16 * 1024, 50304) == 512                                 # GPT-2's: a row a warp


@pytest.mark.parametrize("vocab", [4096, 4100])   # eight logits a load; one at a time
def test_a_row_read_once_with_a_running_max_matches_float64(simulated_launches, vocab):
    """The forward's one-pass log-sum-exp over a long row whose max appears late (every lane rescales its sum)."""
    x, t, g = _inputs(2, vocab, "none", seed=5)
    x[:, -40:] += 30.0     # the largest logits last: each lane's running max moves up at the end
    if vocab % 8 == 0:   # 16-bit logits, read 8 a load; autocast keeps the loss in float32
        x = x.astype(np.float32).astype(ml_dtypes.bfloat16)
    with frost.autocast(frost.bfloat16):
        fast, fast_grad = _run_op(simulated_launches, True, x, t, g, "mean")
    want, _, want_grad = _reference64(x.astype(np.float64), t, g, "mean")
    assert fast.dtype == frost.float32
    np.testing.assert_allclose(fast.detach().numpy(), want, rtol=1e-5)
    np.testing.assert_allclose(fast_grad.numpy().astype(np.float64), want_grad, rtol=1e-2, atol=1e-6)


KERNELS = [xent.cross_entropy_finalize, xent.count_targets] + [k for ks in xent.XENT_KERNELS.values() for k in ks]


@pytest.mark.parametrize("kern", KERNELS, ids=[f"{k.__name__}-{i}" for i, k in enumerate(KERNELS)])
def test_kernels_compile_for_sm90(kern, tmp_path, monkeypatch):
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    cubin = kern.compile("sm_90")
    assert cubin[:4] == b"\x7fELF"
    assert b".nv.local" not in cubin, f"{kern.__name__} spills registers to local memory"


# ------------------------------------------------------------------ the op's fast path, kernels in the simulator

def _as_if_on_the_gpu(monkeypatch, gpu: bool = True) -> None:
    """dispatch takes NumPy arrays for CuPy ones (gpu=True): cross_entropy's CUDA fast path runs on the CPU."""
    monkeypatch.setattr(dispatch, "device_of", lambda array: "cuda" if gpu else "cpu")


def _takes_kernels(x, t, weight, reduction, label_smoothing) -> bool:
    found = dispatch.lookup("cross_entropy", x, t, weight, reduction=reduction, label_smoothing=label_smoothing)
    return found is xent.cross_entropy_kernels


def _run_op(monkeypatch, fast, x, t, g, reduction):
    _as_if_on_the_gpu(monkeypatch, fast)
    tx = frost.tensor(x, requires_grad=True)
    out = cross_entropy(tx, frost.tensor(t), ignore_index=IGNORE, reduction=reduction)
    out.backward(frost.tensor(g))
    return out, tx.grad


@pytest.fixture
def simulated_launches(monkeypatch):
    """cross_entropy's GPU branch on NumPy arrays, its launches run by the simulator: checks what it passes."""
    from frost.kernel.api import Kernel
    monkeypatch.setattr(Kernel, "__getitem__", lambda self, cfg: self.simulate[cfg])
    return monkeypatch


@pytest.mark.parametrize("N,C,ignored,reduction,rows_per_block",
                         [(32, 10, "none", "mean", None), (32, 10, "some", "sum", None), (3, 33, "some", "mean", None),
                          (70, 10, "some", "mean", 16), (70, 2, "none", "sum", 8), (4, 6, "all", "mean", None)])
def test_fast_path_in_the_simulator_matches_the_generic_path(simulated_launches, N, C, ignored, reduction,
                                                              rows_per_block):
    if rows_per_block is not None:  # several forward blocks: partial sums and the finalize launch
        simulated_launches.setattr(xent, "XENT_ROWS_PER_BLOCK", rows_per_block)
    x, t, g = _inputs(N, C, ignored, seed=N + C)
    fast, fast_grad = _run_op(simulated_launches, True, x, t, g, reduction)
    generic, generic_grad = _run_op(simulated_launches, False, x, t, g, reduction)
    assert fast.shape == generic.shape == () and fast.dtype == generic.dtype == frost.float32
    assert fast.requires_grad
    np.testing.assert_allclose(fast.detach().numpy(), generic.detach().numpy(), rtol=1e-5, atol=1e-6, equal_nan=True)
    assert fast_grad.dtype == frost.float32 and fast_grad.shape == (N, C)
    np.testing.assert_allclose(fast_grad.numpy(), generic_grad.numpy(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("autocast", [True, False])
@pytest.mark.parametrize("classes", [48, 45])   # 8 logits a load and a thread; one at a time
def test_half_precision_logits_are_read_as_they_are(simulated_launches, dtype, autocast, classes):
    """Under autocast the loss is float32 and the kernels read the 16-bit logits, not a float32 copy; without it the
    loss has the logits' dtype. Either way the values are the generic path's (which computes in float32 too): the
    loss to float32 rounding, the gradient rounded once into the logits' dtype (one unit of it where the two
    float32 values straddle a rounding boundary)."""
    launched = []
    simulated_launches.setattr(xent.XENT_KERNELS[dtype, 1][0].__class__, "__getitem__",
                               lambda self, cfg: launched.append(self) or self.simulate[cfg])
    x, t, g = _inputs(37, classes, "some", seed=5)
    x = x.astype(frost.dtype.to_dtype(dtype).np)
    results = []
    for fast in (True, False):
        _as_if_on_the_gpu(simulated_launches, fast)
        tx = frost.tensor(x, requires_grad=True)
        with frost.autocast(dtype) if autocast else frost.autocast(dtype, enabled=False):
            out = cross_entropy(tx, frost.tensor(t), ignore_index=IGNORE)
        out.backward(frost.tensor(np.asarray(g, out.dtype.np)))
        assert out.dtype.name == ("float32" if autocast else dtype) and tx.grad.dtype.name == dtype
        results.append((out.detach().numpy().astype(np.float64), tx.grad.numpy().astype(np.float64)))
    # the 16-bit kernels, given the logits themselves, and no float32 copy of them made first (only the generic
    # path, second, casts under autocast)
    assert [k.__name__ for k in launched if k.__name__.startswith("cast")] == []
    assert launched == list(xent.XENT_KERNELS[dtype, 8 if classes % 8 == 0 else 1][:2])   # narrow rows
    (fast_loss, fast_grad), (loss, grad) = results
    np.testing.assert_allclose(fast_loss, loss, rtol=1e-5 if autocast else 2 * 2.0**-8)
    unit = 2.0**-8 if dtype == "bfloat16" else 2.0**-11
    np.testing.assert_allclose(fast_grad, grad, rtol=unit, atol=1e-7)


def test_ignored_rows_get_zero_gradients_whatever_their_logits(simulated_launches):
    _as_if_on_the_gpu(simulated_launches)
    for classes in (16, 15):   # the 8-a-thread and the one-a-thread backward
        x = np.ones((3, classes), np.float32)
        x[1] = np.nan   # a padded position's logits may hold anything
        tx = frost.tensor(x.astype(frost.dtype.to_dtype("bfloat16").np), requires_grad=True)
        with frost.autocast("bfloat16"):
            cross_entropy(tx, frost.tensor(np.array([0, IGNORE, 2]))).backward()
        grad = tx.grad.float().numpy()
        assert np.array_equal(grad[1], np.zeros(classes)) and np.isfinite(grad).all()


def test_higher_order_gradients_through_the_half_precision_fast_path(simulated_launches):
    x, t, _ = _inputs(6, 16, "none", seed=8)
    x = x.astype(frost.dtype.to_dtype("bfloat16").np)
    grads = []
    for fast in (True, False):
        _as_if_on_the_gpu(simulated_launches, fast)
        tx = frost.tensor(x, requires_grad=True)
        with frost.autocast("bfloat16"):
            loss = cross_entropy(tx, frost.tensor(t))
        (dx,) = frost.autograd.grad(loss, tx, create_graph=True)
        assert dx.dtype == frost.bfloat16
        (dx.float() ** 2).sum().backward()
        grads.append((dx.detach().float().numpy(), tx.grad.float().numpy()))
    for a, e in zip(*grads):
        np.testing.assert_allclose(a, e, rtol=2 * 2.0**-8, atol=1e-6)


def test_fast_path_keeps_the_target_checks(simulated_launches):
    _as_if_on_the_gpu(simulated_launches)
    x = frost.randn(3, 4)
    with pytest.raises(IndexError, match=r"cross_entropy: target index 7 is out of range for 4 classes"):
        cross_entropy(x, frost.tensor([0, 7, 1]))
    with pytest.raises(RuntimeError, match=r"cross_entropy: target of shape \(2,\) does not fit input of shape"):
        cross_entropy(x, frost.tensor([0, 1]))


def test_fast_path_conditions_on_the_cpu():
    x, t = frost.randn(4, 5), frost.tensor([0, 1, 2, 3])
    assert not _takes_kernels(x, t, None, "mean", 0.0)  # CPU tensors keep the generic path


# ------------------------------------------------------------------ the gradient written by the forward

@pytest.fixture
def wide_rows(simulated_launches):
    """Rows of 16 classes and more count as wide (GPT's 50k vocabulary in small): the forward writes their gradient.
    Returns the names of the kernels launched, in the simulator, with the fast path taken."""
    from frost.kernel.api import Kernel
    simulated_launches.setattr(xent, "GRADIENT_IN_FORWARD_MIN_CLASSES", 16)
    simulated_launches.setattr(xent, "GRADIENT_IN_FORWARD", True)   # whatever FROST_XENT_GRADIENT_IN_FORWARD says
    launched = []
    simulated_launches.setattr(Kernel, "__getitem__",
                               lambda self, cfg: launched.append(self.__name__) or self.simulate[cfg])
    _as_if_on_the_gpu(simulated_launches)
    return launched


def _loss_and_grad(x, t, reduction, g=None, backwards=1):
    tx = frost.tensor(x, requires_grad=True)
    loss = cross_entropy(tx, frost.tensor(t), ignore_index=IGNORE, reduction=reduction)
    for _ in range(backwards):
        loss.backward(None if g is None else frost.tensor(np.asarray(g, loss.dtype.np)), retain_graph=True)
    return loss.detach().numpy(), tx.grad.numpy()


def _assert_close_to_the_backward_kernels(got: tuple, want: tuple) -> None:
    """The fused forward's loss and gradient against the warp-a-row forward and the backward kernel's: the block sums
    a row's exponentials in another order, so log-sum-exp may move by a float32 unit; in bf16 a gradient value then
    lands on the other side of a rounding boundary (one unit of it, 2**-7 relative at most)."""
    (loss, grad), (want_loss, want_grad) = got, want
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6, equal_nan=True)
    grad, want_grad = grad.astype(np.float64), want_grad.astype(np.float64)
    rtol = 2.0**-7 if want[1].dtype != np.float32 else 2e-6
    np.testing.assert_allclose(grad, want_grad, rtol=rtol, atol=1e-6 * np.abs(want_grad).max())


@pytest.mark.parametrize("dtype, classes", [("float32", 33), ("bfloat16", 48), ("bfloat16", 45)])
@pytest.mark.parametrize("reduction, ignored, max_blocks", [("mean", "some", None), ("sum", "none", None),
                                                            ("mean", "some", 1), ("mean", "some", 5),
                                                            ("mean", "all", None)])
def test_the_forward_writes_the_gradient_the_backward_would(wide_rows, monkeypatch, dtype, classes, reduction,
                                                            ignored, max_blocks):
    """loss.backward() (an upstream gradient of 1): the loss and the gradient of the warp-a-row forward and the
    backward kernel, with a block a row (37 blocks), one block for every row, and blocks of several rows each;
    ignored rows zero; the backward's kernel then reads and writes nothing."""
    if max_blocks is not None:
        monkeypatch.setattr(xent, "XENT_MAX_BLOCKS", max_blocks)
    x, t, _ = _inputs(37, classes, ignored, seed=classes)
    x = x.astype(np.float32 if dtype == "float32" else ml_dtypes.bfloat16)
    fused = _loss_and_grad(x, t, reduction)
    launched = list(wide_rows)
    monkeypatch.setattr(xent, "GRADIENT_IN_FORWARD", False)
    separate = _loss_and_grad(x, t, reduction)
    assert launched[:2] == ["count_targets", "cross_entropy_forward_grad"] and "cross_entropy_backward" not in launched
    assert launched[-1] == "cross_entropy_backward_unless_one"
    assert ("cross_entropy_finalize" in launched) == (max_blocks != 1)
    _assert_close_to_the_backward_kernels(fused, separate)
    want_loss, _, want_grad = _reference64(x.astype(np.float64), t, 1.0, reduction)
    unit = 2.0**-7 if dtype != "float32" else 1e-5   # the loss and gradient in the logits' dtype (no autocast)
    np.testing.assert_allclose(fused[0].astype(np.float64), want_loss, rtol=unit, equal_nan=True)
    np.testing.assert_allclose(fused[1].astype(np.float64), want_grad, rtol=unit, atol=1e-7)
    if ignored != "none":
        assert not fused[1][t == IGNORE].any()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_an_upstream_gradient_other_than_one_rewrites_the_forwards_gradient(wide_rows, monkeypatch, dtype):
    """loss * g's gradient: the backward kernel's over the forward's gradient, launched on the device value (the
    host never reads g)."""
    x, t, g = _inputs(20, 40, "some", seed=3)
    x = x.astype(np.float32 if dtype == "float32" else ml_dtypes.bfloat16)
    fused = _loss_and_grad(x, t, "mean", g)
    assert wide_rows[-1] == "cross_entropy_backward_unless_one"
    monkeypatch.setattr(xent, "GRADIENT_IN_FORWARD", False)
    _assert_close_to_the_backward_kernels(fused, _loss_and_grad(x, t, "mean", g))
    want = _reference64(x.astype(np.float64), t, g, "mean")[2]
    np.testing.assert_allclose(fused[1].astype(np.float64), want, rtol=2.0**-7 if dtype == "bfloat16" else 1e-5,
                               atol=1e-7)


@pytest.mark.parametrize("g, rewritten", [(1.0, False), (0.5, True)])
def test_the_backward_after_a_forward_gradient_reads_and_writes_nothing_for_an_upstream_gradient_of_one(g, rewritten):
    x, t, _ = _inputs(5, 24, "some", seed=6)
    N, C = x.shape
    lse = np.log(np.exp(x.astype(np.float64)).sum(axis=1)).astype(np.float32)
    count = np.array([(t != IGNORE).sum()], np.float32)
    dx = np.full(N * C, 7.0, np.float32)   # not a gradient: what the kernel leaves or rewrites
    unless_one = xent.XENT_KERNELS["float32", 1][3]
    unless_one.simulate[3, 32](x.ravel(), t, lse, count, np.array([g], np.float32), dx, N, C, IGNORE, 1)
    if not rewritten:
        assert (dx == 7.0).all()
    else:
        np.testing.assert_allclose(dx.reshape(N, C), _reference64(x, t, g, "mean")[2], rtol=1e-5, atol=1e-7)


def test_a_second_backward_over_a_retained_graph_computes_the_gradient_again(wide_rows, monkeypatch):
    """The first backward hands out the forward's gradient array; the second reads the logits again (backward
    kernel): the two sum to twice the gradient, as without the fusion."""
    x, t, _ = _inputs(9, 24, "none", seed=4)
    fused = _loss_and_grad(x, t, "mean", backwards=2)
    assert wide_rows.count("cross_entropy_backward") == 1 and wide_rows.count("cross_entropy_backward_unless_one") == 1
    monkeypatch.setattr(xent, "GRADIENT_IN_FORWARD", False)
    _assert_close_to_the_backward_kernels(fused, _loss_and_grad(x, t, "mean", backwards=2))


def test_no_gradient_is_written_where_none_will_be_asked_for(wide_rows):
    x, t, _ = _inputs(9, 24, "none", seed=5)
    cross_entropy(frost.tensor(x, requires_grad=True), frost.tensor(t)).backward()
    with frost.no_grad():
        cross_entropy(frost.tensor(x, requires_grad=True), frost.tensor(t))
    cross_entropy(frost.tensor(x), frost.tensor(t))
    narrow = frost.tensor(x[:, :15], requires_grad=True)
    cross_entropy(narrow, frost.tensor(t % 15)).backward()
    assert wide_rows == ["count_targets", "cross_entropy_forward_grad", "cross_entropy_finalize",
                         "cross_entropy_backward_unless_one", "cross_entropy_forward", "cross_entropy_forward",
                         "cross_entropy_forward", "cross_entropy_backward"]


def test_second_order_gradients_through_the_forwards_gradient(wide_rows, monkeypatch):
    x, t, _ = _inputs(6, 16, "none", seed=8)
    grads = []
    for in_forward in (True, False):
        monkeypatch.setattr(xent, "GRADIENT_IN_FORWARD", in_forward)
        tx = frost.tensor(x, requires_grad=True)
        (dx,) = frost.autograd.grad(cross_entropy(tx, frost.tensor(t)), tx, create_graph=True)
        (dx ** 2).sum().backward()
        grads.append((dx.detach().numpy(), tx.grad.numpy()))
    for got, want in zip(*grads):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)


# ------------------------------------------------------------------ on the GPU

GPU_CASES = [(N, C) for N in (1, 3, 32, 70) for C in (2, 10, 33, 1000)] + [(3000, 10), (5000, 257)]


def _device_run(dev, x, t, g, reduction):
    tx = frost.tensor(x, device=dev, requires_grad=True)
    out = cross_entropy(tx, frost.tensor(t, device=dev), ignore_index=IGNORE, reduction=reduction)
    out.backward(frost.tensor(g, device=dev))
    return [a.detach().cpu().numpy() for a in (out, tx.grad)]


@pytest.mark.cuda
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("ignored", ["none", "some", "all"])
@pytest.mark.parametrize("N,C", GPU_CASES)
def test_gpu_fast_path_matches_the_cpu_generic_path(N, C, ignored, reduction, monkeypatch):
    taken, lookup = [], dispatch.lookup
    monkeypatch.setattr(dispatch, "lookup", lambda *a, **k: taken.append(lookup(*a, **k)) or taken[-1])
    x, t, g = _inputs(N, C, ignored, seed=N + C)
    got, want = _device_run("cuda", x, t, g, reduction), _device_run("cpu", x, t, g, reduction)
    assert taken == [xent.cross_entropy_kernels, None]  # the fast path was taken on the GPU
    for a, e in zip(got, want):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5, equal_nan=True)


@pytest.mark.cuda
def test_gpu_fast_path_is_deterministic():
    x, t, g = _inputs(5000, 257, "some", seed=9)
    first = _device_run("cuda", x, t, g, "mean")
    for _ in range(3):
        for a, b in zip(first, _device_run("cuda", x, t, g, "mean")):
            np.testing.assert_array_equal(a, b)


@pytest.mark.cuda
def test_gpu_other_inputs_keep_the_generic_path():
    x = frost.randn(4, 5, device="cuda")
    t = frost.tensor([0, 1, 2, 3], device="cuda")
    assert _takes_kernels(x, t, None, "mean", 0.0) and _takes_kernels(x, t, None, "sum", 0.0)
    assert not _takes_kernels(x, t, None, "none", 0.0)
    assert not _takes_kernels(x, t, None, "mean", 0.1)
    assert not _takes_kernels(x, t, frost.ones(5, device="cuda"), "mean", 0.0)
    assert not _takes_kernels(x, frost.tensor([0, 1, 2, 3], dtype="int32", device="cuda"), None, "mean", 0.0)
    assert not _takes_kernels(frost.randn(4, 5, 2, device="cuda"), t, None, "mean", 0.0)
    assert not _takes_kernels(x.to(frost.float64), t, None, "mean", 0.0)


@pytest.mark.cuda
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_gpu_fast_path_replays_in_a_cuda_graph(reduction, exact_gpu_math):  # the logits' matmul without TF32
    rng = np.random.default_rng(5)
    w0 = rng.standard_normal((20, 10)).astype(np.float32) * 0.3
    weights = {dev: frost.tensor(w0, device=dev, requires_grad=True) for dev in ("cuda", "cpu")}

    def step(inputs, targets):
        w = weights[inputs.device.type]
        w.grad = None
        loss = cross_entropy(inputs @ w, targets, ignore_index=IGNORE, reduction=reduction)
        loss.backward()
        return loss, w.grad

    jitted = frost.jit(step)
    for i in range(5):  # eager twice, capture, then replays with new inputs; the CPU generic path as reference
        xi = rng.standard_normal((32, 20)).astype(np.float32)
        ti = rng.integers(0, 10, 32).astype(np.int64)
        ti[i::4] = IGNORE
        got = [a.detach().cpu().numpy() for a in jitted(frost.tensor(xi, device="cuda"),
                                                        frost.tensor(ti, device="cuda"))]
        want = [a.detach().numpy() for a in step(frost.tensor(xi), frost.tensor(ti))]
        for a, e in zip(got, want):
            np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6, err_msg=f"call {i}")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_forward_written_gradient_is_the_backward_kernels(dtype, monkeypatch):
    """Wide rows on the GPU (a block a row, 8 logits a load in bf16): the forward's loss and gradient are the warp-a-row
    forward's and the backward kernel's up to the order of a row's sum, and an upstream gradient of 1 leaves them."""
    x, t, _ = _inputs(600, 2056, "some", seed=11)
    x = x.astype(np.float32 if dtype == "float32" else ml_dtypes.bfloat16)
    results = []
    for in_forward in (True, False):
        monkeypatch.setattr(xent, "GRADIENT_IN_FORWARD", in_forward)
        tx = frost.tensor(x, device="cuda", requires_grad=True)
        loss = cross_entropy(tx, frost.tensor(t, device="cuda"), ignore_index=IGNORE)
        loss.backward()
        results.append((loss.detach().float().cpu().numpy(), tx.grad.cpu().numpy()))
    _assert_close_to_the_backward_kernels(*results)
