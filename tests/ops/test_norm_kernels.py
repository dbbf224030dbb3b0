"""The fused GPU batch-norm kernels (+ residual add, + ReLU) against their twin, the generic CPU path."""
import numpy as np
import pytest

import frost
from frost.ops import norm


def _reference(x, w, b, res, relu, g):
    """Forward and gradients of relu(batch_norm(x) + res) through the generic (NumPy) ops and autograd."""
    tx, tw, tb = (frost.tensor(a, requires_grad=True) for a in (x, w, b))
    tr = frost.tensor(res, requires_grad=True)
    rm, rv = frost.zeros(x.shape[1]), frost.ones(x.shape[1])
    out = norm.batch_norm(tx, rm, rv, tw, tb, training=True, momentum=0.1, eps=1e-5) + tr
    out = out.relu() if relu else out
    out.backward(frost.tensor(g))
    return out.numpy(), tx.grad.numpy(), tw.grad.numpy(), tb.grad.numpy(), tr.grad.numpy(), rm.numpy(), rv.numpy()


@pytest.mark.parametrize("relu", [0, 1])
def test_simulated_kernels_match_the_generic_path(relu):
    rng = np.random.default_rng(relu)
    N, C, H, W = 2, 3, 3, 4
    x = rng.standard_normal((N, C, H, W)).astype(np.float32) * 2 + 0.5
    w, b = rng.standard_normal(C).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    res = rng.standard_normal(x.shape).astype(np.float32)
    g = rng.standard_normal(x.shape).astype(np.float32)
    total, hw, n = x.size, H * W, N * H * W
    mean, invstd = np.zeros(C, np.float32), np.zeros(C, np.float32)
    rm, rv = np.zeros(C, np.float32), np.ones(C, np.float32)
    norm.batch_norm_stats.simulate[C, 64](x, mean, invstd, rm, rv, n, hw, C, 0.1, 1e-5, 1)
    y = np.zeros_like(x)
    flags = dict(relu=relu, add_residual=1)
    norm.batch_norm_apply.simulate[(total + 63) // 64, 64](x, y, mean, invstd, w, b, res, total, hw, C, **flags)
    dw, db = np.zeros(C, np.float32), np.zeros(C, np.float32)
    norm.batch_norm_backward_reduce.simulate[C, 64](g, x, y, mean, invstd, dw, db, n, hw, C, relu=relu)
    dx, dres = np.zeros_like(x), np.zeros_like(x)
    norm.batch_norm_backward_input.simulate[(total + 63) // 64, 64](g, x, y, mean, invstd, w, dw, db, dx, dres,
                                                                   total, hw, C, n, **flags)
    ref = _reference(x, w, b, res, relu, g)
    for got, want in zip((y, dx, dw, db, dres, rm, rv), ref):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_fused_op_on_the_cpu_is_the_composition():
    rng = np.random.default_rng(0)
    x = frost.tensor(rng.standard_normal((4, 3, 2, 2)).astype(np.float32), requires_grad=True)
    r = frost.tensor(rng.standard_normal((4, 3, 2, 2)).astype(np.float32))
    out = norm.batch_norm_act(x, None, None, training=True, residual=r, relu=True)
    ref = (norm.batch_norm(x, None, None, training=True) + r).relu()
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-6)


@pytest.mark.cuda
@pytest.mark.parametrize("relu,residual", [(False, False), (True, False), (True, True)])
def test_gpu_fused_batch_norm_matches_cpu(relu, residual):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 16, 6, 6)).astype(np.float32) * 3 + 1
    w, b = rng.standard_normal(16).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    res = rng.standard_normal(x.shape).astype(np.float32)
    g = rng.standard_normal(x.shape).astype(np.float32)
    outs = {}
    for dev in ("cpu", "cuda"):
        tx, tw, tb, tr = (frost.tensor(a, device=dev, requires_grad=True) for a in (x, w, b, res))
        rm, rv = frost.zeros(16, device=dev), frost.ones(16, device=dev)
        out = norm.batch_norm_act(tx, rm, rv, tw, tb, training=True, residual=tr if residual else None, relu=relu)
        out.backward(frost.tensor(g, device=dev))
        outs[dev] = [t.cpu().numpy() for t in (out, tx.grad, tw.grad, tb.grad, rm, rv)]
    for got, want in zip(outs["cuda"], outs["cpu"]):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
