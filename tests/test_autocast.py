"""frost.autocast: which inputs are cast, the per-region casts of flat parameter buffers, and their gradients."""
import sys

import ml_dtypes
import numpy as np
import pytest

import frost
import frost.nn as nn
import frost.nn.functional as F
import frost.autocast
from frost.ops.autocast_inputs import cast_inputs
ac = sys.modules["frost.autocast"]


def test_region_state_is_restored_when_regions_nest():
    assert ac.current() is None
    with frost.autocast(frost.bfloat16):
        outer = ac._state.casts
        with frost.autocast(frost.bfloat16, enabled=False):
            assert ac.current() is None and ac._state.casts is not outer
        assert ac.current() == frost.bfloat16 and ac._state.casts is outer
    assert ac.current() is None


def test_cpu_weights_are_cast_one_by_one_with_gradients_in_float32():
    w = frost.tensor(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32), requires_grad=True)
    x = frost.tensor(np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32))
    k = frost.tensor(np.arange(12, dtype=np.float32).reshape(4, 3))
    with frost.autocast(frost.bfloat16):
        (xc, wc) = cast_inputs(x, w)
    assert xc.dtype == wc.dtype == frost.bfloat16 and not ac._state.casts  # no flat buffers on the CPU
    np.testing.assert_array_equal(wc.detach().numpy(), w.detach().numpy().astype(ml_dtypes.bfloat16))
    (wc.to(frost.float32) * k).sum().backward()
    assert w.grad.dtype == frost.float32
    np.testing.assert_array_equal(w.grad.numpy(), k.numpy())


def _cuda_model():
    frost.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                         nn.Linear(8 * 6 * 6, 5, bias=False)).to("cuda", memory_format=frost.channels_last)


@pytest.mark.cuda
def test_flat_parameters_are_cast_with_their_whole_buffer_once_per_region():
    import cupy as cp
    from frost.optim.flat import cast_in_one
    model = _cuda_model()
    opt = frost.optim.AdamW(model.parameters(), lr=1e-3)
    x = frost.randn(4, 3, 6, 6, device="cuda").contiguous(frost.channels_last)
    F.cross_entropy(model(x), frost.tensor([0, 1, 2, 3], device="cuda")).backward()
    opt.step()  # the group is flat now: parameters are views of one buffer
    casts = {}
    for p in model.parameters():
        view = cast_in_one(p.data, ml_dtypes.bfloat16, casts)
        assert view is not None and view.shape == p.data.shape
        assert view.strides == tuple(s // 2 for s in p.data.strides)  # channels-last weights stay so
        np.testing.assert_array_equal(cp.asnumpy(view).view(np.uint16),
                                      cp.asnumpy(p.data.astype(ml_dtypes.bfloat16)).view(np.uint16))
    assert len(casts) == 1
    assert cast_in_one(cp.zeros(3, cp.float32), ml_dtypes.bfloat16, casts) is None  # not in a flat buffer


@pytest.mark.cuda
def test_training_under_autocast_equals_casting_each_weight(monkeypatch):
    """Ten AdamW steps under autocast with the whole-buffer casts and with one cast per weight: same losses and
    weights, bit for bit (the same bf16 values reach the same kernels)."""
    runs = []
    for whole in (True, False):
        if not whole:
            monkeypatch.setattr(ac, "_weight_cast", None)  # no whole-buffer casts registered
        model = _cuda_model()
        opt = frost.optim.AdamW(model.parameters(), lr=1e-2)
        rng = np.random.default_rng(3)
        losses = []
        for _ in range(10):
            x = frost.tensor(rng.standard_normal((4, 3, 6, 6)).astype(np.float32), device="cuda")
            y = frost.tensor(rng.integers(0, 5, 4), device="cuda")
            opt.zero_grad()
            with frost.autocast(frost.bfloat16):
                loss = F.cross_entropy(model(x.contiguous(frost.channels_last)), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        runs.append((losses, [p.detach().cpu().numpy() for p in model.parameters()]))
    assert runs[0][0] == runs[1][0]
    for a, b in zip(runs[0][1], runs[1][1]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("zeroed", [False, True])
@pytest.mark.parametrize("ours", [True, False])
def test_conv_weight_gradient_under_autocast_is_float32_in_the_master_grad(zeroed, ours, monkeypatch):
    """bf16 operands, float32 dW written straight into the float32 weight's .grad (its zeroed buffer when there is
    one): with our kernel (float32 sums of the bf16 values), or cuDNN's bf16 dW widened (the choice per shape is
    timed; both are forced here)."""
    import torch
    from frost.accel import conv_wgrad
    monkeypatch.setattr(conv_wgrad, "choose", lambda *args: ours)
    ran, kernel = [], conv_wgrad.conv2d_backward_weight_gpu
    monkeypatch.setattr(conv_wgrad, "conv2d_backward_weight_gpu", lambda *a, **k: ran.append(1) or kernel(*a, **k))
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 8, 10, 10)).astype(np.float32)
    w0 = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    k = rng.standard_normal((4, 16, 10, 10)).astype(np.float32)
    w = frost.tensor(w0, device="cuda", requires_grad=True)
    w.data = frost.Tensor(w.data).contiguous(frost.channels_last).data
    xt = frost.tensor(x, device="cuda").contiguous(frost.channels_last)
    kt = frost.tensor(k, device="cuda").contiguous(frost.channels_last)  # dy then arrives channels-last, as x
    opt = frost.optim.SGD([w], lr=0.0)
    for _ in range(1 + zeroed):  # the second round finds a zeroed .grad to write into
        opt.zero_grad(set_to_none=not zeroed)
        before = None if w.grad is None else w.grad.data
        with frost.autocast(frost.bfloat16):
            y = F.conv2d(xt, w, padding=1)
        (y.to(frost.float32) * kt).sum().backward()
    assert w.grad.dtype == frost.float32 and len(ran) == (1 + zeroed) * ours
    if zeroed:
        assert w.grad.data is before  # written in place, no new array
    def bf(a):
        return torch.tensor(a.astype(ml_dtypes.bfloat16).astype(np.float64))
    tw = bf(w0).requires_grad_()
    torch.nn.functional.conv2d(bf(x), tw, padding=1).backward(bf(k))
    got = w.grad.cpu().numpy()
    if ours:
        np.testing.assert_allclose(got, tw.grad.numpy(), rtol=2e-4, atol=2e-3)
    else:  # cuDNN's dW is rounded to bf16 (8 bits of mantissa) before it is widened
        np.testing.assert_array_equal(got, got.astype(ml_dtypes.bfloat16).astype(np.float32))
        np.testing.assert_allclose(got, tw.grad.numpy(), rtol=8e-3, atol=2e-2)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("zeroed", [False, True])
def test_linear_gradients_under_autocast_are_float32_sums_in_the_master_grads(device, zeroed):
    """bf16 operands; the weight's and bias's gradients summed in float32 and written unrounded into the float32
    leaves' .grad (their zeroed buffers when there are: no new array), as float64 sums of the same bf16 values."""
    import torch
    rng = np.random.default_rng(5)
    x, k = rng.standard_normal((3, 7, 48)).astype(np.float32), rng.standard_normal((3, 7, 24)).astype(np.float32)
    layer = nn.Linear(48, 24).to(device)
    opt = frost.optim.SGD(layer.parameters(), lr=0.0)
    for _ in range(1 + zeroed):  # the second round finds zeroed buffers to write into
        opt.zero_grad(set_to_none=not zeroed)
        before = [None if p.grad is None else p.grad.data for p in layer.parameters()]
        with frost.autocast(frost.bfloat16):
            y = layer(frost.tensor(x, device=device))
        (y.to(frost.float32) * frost.tensor(k, device=device)).sum().backward()
    if zeroed:
        assert all(p.grad.data is b for p, b in zip(layer.parameters(), before))
    def bf(a):
        return torch.tensor(np.asarray(a).astype(ml_dtypes.bfloat16).astype(np.float64))
    tw, tb = bf(layer.weight.detach().cpu().numpy()).requires_grad_(), bf(layer.bias.detach().cpu().numpy())
    tb.requires_grad_()
    torch.nn.functional.linear(bf(x), tw, tb).backward(bf(k))
    for p, expected in ((layer.weight, tw.grad), (layer.bias, tb.grad)):
        assert p.grad.dtype == frost.float32
        np.testing.assert_allclose(p.grad.cpu().numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_an_activations_gradient_through_a_linear_layer_under_autocast_is_float32_unrounded(device):
    """A float32 activation (a transformer's LayerNorm output) cast by autocast for a linear layer gets its gradient
    as the product of the bf16 operands gives it in float32, not rounded to bf16 and widened again: the float64
    product of the same bf16 values to float32 accuracy, and values a bf16 could not hold."""
    rng = np.random.default_rng(6)
    x = frost.tensor(rng.standard_normal((5, 64)).astype(np.float32), device=device, requires_grad=True)
    k = rng.standard_normal((5, 48)).astype(np.float32)
    layer = nn.Linear(64, 48, bias=False).to(device)
    with frost.autocast(frost.bfloat16):
        y = layer(x * 2.0)  # a float32 non-leaf
    (y.to(frost.float32) * frost.tensor(k, device=device)).sum().backward()
    def bf(a):
        return np.asarray(a).astype(ml_dtypes.bfloat16).astype(np.float64)
    want = 2.0 * bf(k) @ bf(layer.weight.detach().cpu().numpy())
    got = x.grad.cpu().numpy()
    assert x.grad.dtype == frost.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert not np.array_equal(got, bf(got).astype(np.float32))


def test_a_hook_on_a_cast_sees_a_gradient_of_the_casts_dtype():
    """The product writes the float32 source's gradient at once, but a hook on the 16-bit tensor between them sees
    that tensor's dtype, as PyTorch's hooks do."""
    x = frost.tensor(np.ones((2, 8), np.float32), requires_grad=True)
    w = frost.tensor(np.full((4, 8), 1 / 3, np.float32)).bfloat16()
    h = x.bfloat16()
    seen = []
    h.register_hook(lambda g: seen.append(g.dtype))
    F.linear(h, w).float().sum().backward()
    assert seen == [frost.bfloat16] and x.grad.dtype == frost.float32


def test_losses_softmax_and_log_softmax_run_in_float32_under_autocast():
    """As PyTorch's autocast: a bfloat16 activation goes back to float32 for them (values: float32 of the rounded
    input, so the cast is the only difference)."""
    import frost.nn.functional as F
    rng = np.random.default_rng(0)
    y32 = frost.tensor(rng.standard_normal((4, 3)).astype(np.float32)).to("bfloat16").to("float32")
    target = frost.tensor(rng.standard_normal((4, 3)).astype(np.float32))
    labels = frost.tensor([0, 2, 1, 1])
    ops = {"softmax": lambda y: F.softmax(y, -1), "log_softmax": lambda y: F.log_softmax(y, -1),
           "mse_loss": lambda y: F.mse_loss(y, target), "l1_loss": lambda y: F.l1_loss(y, target),
           "bce_with_logits": lambda y: F.binary_cross_entropy_with_logits(y, target.sigmoid()),
           "nll_loss": lambda y: F.nll_loss(y, labels)}
    for name, op in ops.items():
        want = op(y32)
        with frost.autocast(frost.bfloat16):
            got = op(y32.to("bfloat16"))
        assert got.dtype == frost.float32, name
        np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=name)
