"""avg_pool_linear (frost/ops/head.py): the op against PyTorch float64 (values and gradients, both memory formats),
its errors, its kernels (frost/accel/head.py) in the simulator against NumPy float64 twins, their sm_90 compiles,
and (on a GPU) the op against the same twins."""
import ml_dtypes
import numpy as np
import pytest

import frost
from frost import dispatch
from frost.accel import head
from frost.layout import as_channels_last, empty_like_format, is_channels_last
from frost.nn import functional as F

torch = pytest.importorskip("torch")


def _torch_head(x, w, b, g):
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    tb = torch.tensor(b, requires_grad=True) if b is not None else None
    y = torch.nn.functional.linear(torch.nn.functional.adaptive_avg_pool2d(tx, 1).flatten(1), tw, tb)
    (y * torch.tensor(g)).sum().backward()
    return y.detach().numpy(), tx.grad.numpy(), tw.grad.numpy(), None if tb is None else tb.grad.numpy()


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_torch_float64(channels_last, bias):
    rng = np.random.default_rng(int(channels_last) + 2 * int(bias))
    x, w = rng.standard_normal((4, 6, 3, 5)), rng.standard_normal((7, 6))
    b = rng.standard_normal(7) if bias else None
    g = rng.standard_normal((4, 7))
    X = frost.Tensor(as_channels_last(x) if channels_last else x, requires_grad=True)
    W = frost.Tensor(w, requires_grad=True)
    B = frost.Tensor(b, requires_grad=True) if bias else None
    y = F.avg_pool_linear(X, W, B)
    (y * frost.Tensor(g)).sum().backward()
    want = _torch_head(x, w, b, g)
    assert y.dtype == frost.float64 and y.shape == (4, 7)
    for name, got, expected in zip(("y", "dx", "dw", "db"), (y, X.grad, W.grad, B), want):
        if expected is not None:
            got = got.grad if name == "db" else got
            np.testing.assert_allclose(got.detach().numpy(), expected, rtol=1e-12, atol=1e-12, err_msg=name)
    assert is_channels_last(X.grad.data) == channels_last   # dx in x's memory format


def test_half_precision_input_gives_float32_logits():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 8, 4, 4)).astype(ml_dtypes.bfloat16)
    w = rng.standard_normal((3, 8)).astype(np.float32)
    X, W = frost.Tensor(x, requires_grad=True), frost.Tensor(w, requires_grad=True)
    y = F.avg_pool_linear(X, W)
    assert y.dtype == frost.float32 and X.grad is None
    want = x.astype(np.float64).mean(axis=(2, 3)) @ w.astype(np.float64).T
    np.testing.assert_allclose(y.detach().numpy(), want, rtol=1e-6, atol=1e-6)
    y.sum().backward()
    assert X.grad.dtype == frost.bfloat16 and W.grad.dtype == frost.float32
    np.testing.assert_allclose(X.grad.numpy().astype(np.float64),
                               np.broadcast_to((w.sum(axis=0) / 16)[None, :, None, None], x.shape), rtol=2 ** -8)


def test_an_empty_batch_gives_empty_logits_and_zero_weight_gradients():
    x, w = frost.zeros((0, 6, 3, 3), requires_grad=True), frost.ones((7, 6), requires_grad=True)
    y = F.avg_pool_linear(x, w)
    assert y.shape == (0, 7)
    y.sum().backward()
    assert x.grad.shape == (0, 6, 3, 3) and np.all(w.grad.numpy() == 0)


def test_errors_name_the_op_and_the_shapes():
    x, w = frost.zeros((2, 6, 3, 3)), frost.zeros((7, 6))
    with pytest.raises(RuntimeError, match=r"avg_pool_linear: input must be a 4-D tensor .*\(2, 6\)"):
        F.avg_pool_linear(frost.zeros((2, 6)), w)
    with pytest.raises(RuntimeError, match=r"avg_pool_linear: weight of shape \(7, 5\) does not fit input of shape "
                                           r"\(2, 6, 3, 3\)"):
        F.avg_pool_linear(x, frost.zeros((7, 5)))
    with pytest.raises(RuntimeError, match=r"avg_pool_linear: bias of shape \(6,\)"):
        F.avg_pool_linear(x, w, frost.zeros(6))
    with pytest.raises(RuntimeError, match="avg_pool_linear: input and weight must be floating point"):
        F.avg_pool_linear(frost.zeros((2, 6, 3, 3), dtype=frost.int64), w)


def _twin(x, w, g):
    """The float64 twins: logits and the input gradient (in x's shape)."""
    pooled = x.astype(np.float64).mean(axis=(2, 3))
    d = (g.astype(np.float64) @ w.astype(np.float64)) / (x.shape[2] * x.shape[3])
    return pooled @ w.astype(np.float64).T, pooled, np.broadcast_to(d[:, :, None, None], x.shape)


# (N, C, H, W, out_features, threads, backward parts): fewer threads than channels and warps than outputs; more
# parts than a small image needs
KERNEL_CASES = [(4, 6, 3, 5, 7, 64, 2), (2, 200, 2, 2, 10, 64, 3), (3, 64, 8, 8, 10, 128, 4)]


@pytest.mark.parametrize("n,c,h,wd,o,threads,parts", KERNEL_CASES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("channels_last", [0, 1])
def test_simulated_kernels_match_float64_twins(n, c, h, wd, o, threads, parts, dtype, channels_last):
    rng = np.random.default_rng(n * c)
    x = rng.standard_normal((n, c, h, wd)).astype(np.float32).astype(dtype)
    x = as_channels_last(x) if channels_last else np.ascontiguousarray(x)
    w, g = rng.standard_normal((o, c)).astype(np.float32), rng.standard_normal((n, o)).astype(np.float32)
    want_y, want_pooled, want_dx = _twin(x, w, g)
    forward, backward_input = head.KERNELS[dtype]
    memory, flag = head._memory(x)
    assert flag == channels_last
    pooled, y = np.full((n, c), np.nan, np.float32), np.full((n, o), np.nan, np.float32)
    forward.simulate[n, threads](memory, w, pooled, y, c, h * wd, o, flag)
    np.testing.assert_allclose(pooled, want_pooled, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
    dx = empty_like_format(x.shape, x)
    dx[...] = np.nan
    dx_memory, _ = head._memory(dx)
    backward_input.simulate[(n, parts), threads](g, w, dx_memory, c, h * wd, o, flag)
    tol = 2 ** -8 if dtype == "bfloat16" else 1e-6   # one rounding to bf16
    np.testing.assert_allclose(dx.astype(np.float64), want_dx, rtol=tol, atol=tol * np.abs(want_dx).max())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kernels_compile_for_sm90(dtype):
    for k in head.KERNELS[dtype]:
        assert k.compile("sm_90")[:4] == b"\x7fELF"


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_gpu_op_matches_float64_twins(dtype, channels_last):
    import cupy as cp
    rng = np.random.default_rng(7)
    x = rng.standard_normal((32, 64, 8, 8)).astype(np.float32).astype(dtype)
    w, g = rng.standard_normal((10, 64)).astype(np.float32), rng.standard_normal((32, 10)).astype(np.float32)
    want_y, _, want_dx = _twin(x, w, g)
    xd = cp.asarray(x)
    X = frost.Tensor(as_channels_last(xd) if channels_last else xd, requires_grad=True)
    W = frost.Tensor(cp.asarray(w), requires_grad=True)
    assert dispatch.lookup("avg_pool_linear", X, W) is head.avg_pool_linear_kernels
    y = F.avg_pool_linear(X, W)
    assert y.dtype == frost.float32
    np.testing.assert_allclose(cp.asnumpy(y.data), want_y, rtol=1e-5, atol=1e-5)
    (y * frost.Tensor(cp.asarray(g))).sum().backward()
    tol = 2 ** -8 if dtype == "bfloat16" else 1e-6
    assert is_channels_last(X.grad.data) == channels_last and str(X.grad.data.dtype) == dtype
    np.testing.assert_allclose(cp.asnumpy(X.grad.data).astype(np.float64), want_dx, rtol=tol,
                               atol=tol * np.abs(want_dx).max())
    want_dw = g.astype(np.float64).T @ x.astype(np.float64).mean(axis=(2, 3))
    # the weight gradient is a cuDNN matmul, TF32 where frost.backends.allow_tf32 (the default on the GPU)
    np.testing.assert_allclose(cp.asnumpy(W.grad.data), want_dw, rtol=2 ** -9, atol=2 ** -9 * np.abs(want_dw).max())
