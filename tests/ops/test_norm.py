"""Tests for frost/ops/norm.py: batch, layer and RMS norm against PyTorch (float64), values and gradients."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import frost
from frost.ops.norm import batch_norm, batch_norm_act, layer_norm, rms_norm


def _pair(rng, shape, scale=1.0, shift=0.0):
    a = rng.standard_normal(shape) * scale + shift
    return frost.Tensor(a.copy(), requires_grad=True), torch.tensor(a, requires_grad=True)


def _opt_pair(rng, shape, present, shift=0.0):
    return _pair(rng, shape, 0.5, shift) if present else (None, None)


def _close(frost_t, torch_t, tol=1e-10):
    np.testing.assert_allclose(frost_t.detach().numpy(), torch_t.detach().numpy(), rtol=tol, atol=tol)


def _backward_both(out_f, out_t, rng):
    g = rng.standard_normal(out_t.shape)
    out_f.backward(frost.Tensor(g))
    out_t.backward(torch.tensor(g))


# ------------------------------------------------------------------ batch norm

@pytest.mark.parametrize("shape", [(8, 3), (4, 3, 7), (2, 3, 5, 4), (2, 3, 2, 2, 3)])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_matches_torch(shape, affine, training):
    rng = np.random.default_rng(len(shape) * 10 + affine * 2 + training)
    C = shape[1]
    xf, xt = _pair(rng, shape, scale=2.0, shift=1.5)
    wf, wt = _opt_pair(rng, (C,), affine, shift=1.0)
    bf, bt = _opt_pair(rng, (C,), affine)
    rm0, rv0 = rng.standard_normal(C), rng.uniform(0.5, 2.0, C)
    rmf, rvf = frost.Tensor(rm0.copy()), frost.Tensor(rv0.copy())
    rmt, rvt = torch.tensor(rm0), torch.tensor(rv0)
    out_f = batch_norm(xf, rmf, rvf, wf, bf, training=training, momentum=0.2, eps=1e-4)
    out_t = F.batch_norm(xt, rmt, rvt, wt, bt, training=training, momentum=0.2, eps=1e-4)
    _close(out_f, out_t)
    _close(rmf, rmt)
    _close(rvf, rvt)
    _backward_both(out_f, out_t, rng)
    _close(xf.grad, xt.grad, 1e-9)
    if affine:
        _close(wf.grad, wt.grad, 1e-9)
        _close(bf.grad, bt.grad, 1e-9)


def test_batch_norm_running_stats_over_several_calls_then_eval():
    rng = np.random.default_rng(0)
    C = 4
    rmf, rvf = frost.zeros(C, dtype="float64"), frost.ones(C, dtype="float64")
    rmt, rvt = torch.zeros(C, dtype=torch.float64), torch.ones(C, dtype=torch.float64)
    w, b = rng.standard_normal(C), rng.standard_normal(C)
    for step in range(4):
        x = rng.standard_normal((6, C, 3, 3)) * (step + 1) + step
        out_f = batch_norm(frost.Tensor(x), rmf, rvf, frost.Tensor(w), frost.Tensor(b), training=True)
        out_t = F.batch_norm(torch.tensor(x), rmt, rvt, torch.tensor(w), torch.tensor(b), training=True)
        _close(out_f, out_t)
        _close(rmf, rmt)
        _close(rvf, rvt)
    assert not np.allclose(rvf.numpy(), 1.0)  # the buffers really moved
    xf, xt = _pair(rng, (5, C, 2, 2))
    out_f = batch_norm(xf, rmf, rvf, frost.Tensor(w), frost.Tensor(b), training=False)
    out_t = F.batch_norm(xt, rmt, rvt, torch.tensor(w), torch.tensor(b), training=False)
    _close(out_f, out_t)
    _close(rmf, rmt)  # eval leaves the running stats alone
    _backward_both(out_f, out_t, rng)
    _close(xf.grad, xt.grad)


def test_batch_norm_without_running_stats_in_training():
    rng = np.random.default_rng(1)
    xf, xt = _pair(rng, (5, 3, 4))
    out_f = batch_norm(xf, None, None, training=True)
    out_t = F.batch_norm(xt, None, None, training=True)
    _close(out_f, out_t)
    _backward_both(out_f, out_t, rng)
    _close(xf.grad, xt.grad)


def test_batch_norm_float32_buffers_and_float32_input():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((16, 3, 4)).astype(np.float32)
    rmf, rvf = frost.zeros(3), frost.ones(3)
    rmt, rvt = torch.zeros(3), torch.ones(3)
    out_f = batch_norm(frost.Tensor(x), rmf, rvf, training=True)
    out_t = F.batch_norm(torch.tensor(x), rmt, rvt, training=True)
    assert out_f.dtype == frost.float32 and rmf.dtype == frost.float32
    np.testing.assert_allclose(out_f.numpy(), out_t.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rvf.numpy(), rvt.numpy(), rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_batch_norm_half_precision_keeps_float32_statistics(dtype):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((32, 4, 8)) * 3 + 100  # a large mean: float16 variance would lose it
    xf = frost.tensor(x, dtype=dtype, requires_grad=True)
    rm, rv = frost.zeros(4), frost.ones(4)
    out = batch_norm(xf, rm, rv, frost.ones(4, dtype=dtype), frost.zeros(4, dtype=dtype), training=True)
    assert out.dtype.name == dtype
    x_rounded = xf.detach().numpy().astype(np.float64)
    ref = F.batch_norm(torch.tensor(x_rounded), None, None, training=True).numpy()
    np.testing.assert_allclose(out.detach().numpy().astype(np.float64), ref, atol=0.05)
    np.testing.assert_allclose(rm.numpy(), 0.1 * x_rounded.mean(axis=(0, 2)), rtol=1e-4)
    np.testing.assert_allclose(rv.numpy(), 0.9 + 0.1 * x_rounded.var(axis=(0, 2), ddof=1), rtol=1e-4)
    g = rng.standard_normal(x.shape)  # a random upstream gradient: sum()'s would give BN's input almost nothing
    out.backward(frost.tensor(g, dtype=dtype))
    assert xf.grad.dtype.name == dtype
    xt = torch.tensor(x_rounded, requires_grad=True)
    F.batch_norm(xt, None, None, training=True).backward(torch.tensor(frost.tensor(g, dtype=dtype).numpy()
                                                                       .astype(np.float64)))
    want = xt.grad.numpy()
    eps = 2.0 ** -8 if dtype == "bfloat16" else 2.0 ** -11  # the gradient is rounded once to the dtype
    np.testing.assert_allclose(xf.grad.numpy().astype(np.float64), want, rtol=2 * eps, atol=2 * eps * abs(want).max())


def test_batch_norm_errors():
    x = frost.randn(4, 3, 5)
    with pytest.raises(ValueError, match=r"batch_norm: expected more than 1 value per channel.*\(1, 3\)"):
        batch_norm(frost.randn(1, 3), None, None, training=True)
    with pytest.raises(RuntimeError, match=r"batch_norm: weight of shape \(4,\) does not fit input of shape "
                                           r"\(4, 3, 5\).*\(3,\)"):
        batch_norm(x, None, None, frost.ones(4), training=True)
    with pytest.raises(RuntimeError, match=r"batch_norm: running_mean and running_var must be given"):
        batch_norm(x, None, None, training=False)
    with pytest.raises(RuntimeError, match=r"batch_norm: .*at least 2 dims, got \(5,\)"):
        batch_norm(frost.randn(5), None, None, training=True)
    with pytest.raises(RuntimeError, match=r"batch_norm: running_var of shape \(2,\)"):
        batch_norm(x, frost.zeros(3), frost.ones(2), training=True)


@pytest.mark.parametrize("shape", [(0, 3, 4, 4), (2, 3, 0, 4), (0, 3)])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_on_empty_input_matches_torch(shape, training):
    # training used to refuse an empty batch ("more than 1 value per channel"); PyTorch returns it empty, leaves
    # the running statistics alone and gives weight and bias zero gradients
    rng = np.random.default_rng(5)
    xf, xt = _pair(rng, shape)
    (wf, wt), (bf, bt) = _pair(rng, (3,)), _pair(rng, (3,))
    rm0, rv0 = rng.standard_normal(3), rng.uniform(0.5, 2.0, 3)
    rmf, rvf, rmt, rvt = frost.Tensor(rm0.copy()), frost.Tensor(rv0.copy()), torch.tensor(rm0), torch.tensor(rv0)
    out_f = batch_norm(xf, rmf, rvf, wf, bf, training=training, momentum=0.2)
    out_t = F.batch_norm(xt, rmt, rvt, wt, bt, training=training, momentum=0.2)
    assert out_f.shape == tuple(out_t.shape) == shape
    for f, t in ((rmf, rmt), (rvf, rvt)):
        np.testing.assert_array_equal(f.numpy(), t.numpy())
    _backward_both(out_f, out_t, rng)
    for f, t in ((xf, xt), (wf, wt), (bf, bt)):
        assert f.grad.shape == tuple(t.grad.shape)
        _close(f.grad, t.grad)


@pytest.mark.parametrize("relu", [False, True])
def test_batch_norm_act_on_empty_batch_counts_it_and_returns_empty(relu):
    x, residual = frost.randn(0, 3, 4, 4), frost.randn(0, 3, 4, 4)
    running_mean, running_var, batches = frost.zeros(3), frost.ones(3), frost.tensor(4, dtype="int64")
    out = batch_norm_act(x, running_mean, running_var, frost.ones(3), frost.zeros(3), training=True,
                         residual=residual, relu=relu, num_batches_tracked=batches)
    assert out.shape == (0, 3, 4, 4)
    assert batches.item() == 5
    np.testing.assert_array_equal(running_mean.numpy(), 0)
    np.testing.assert_array_equal(running_var.numpy(), 1)


@pytest.mark.parametrize("shape", [(1, 3), (1, 3, 1, 1), (1, 0)])
def test_batch_norm_one_value_per_channel_still_raises_like_torch(shape):
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        F.batch_norm(torch.zeros(shape), None, None, training=True)
    with pytest.raises(ValueError, match=r"batch_norm: expected more than 1 value per channel when training, got "
                                         r"input of shape .*; use a batch of at least 2 or evaluation mode"):
        batch_norm(frost.zeros(*shape), None, None, training=True)


# ------------------------------------------------------------------ layer norm

@pytest.mark.parametrize("shape,normalized", [((6, 10), 10), ((2, 5, 8), (8,)), ((2, 3, 4, 5), (4, 5)),
                                              ((7,), (7,)), ((2, 3, 4), (2, 3, 4))])
@pytest.mark.parametrize("with_weight,with_bias", [(True, True), (True, False), (False, False)])
def test_layer_norm_matches_torch(shape, normalized, with_weight, with_bias):
    rng = np.random.default_rng(len(shape) + 3 * with_weight + 7 * with_bias)
    nshape = (normalized,) if isinstance(normalized, int) else normalized
    xf, xt = _pair(rng, shape, scale=3.0, shift=-2.0)
    wf, wt = _opt_pair(rng, nshape, with_weight, shift=1.0)
    bf, bt = _opt_pair(rng, nshape, with_bias)
    out_f = layer_norm(xf, normalized, wf, bf, eps=1e-6)
    out_t = F.layer_norm(xt, nshape, wt, bt, eps=1e-6)
    _close(out_f, out_t)
    _backward_both(out_f, out_t, rng)
    _close(xf.grad, xt.grad, 1e-9)
    if with_weight:
        _close(wf.grad, wt.grad, 1e-9)
    if with_bias:
        _close(bf.grad, bt.grad, 1e-9)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_layer_norm_low_precision(dtype):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 64)) * 2 + 50
    xf = frost.tensor(x, dtype=dtype, requires_grad=True)
    out = layer_norm(xf, 64, frost.ones(64, dtype=dtype), frost.zeros(64, dtype=dtype))
    assert out.dtype.name == dtype
    ref = F.layer_norm(torch.tensor(xf.detach().numpy().astype(np.float64)), (64,)).detach().numpy()
    np.testing.assert_allclose(out.detach().numpy().astype(np.float64), ref, atol=0.03 if dtype != "float32" else 1e-4)
    out.backward(frost.ones_like(out))
    assert xf.grad.dtype.name == dtype


def test_layer_norm_errors():
    with pytest.raises(RuntimeError, match=r"layer_norm: normalized_shape \(4,\) does not match the last dims "
                                           r"of input of shape \(2, 3\)"):
        layer_norm(frost.randn(2, 3), 4)
    with pytest.raises(RuntimeError, match=r"layer_norm: weight of shape \(4,\) does not fit input of shape "
                                           r"\(2, 3\)"):
        layer_norm(frost.randn(2, 3), 3, frost.ones(4))


# ------------------------------------------------------------------ RMS norm

@pytest.mark.parametrize("shape,normalized", [((6, 10), 10), ((2, 5, 8), (8,)), ((2, 3, 4, 5), (4, 5))])
@pytest.mark.parametrize("with_weight", [True, False])
@pytest.mark.parametrize("eps", [None, 1e-3])
def test_rms_norm_matches_torch(shape, normalized, with_weight, eps):
    rng = np.random.default_rng(len(shape) + 5 * with_weight)
    nshape = (normalized,) if isinstance(normalized, int) else normalized
    xf, xt = _pair(rng, shape, scale=2.0, shift=0.5)
    wf, wt = _opt_pair(rng, nshape, with_weight, shift=1.0)
    out_f = rms_norm(xf, normalized, wf, eps=eps)
    out_t = F.rms_norm(xt, nshape, wt, eps=eps)
    _close(out_f, out_t)
    _backward_both(out_f, out_t, rng)
    _close(xf.grad, xt.grad, 1e-9)
    if with_weight:
        _close(wf.grad, wt.grad, 1e-9)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_rms_norm_default_eps_for_half_precision_is_float32_eps(dtype):
    # PyTorch uses the epsilon of the compute type (float32), not of the half type: tiny inputs show the difference
    x = np.full((2, 4), 1e-4)
    out = rms_norm(frost.tensor(x, dtype=dtype), 4)
    ref = F.rms_norm(torch.tensor(x, dtype=getattr(torch, dtype)), (4,))
    np.testing.assert_allclose(out.numpy().astype(np.float32), ref.float().numpy(), rtol=1e-2)


def test_rms_norm_errors():
    with pytest.raises(RuntimeError, match=r"rms_norm: normalized_shape \(3, 4\) does not match"):
        rms_norm(frost.randn(2, 4, 3), (3, 4))
    with pytest.raises(TypeError, match=r"rms_norm: needs a floating-point input"):
        rms_norm(frost.tensor([[1, 2]]), 2)


# ------------------------------------------------------------------ CUDA (CuPy runs the same array code)

@pytest.mark.cuda
@pytest.mark.parametrize("case", ["batch_norm_train", "batch_norm_eval", "layer_norm", "rms_norm"])
def test_norm_cuda_matches_cpu(case):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((4, 3, 5, 6)).astype(np.float32)
    g = rng.standard_normal(x.shape).astype(np.float32)
    results = []
    for device in ("cpu", "cuda"):
        fx = frost.tensor(x, device=device, requires_grad=True)
        C = 3 if case.startswith("batch") else 6
        w = frost.tensor(np.linspace(0.5, 1.5, C, dtype=np.float32), device=device, requires_grad=True)
        rm = frost.tensor(np.full(3, 0.2, np.float32), device=device)
        rv = frost.tensor(np.full(3, 1.5, np.float32), device=device)
        if case.startswith("batch"):
            out = batch_norm(fx, rm, rv, w, None, training=case.endswith("train"))
        elif case == "layer_norm":
            out = layer_norm(fx, 6, w)
        else:
            out = rms_norm(fx, 6, w)
        out.backward(frost.tensor(g, device=device))
        results.append([t.detach().cpu().numpy() for t in (out, fx.grad, w.grad, rm, rv)])
    for cpu_r, gpu_r in zip(*results):
        np.testing.assert_allclose(gpu_r, cpu_r, rtol=1e-4, atol=1e-4)
