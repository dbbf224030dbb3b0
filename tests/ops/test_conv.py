"""conv2d against PyTorch's: outputs and input/weight/bias gradients over many configurations, and its errors."""
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import frost
from frost.ops import conv
from frost.ops.conv import conv2d

RNG = np.random.default_rng(1234)


def _run_both(x_np, w_np, b_np, dtype=np.float64, **kwargs):
    """Forward and backward (with a random upstream gradient) in Frost and in PyTorch; returns both results."""
    x_np, w_np = x_np.astype(dtype), w_np.astype(dtype)
    b_np = None if b_np is None else b_np.astype(dtype)
    tx = torch.tensor(x_np, requires_grad=True)
    tw = torch.tensor(w_np, requires_grad=True)
    tb = None if b_np is None else torch.tensor(b_np, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyTorch's note about even kernels with padding='same'
        t_out = TF.conv2d(tx, tw, tb, **kwargs)
    g_np = RNG.standard_normal(t_out.shape).astype(dtype)
    t_out.backward(torch.tensor(g_np))

    fx = frost.Tensor(x_np, requires_grad=True)
    fw = frost.Tensor(w_np, requires_grad=True)
    fb = None if b_np is None else frost.Tensor(b_np, requires_grad=True)
    f_out = conv2d(fx, fw, fb, **kwargs)
    f_out.backward(frost.Tensor(g_np))
    frost_res = [f_out.detach().numpy(), fx.grad.numpy(), fw.grad.numpy()] + ([] if fb is None else [fb.grad.numpy()])
    torch_res = [t_out.detach().numpy(), tx.grad.numpy(), tw.grad.numpy()] + ([] if tb is None else [tb.grad.numpy()])
    return frost_res, torch_res


def _assert_close(frost_res, torch_res, rtol=1e-10, atol=1e-10):
    names = ["output", "input grad", "weight grad", "bias grad"]
    for name, f, t in zip(names, frost_res, torch_res):
        assert f.shape == t.shape, f"{name}: shape {f.shape} != {t.shape}"
        np.testing.assert_allclose(f, t, rtol=rtol, atol=atol, err_msg=name)


CASES = [
    # (N, Cin, H, W, Cout, kh, kw, kwargs)
    (2, 3, 8, 8, 4, 3, 3, dict()),
    (2, 3, 8, 8, 4, 3, 3, dict(padding=1)),
    (2, 3, 9, 7, 5, 3, 3, dict(stride=2, padding=1)),
    (1, 4, 10, 10, 6, 3, 3, dict(stride=(2, 1), padding=(1, 0))),
    (2, 4, 11, 9, 4, 3, 3, dict(dilation=2, padding=2)),
    (2, 4, 12, 12, 4, 3, 2, dict(dilation=(2, 3), stride=(1, 2))),
    (2, 3, 7, 9, 4, 2, 5, dict(padding=(1, 2))),
    (2, 4, 8, 8, 6, 3, 3, dict(groups=2, padding=1)),
    (2, 6, 8, 8, 6, 3, 3, dict(groups=6, padding=1)),           # depthwise
    (2, 4, 8, 8, 8, 3, 3, dict(groups=4, padding=1, stride=2)),  # depthwise, channel multiplier 2
    (2, 3, 8, 8, 4, 1, 1, dict()),
    (2, 8, 8, 8, 4, 1, 1, dict(stride=2)),
    (2, 3, 8, 8, 4, 3, 3, dict(padding="same")),
    (2, 3, 8, 7, 4, 4, 2, dict(padding="same")),                 # even kernel: asymmetric padding
    (2, 3, 8, 8, 4, 3, 3, dict(padding="same", dilation=2)),
    (2, 3, 8, 8, 4, 3, 3, dict(padding="valid")),
    (1, 2, 5, 5, 3, 5, 5, dict()),                               # output 1x1
    (2, 2, 5, 5, 3, 3, 3, dict(padding=3)),                      # padding wider than the kernel's reach
    (2, 16, 6, 6, 64, 3, 3, dict(padding=1)),                    # Cout >> Cin: col2im path
    (3, 4, 6, 6, 4, 3, 3, dict(stride=3)),                       # windows that do not overlap
]


@pytest.mark.parametrize("n,cin,h,w,cout,kh,kw,kwargs", CASES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_conv2d_matches_torch_float64(n, cin, h, w, cout, kh, kw, kwargs, with_bias):
    groups = kwargs.get("groups", 1)
    x = RNG.standard_normal((n, cin, h, w))
    wt = RNG.standard_normal((cout, cin // groups, kh, kw))
    b = RNG.standard_normal(cout) if with_bias else None
    _assert_close(*_run_both(x, wt, b, **kwargs))


def test_conv2d_float32_within_tolerance():
    x = RNG.standard_normal((4, 16, 12, 12))
    w = RNG.standard_normal((32, 16, 3, 3)) * 0.1
    b = RNG.standard_normal(32)
    frost_res, torch_res = _run_both(x, w, b, dtype=np.float32, padding=1)
    assert all(r.dtype == np.float32 for r in frost_res)
    _assert_close(frost_res, torch_res, rtol=1e-4, atol=1e-4)


def test_conv2d_non_contiguous_input():
    base = RNG.standard_normal((2, 9, 7, 3))             # NHWC storage, permuted to NCHW below
    w = RNG.standard_normal((4, 3, 3, 3))
    b = RNG.standard_normal(4)
    x_perm = base.transpose(0, 3, 1, 2)
    assert not x_perm.flags.c_contiguous
    _assert_close(*_run_both(x_perm, w, b, padding=1, stride=(1, 2)))
    # the same through a frost permute op, so the gradient also flows through the permutation
    fx = frost.Tensor(base, requires_grad=True)
    fw = frost.Tensor(w)
    out = conv2d(fx.permute(0, 3, 1, 2), fw, padding=1)
    g = RNG.standard_normal(out.shape)
    out.backward(frost.Tensor(g))
    tx = torch.tensor(base, requires_grad=True)
    t_out = TF.conv2d(tx.permute(0, 3, 1, 2), torch.tensor(w), padding=1)
    t_out.backward(torch.tensor(g))
    np.testing.assert_allclose(out.detach().numpy(), t_out.detach().numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(fx.grad.numpy(), tx.grad.numpy(), rtol=1e-10, atol=1e-10)


def test_conv2d_unbatched_input():
    x = RNG.standard_normal((3, 6, 6))
    w = RNG.standard_normal((2, 3, 3, 3))
    out = conv2d(frost.Tensor(x), frost.Tensor(w), padding=1)
    expected = TF.conv2d(torch.tensor(x), torch.tensor(w), padding=1)
    assert out.shape == (2, 6, 6)
    np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-10, atol=1e-10)


def test_conv2d_only_weight_requires_grad():
    x = frost.Tensor(RNG.standard_normal((2, 3, 5, 5)))
    w = frost.Tensor(RNG.standard_normal((4, 3, 3, 3)), requires_grad=True)
    conv2d(x, w).sum().backward()
    tw = torch.tensor(w.detach().numpy(), requires_grad=True)
    TF.conv2d(torch.tensor(x.numpy()), tw).sum().backward()
    assert x.grad is None
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-10)


def test_conv2d_no_grad_records_nothing():
    x = frost.Tensor(RNG.standard_normal((1, 3, 5, 5)), requires_grad=True)
    w = frost.Tensor(RNG.standard_normal((4, 3, 3, 3)), requires_grad=True)
    with frost.no_grad():
        out = conv2d(x, w)
    assert not out.requires_grad


def test_array_level_functions_match_torch():
    x = RNG.standard_normal((2, 4, 9, 9))
    w = RNG.standard_normal((6, 2, 3, 3))
    kwargs = dict(stride=2, padding=1, dilation=1, groups=2)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    t_out = TF.conv2d(tx, tw, **kwargs)
    g = RNG.standard_normal(t_out.shape)
    t_out.backward(torch.tensor(g))
    out = conv.conv2d_forward(x, w, **kwargs)
    gx = conv.conv2d_backward_input(g, w, x.shape, **kwargs)
    gw = conv.conv2d_backward_weight(g, x, w.shape, **kwargs)
    np.testing.assert_allclose(out, t_out.detach().numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(gx, tx.grad.numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(gw, tw.grad.numpy(), rtol=1e-10, atol=1e-10)
    # stride 1 takes the transposed-convolution route for the input gradient
    kwargs = dict(stride=1, padding=(1, 2), dilation=(1, 2), groups=1)
    w1 = RNG.standard_normal((3, 4, 3, 3))
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w1, requires_grad=True)
    t_out = TF.conv2d(tx, tw, **kwargs)
    g = RNG.standard_normal(t_out.shape)
    t_out.backward(torch.tensor(g))
    np.testing.assert_allclose(conv.conv2d_backward_input(g, w1, x.shape, **kwargs), tx.grad.numpy(), rtol=1e-10)


def test_conv2d_stacked_layers_with_relu():
    # the output of one conv (a channel-major view) feeds the next; gradients come back in that layout too
    x = RNG.standard_normal((2, 3, 8, 8))
    w1, w2 = RNG.standard_normal((5, 3, 3, 3)), RNG.standard_normal((4, 5, 3, 3))
    fx, fw1, fw2 = (frost.Tensor(a, requires_grad=True) for a in (x, w1, w2))
    tx, tw1, tw2 = (torch.tensor(a, requires_grad=True) for a in (x, w1, w2))
    f_out = conv2d(frost.relu(conv2d(fx, fw1, padding=1)), fw2, stride=2, padding=1)
    t_out = TF.conv2d(torch.relu(TF.conv2d(tx, tw1, padding=1)), tw2, stride=2, padding=1)
    g = RNG.standard_normal(t_out.shape)
    f_out.backward(frost.Tensor(g))
    t_out.backward(torch.tensor(g))
    for f, t in ((f_out, t_out), (fx.grad, tx.grad), (fw1.grad, tw1.grad), (fw2.grad, tw2.grad)):
        np.testing.assert_allclose(f.detach().numpy(), t.detach().numpy(), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_conv2d_half_precision_keeps_dtype(dtype):
    x = frost.Tensor(RNG.standard_normal((2, 3, 6, 6)).astype(np.float32)).to(dtype)
    w = frost.Tensor(RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)).to(dtype)
    x.requires_grad_(), w.requires_grad_()
    out = conv2d(x, w, padding=1)
    g = frost.Tensor(RNG.standard_normal(out.shape).astype(np.float32)).to(dtype)
    out.backward(g)
    assert out.dtype == x.grad.dtype == w.grad.dtype == frost.Tensor(np.zeros(1)).to(dtype).dtype
    # the oracle: float64 on the same rounded inputs; each result is rounded once to the dtype
    xt, wt = (torch.tensor(t.detach().numpy().astype(np.float64), requires_grad=True) for t in (x, w))
    expected = TF.conv2d(xt, wt, padding=1)
    expected.backward(torch.tensor(g.numpy().astype(np.float64)))
    eps = 2.0 ** -8 if dtype == "bfloat16" else 2.0 ** -11
    for ours, theirs in ((out, expected.detach()), (x.grad, xt.grad), (w.grad, wt.grad)):
        theirs = theirs.numpy()
        np.testing.assert_allclose(ours.detach().numpy().astype(np.float64), theirs, rtol=2 * eps,
                                   atol=2 * eps * abs(theirs).max())


def _t(shape, dtype=np.float32):
    return frost.Tensor(np.zeros(shape, dtype=dtype))


def test_error_wrong_channel_count():
    with pytest.raises(RuntimeError, match=r"conv2d: input of shape \(2, 4, 8, 8\) has 4 channels but weight "
                                           r"\(6, 3, 3, 3\) with groups=1 expects 3"):
        conv2d(_t((2, 4, 8, 8)), _t((6, 3, 3, 3)))


def test_error_wrong_ndim():
    with pytest.raises(RuntimeError, match=r"conv2d: expected a 4-D input .* got shape \(8, 8\)"):
        conv2d(_t((8, 8)), _t((6, 3, 3, 3)))
    with pytest.raises(RuntimeError, match=r"conv2d: expected a 4-D weight .* got shape \(6, 3, 3\)"):
        conv2d(_t((1, 3, 8, 8)), _t((6, 3, 3)))


def test_error_groups_not_dividing_channels():
    with pytest.raises(RuntimeError, match=r"conv2d: groups=2 must divide .* input channels \(3\)"):
        conv2d(_t((1, 3, 8, 8)), _t((4, 1, 3, 3)), groups=2)
    with pytest.raises(RuntimeError, match=r"conv2d: groups=2 must divide .* output channels \(5\)"):
        conv2d(_t((1, 4, 8, 8)), _t((5, 2, 3, 3)), groups=2)


def test_error_dtype_mismatch():
    with pytest.raises(RuntimeError, match=r"conv2d: Input type \(float64\) and weight type \(float32\) should be "
                                           r"the same"):
        conv2d(_t((1, 3, 8, 8), np.float64), _t((4, 3, 3, 3)))
    with pytest.raises(RuntimeError, match=r"conv2d: Input type \(float32\) and bias type \(float64\)"):
        conv2d(_t((1, 3, 8, 8)), _t((4, 3, 3, 3)), _t((4,), np.float64))


def test_error_device_mismatch(monkeypatch):
    # no GPU here: pretend the weight lives on cuda:0 by patching its device property
    x, w = _t((1, 3, 8, 8)), _t((4, 3, 3, 3))

    class FakeCudaWeight(frost.Tensor):
        @property
        def device(self):
            return frost.Device("cuda:0")
    w.__class__ = FakeCudaWeight
    with pytest.raises(RuntimeError, match=r"conv2d: input and weight are on different devices: input \(1, 3, 8, 8\) "
                                           r"float32 on cpu, weight \(4, 3, 3, 3\) float32 on cuda:0"):
        conv2d(x, w)


def test_error_output_too_small():
    with pytest.raises(RuntimeError, match=r"conv2d: output size \(0 x 0\) is too small"):
        conv2d(_t((1, 3, 4, 4)), _t((2, 3, 5, 5)))
    with pytest.raises(RuntimeError, match=r"conv2d: output size \(-2 x 6\) is too small: input "
                                           r"\(1, 3, 4, 8\) padded to \(4 x 8\) is smaller than the dilated "
                                           r"kernel \(7 x 3\)"):
        conv2d(_t((1, 3, 4, 8)), _t((2, 3, 3, 3)), dilation=(3, 1))


def test_error_bad_bias_and_padding():
    with pytest.raises(RuntimeError, match=r"conv2d: bias of shape \(3,\) does not fit weight \(4, 3, 3, 3\)"):
        conv2d(_t((1, 3, 8, 8)), _t((4, 3, 3, 3)), _t((3,)))
    with pytest.raises(ValueError, match=r"padding='same' is not supported for strided"):
        conv2d(_t((1, 3, 8, 8)), _t((4, 3, 3, 3)), padding="same", stride=2)
    with pytest.raises(ValueError, match=r"padding must be an int, a pair, 'valid' or 'same'"):
        conv2d(_t((1, 3, 8, 8)), _t((4, 3, 3, 3)), padding="full")


@pytest.mark.cuda
@pytest.mark.parametrize("kwargs", [dict(padding=1), dict(stride=2, padding=1, groups=2), dict(dilation=2)])
def test_conv2d_cuda_matches_cpu(kwargs):
    x = RNG.standard_normal((2, 4, 9, 9)).astype(np.float32)
    w = RNG.standard_normal((6, 4 // kwargs.get("groups", 1), 3, 3)).astype(np.float32)
    b = RNG.standard_normal(6).astype(np.float32)
    results = []
    for device in ("cpu", "cuda"):
        fx, fw, fb = (frost.tensor(a, device=device, requires_grad=True) for a in (x, w, b))
        out = conv2d(fx, fw, fb, **kwargs)
        (out * out).sum().backward()
        results.append([t.detach().cpu().numpy() for t in (out, fx.grad, fw.grad, fb.grad)])
    for cpu_r, gpu_r in zip(*results):
        np.testing.assert_allclose(gpu_r, cpu_r, rtol=2e-3, atol=2e-3)  # TF32 on the GPU
