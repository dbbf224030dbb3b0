"""Tests for frost/ops/loss.py against PyTorch (float64): values and gradients for every option."""
import itertools
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import frost
from frost.ops.loss import binary_cross_entropy_with_logits, cross_entropy, l1_loss, mse_loss, nll_loss


def _rng(case) -> np.random.Generator:
    """A generator seeded from the test case (hash() of strings changes between runs; crc32 does not)."""
    return np.random.default_rng(zlib.crc32(repr(case).encode()))


def _pair(a, grad=True):
    return frost.Tensor(np.array(a, copy=True), requires_grad=grad), torch.tensor(a, requires_grad=grad)


def _close(frost_t, torch_t, tol=1e-10):
    np.testing.assert_allclose(frost_t.detach().numpy(), torch_t.detach().numpy(), rtol=tol, atol=tol)


def _backward_both(out_f, out_t, rng):
    g = rng.standard_normal(out_t.shape)
    out_f.backward(frost.Tensor(g))
    out_t.backward(torch.tensor(g))


def _class_targets(rng, shape, C, ignore_index):
    t = rng.integers(0, C, size=shape)
    if ignore_index is not None:
        t.reshape(-1)[::3] = ignore_index  # every third target is ignored
    return t


# ------------------------------------------------------------------ cross entropy, class indices

SHAPES = [(6, 5), (3, 4, 2, 3), (5,)]


@pytest.mark.parametrize("shape,use_weight,ignore_index,reduction,smoothing",
                         list(itertools.product(SHAPES, [False, True], [None, 2], ["none", "mean", "sum"],
                                                [0.0, 0.2])))
def test_cross_entropy_class_indices(shape, use_weight, ignore_index, reduction, smoothing):
    rng = _rng((shape, use_weight, ignore_index, reduction, smoothing))
    C = shape[1] if len(shape) > 1 else shape[0]
    target_shape = shape[:1] + shape[2:] if len(shape) > 1 else ()
    xf, xt = _pair(rng.standard_normal(shape) * 3)
    t = _class_targets(rng, target_shape, C, ignore_index) if target_shape else np.array(
        ignore_index if ignore_index is not None else 3)
    w = rng.uniform(0.2, 2.0, C) if use_weight else None
    kwargs = dict(ignore_index=-100 if ignore_index is None else ignore_index, reduction=reduction,
                  label_smoothing=smoothing)
    out_f = cross_entropy(xf, frost.Tensor(t), None if w is None else frost.Tensor(w), **kwargs)
    out_t = F.cross_entropy(xt, torch.tensor(t), None if w is None else torch.tensor(w), **kwargs)
    assert out_f.shape == tuple(out_t.shape) and isinstance(out_f.data, np.ndarray)
    _close(out_f, out_t)  # an unbatched, ignored target: mean over nothing is NaN, its gradient as torch's
    _backward_both(out_f, out_t, rng)
    _close(xf.grad, xt.grad)


def test_cross_entropy_all_ignored_mean_is_nan_with_zero_gradient():
    xf, xt = _pair(np.random.default_rng(0).standard_normal((3, 4)))
    t = np.array([-100, -100, -100])
    out_f, out_t = cross_entropy(xf, frost.Tensor(t)), F.cross_entropy(xt, torch.tensor(t))
    assert np.isnan(out_f.item()) and torch.isnan(out_t)
    out_f.backward()
    out_t.backward()
    _close(xf.grad, xt.grad)
    assert (xf.grad.numpy() == 0).all()


def test_cross_entropy_int32_targets_and_large_logits_are_stable():
    x = np.array([[1000.0, -1000.0, 0.0], [-500.0, 500.0, 499.0]])
    t = np.array([1, 2], dtype=np.int32)
    xf, xt = _pair(x)
    out_f = cross_entropy(xf, frost.Tensor(t))
    out_t = F.cross_entropy(xt, torch.tensor(t, dtype=torch.int64))
    _close(out_f, out_t)
    out_f.backward()
    out_t.backward()
    _close(xf.grad, xt.grad)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_cross_entropy_low_precision_keeps_dtype(dtype):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((16, 10)) * 4
    t = rng.integers(0, 10, 16)
    xf = frost.tensor(x, dtype=dtype, requires_grad=True)
    out = cross_entropy(xf, frost.Tensor(t), label_smoothing=0.1)
    assert out.dtype.name == dtype
    xt = torch.tensor(xf.detach().numpy().astype(np.float64), requires_grad=True)
    ref = F.cross_entropy(xt, torch.tensor(t), label_smoothing=0.1)
    eps = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11, "float32": 2.0 ** -24}[dtype]  # one rounding to the dtype
    np.testing.assert_allclose(float(out.item()), ref.item(), rtol=2 * eps)
    out.backward()
    ref.backward()
    assert xf.grad.dtype.name == dtype
    want = xt.grad.numpy()
    np.testing.assert_allclose(xf.grad.numpy().astype(np.float64), want, rtol=2 * eps, atol=2 * eps * abs(want).max())


# ------------------------------------------------------------------ cross entropy, probability targets

@pytest.mark.parametrize("shape,use_weight,reduction,smoothing",
                         list(itertools.product([(6, 5), (2, 4, 3), (5,)], [False, True], ["none", "mean", "sum"],
                                                [0.0, 0.3])))
def test_cross_entropy_probability_targets(shape, use_weight, reduction, smoothing):
    rng = _rng((shape, use_weight, reduction, smoothing))
    C = shape[1] if len(shape) > 1 else shape[0]
    xf, xt = _pair(rng.standard_normal(shape) * 2)
    probs = torch.softmax(torch.tensor(rng.standard_normal(shape)), dim=1 if len(shape) > 1 else 0).numpy()
    tf, tt = _pair(probs)
    w = rng.uniform(0.2, 2.0, C) if use_weight else None
    out_f = cross_entropy(xf, tf, None if w is None else frost.Tensor(w), reduction=reduction,
                          label_smoothing=smoothing)
    out_t = F.cross_entropy(xt, tt, None if w is None else torch.tensor(w), reduction=reduction,
                            label_smoothing=smoothing)
    _close(out_f, out_t)
    _backward_both(out_f, out_t, rng)
    _close(xf.grad, xt.grad)
    _close(tf.grad, tt.grad)


# ------------------------------------------------------------------ NLL

@pytest.mark.parametrize("shape,use_weight,ignore_index,reduction",
                         list(itertools.product([(6, 5), (3, 4, 2, 3)], [False, True], [None, 1],
                                                ["none", "mean", "sum"])))
def test_nll_loss(shape, use_weight, ignore_index, reduction):
    rng = _rng((shape, use_weight, ignore_index, reduction))
    C = shape[1]
    logp = torch.log_softmax(torch.tensor(rng.standard_normal(shape)), 1).numpy()
    xf, xt = _pair(logp)
    t = _class_targets(rng, shape[:1] + shape[2:], C, ignore_index)
    w = rng.uniform(0.2, 2.0, C) if use_weight else None
    kwargs = dict(ignore_index=-100 if ignore_index is None else ignore_index, reduction=reduction)
    out_f = nll_loss(xf, frost.Tensor(t), None if w is None else frost.Tensor(w), **kwargs)
    out_t = F.nll_loss(xt, torch.tensor(t), None if w is None else torch.tensor(w), **kwargs)
    _close(out_f, out_t)
    _backward_both(out_f, out_t, rng)
    _close(xf.grad, xt.grad)


def test_cross_entropy_equals_nll_of_log_softmax():
    rng = np.random.default_rng(2)
    x = frost.Tensor(rng.standard_normal((4, 6)))
    t = frost.Tensor(rng.integers(0, 6, 4))
    a = cross_entropy(x, t).item()
    b = nll_loss(frost.log_softmax(x, 1), t).item()
    assert abs(a - b) < 1e-12


# ------------------------------------------------------------------ errors

def test_cross_entropy_errors():
    x = frost.randn(3, 4)
    with pytest.raises(RuntimeError, match=r"cross_entropy: class-index target must have an integer dtype, "
                                           r"got float32 \(input of shape \(3, 4\), target of shape \(3,\)\)"):
        cross_entropy(x, frost.tensor([0.0, 1.0, 2.0]))
    with pytest.raises(RuntimeError, match=r"cross_entropy: target of shape \(2,\) does not fit input of shape "
                                           r"\(3, 4\) \(expected target of shape \(3,\)\)"):
        cross_entropy(x, frost.tensor([0, 1]))
    with pytest.raises(IndexError, match=r"cross_entropy: target index 7 is out of range for 4 classes.*"
                                         r"input of shape \(3, 4\), target of shape \(3,\)"):
        cross_entropy(x, frost.tensor([0, 7, 1]))
    with pytest.raises(IndexError, match=r"cross_entropy: target index -1 is out of range"):
        cross_entropy(x, frost.tensor([0, -1, 1]))
    with pytest.raises(IndexError, match=r"nll_loss: target index 4 is out of range for 4 classes"):
        nll_loss(x, frost.tensor([0, 4, 1]))
    with pytest.raises(RuntimeError, match=r"cross_entropy: weight of shape \(3,\) does not fit input of shape "
                                           r"\(3, 4\) with 4 classes"):
        cross_entropy(x, frost.tensor([0, 1, 2]), weight=frost.ones(3))
    with pytest.raises(ValueError, match=r"cross_entropy: reduction must be one of"):
        cross_entropy(x, frost.tensor([0, 1, 2]), reduction="avg")
    with pytest.raises(ValueError, match=r"cross_entropy: label_smoothing must be between"):
        cross_entropy(x, frost.tensor([0, 1, 2]), label_smoothing=1.5)
    # an ignored target may be out of range
    assert np.isfinite(cross_entropy(x, frost.tensor([0, -100, 1])).item())


# ------------------------------------------------------------------ MSE and L1

@pytest.mark.parametrize("op,ref", [(mse_loss, F.mse_loss), (l1_loss, F.l1_loss)])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("shape", [(7,), (3, 4, 5), ()])
def test_regression_losses(op, ref, reduction, shape):
    rng = np.random.default_rng(len(shape))
    xf, xt = _pair(rng.standard_normal(shape))
    tf, tt = _pair(rng.standard_normal(shape))
    out_f, out_t = op(xf, tf, reduction=reduction), ref(xt, tt, reduction=reduction)
    assert isinstance(out_f.data, np.ndarray)
    _close(out_f, out_t)
    _backward_both(out_f, out_t, rng)
    _close(xf.grad, xt.grad)
    _close(tf.grad, tt.grad)


def test_mse_loss_broadcast_warns_and_matches_torch():
    rng = np.random.default_rng(3)
    xf, xt = _pair(rng.standard_normal((4, 3)))
    tf, tt = _pair(rng.standard_normal((3,)))
    with pytest.warns(UserWarning, match="mse_loss"):
        out_f = mse_loss(xf, tf)
    with pytest.warns(UserWarning):
        out_t = F.mse_loss(xt, tt)
    _close(out_f, out_t)
    out_f.backward()
    out_t.backward()
    _close(xf.grad, xt.grad)
    _close(tf.grad, tt.grad)


def test_mse_loss_errors():
    with pytest.raises(RuntimeError, match=r"mse_loss: input of shape \(4, 3\) and target of shape \(2,\) cannot "
                                           r"be broadcast"):
        mse_loss(frost.randn(4, 3), frost.randn(2))


def test_mse_loss_float32_keeps_dtype():
    out = mse_loss(frost.randn(5, requires_grad=True), frost.randn(5))
    assert out.dtype == frost.float32


# ------------------------------------------------------------------ BCE with logits

@pytest.mark.parametrize("use_weight,use_pos_weight,reduction",
                         list(itertools.product([False, True], [False, True], ["none", "mean", "sum"])))
def test_bce_with_logits(use_weight, use_pos_weight, reduction):
    rng = np.random.default_rng(use_weight * 4 + use_pos_weight * 2 + len(reduction))
    shape = (5, 3)
    x = rng.standard_normal(shape) * 4
    x[0] = [60.0, -60.0, 0.0]  # exp(60) would overflow float32; the stable form must not care
    xf, xt = _pair(x)
    tf, tt = _pair(rng.uniform(0, 1, shape))
    wf, wt = _pair(rng.uniform(0.5, 2, (3,))) if use_weight else (None, None)
    pf, pt = _pair(rng.uniform(0.5, 3, (3,)), grad=False) if use_pos_weight else (None, None)
    out_f = binary_cross_entropy_with_logits(xf, tf, wf, reduction=reduction, pos_weight=pf)
    out_t = F.binary_cross_entropy_with_logits(xt, tt, None if wt is None else wt.detach(), reduction=reduction,
                                               pos_weight=pt)
    _close(out_f, out_t)
    if use_weight:
        # PyTorch does not differentiate with respect to weight; frost does: compare with the same loss spelled
        # out as (unweighted loss * weight), reduced
        per_element = F.binary_cross_entropy_with_logits(xt, tt, reduction="none", pos_weight=pt) * wt
        out_t = {"none": per_element, "mean": per_element.mean(), "sum": per_element.sum()}[reduction]
        _close(out_f, out_t)
    _backward_both(out_f, out_t, rng)
    _close(xf.grad, xt.grad)
    _close(tf.grad, tt.grad)
    if use_weight:
        _close(wf.grad, wt.grad)


def test_bce_with_logits_extreme_float32_is_finite():
    x = frost.tensor([[100.0, -100.0, 1e4, -1e4]], requires_grad=True)
    t = frost.tensor([[0.0, 1.0, 1.0, 0.0]])
    out = binary_cross_entropy_with_logits(x, t, reduction="none")
    ref = F.binary_cross_entropy_with_logits(torch.tensor([[100.0, -100.0, 1e4, -1e4]]),
                                             torch.tensor([[0.0, 1.0, 1.0, 0.0]]), reduction="none")
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=1e-6)
    out.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [[1.0, -1.0, 0.0, 0.0]], atol=1e-6)


def test_bce_with_logits_errors():
    with pytest.raises(ValueError, match=r"binary_cross_entropy_with_logits: target size \(3,\) must be the same "
                                         r"as input size \(2, 3\)"):
        binary_cross_entropy_with_logits(frost.randn(2, 3), frost.rand(3))
    with pytest.raises(RuntimeError, match=r"binary_cross_entropy_with_logits: pos_weight of shape \(2,\) cannot "
                                           r"be broadcast to input of shape \(2, 3\)"):
        binary_cross_entropy_with_logits(frost.randn(2, 3), frost.rand(2, 3), pos_weight=frost.ones(2))
    with pytest.raises(RuntimeError, match=r"binary_cross_entropy_with_logits: not differentiable with respect "
                                           r"to pos_weight"):
        binary_cross_entropy_with_logits(frost.randn(2, 3), frost.rand(2, 3),
                                         pos_weight=frost.ones(3, requires_grad=True))


# ------------------------------------------------------------------ CUDA (CuPy runs the same array code)

@pytest.mark.cuda
@pytest.mark.parametrize("case", ["ce_index", "ce_probs", "nll", "mse", "l1", "bce"])
def test_losses_cuda_match_cpu(case):
    rng = np.random.default_rng(10)
    x = rng.standard_normal((4, 5, 3)).astype(np.float32)
    t_index = rng.integers(0, 5, (4, 3))
    t_index[0, 0] = -100
    t_float = rng.uniform(0, 1, x.shape).astype(np.float32)
    w = rng.uniform(0.5, 2, 5).astype(np.float32)
    results = []
    for device in ("cpu", "cuda"):
        fx = frost.tensor(x, device=device, requires_grad=True)
        fw = frost.tensor(w, device=device)
        ti, tf = frost.tensor(t_index, device=device), frost.tensor(t_float, device=device)
        out = {"ce_index": lambda: cross_entropy(fx, ti, fw, label_smoothing=0.1),
               "ce_probs": lambda: cross_entropy(fx, tf, fw, label_smoothing=0.1),
               "nll": lambda: nll_loss(fx, ti, fw, reduction="sum"),
               "mse": lambda: mse_loss(fx, tf),
               "l1": lambda: l1_loss(fx, tf, reduction="sum"),
               "bce": lambda: binary_cross_entropy_with_logits(fx, tf, pos_weight=frost.tensor(
                   np.full(3, 2.0, np.float32), device=device))}[case]()
        out.backward()
        results.append([t.detach().cpu().numpy() for t in (out, fx.grad)])
    for cpu_r, gpu_r in zip(*results):
        np.testing.assert_allclose(gpu_r, cpu_r, rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
def test_cross_entropy_cuda_out_of_range_target_is_reported():
    x = frost.randn(3, 4, device="cuda")
    with pytest.raises(IndexError, match=r"cross_entropy: target index 9 is out of range for 4 classes"):
        cross_entropy(x, frost.tensor([0, 9, 1], device="cuda"))
