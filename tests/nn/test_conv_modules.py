"""Tests of frost/nn/conv.py's Conv1d, Conv3d and ConvTranspose1d/2d/3d against their PyTorch twins: values and
gradients in float64, attributes, repr, default init, output_size, and the errors for what frost refuses."""
import math

import numpy as np
import pytest

import frost
from frost import nn

from .helpers import compare_layer

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(11)
LAYERS = {"Conv1d": 1, "Conv3d": 3, "ConvTranspose1d": 1, "ConvTranspose2d": 2, "ConvTranspose3d": 3}


def _pair(name: str, *args, **kwargs):
    return getattr(nn, name)(*args, **kwargs), getattr(torch.nn, name)(*args, **kwargs)


@pytest.mark.parametrize("kwargs", [
    dict(kernel_size=3),
    dict(kernel_size=3, stride=2, padding=1, bias=False),
    dict(kernel_size=2, padding="same", dilation=2, groups=2),
    dict(kernel_size=1, padding="valid"),
    dict(kernel_size=3, stride=(2,), padding=[1], dilation=(2,)),
])
@pytest.mark.parametrize("name, size", [("Conv1d", (9,)), ("Conv3d", (5, 4, 6))])
def test_conv_matches_torch(name, size, kwargs):
    compare_layer(*_pair(name, 4, 6, **kwargs), RNG.standard_normal((2, 4) + size))


@pytest.mark.parametrize("kwargs", [
    dict(kernel_size=3),
    dict(kernel_size=3, stride=2, padding=1, output_padding=1, bias=False),
    dict(kernel_size=2, stride=3, output_padding=2, groups=2),
    dict(kernel_size=3, dilation=2, output_padding=1),
    dict(kernel_size=3, stride=(2,), padding=[1], output_padding=(1,)),
])
@pytest.mark.parametrize("name, size", [("ConvTranspose1d", (5,)), ("ConvTranspose2d", (4, 3)),
                                        ("ConvTranspose3d", (3, 2, 3))])
def test_conv_transpose_matches_torch(name, size, kwargs):
    compare_layer(*_pair(name, 4, 6, **kwargs), RNG.standard_normal((2, 4) + size))


def test_conv3d_with_per_dim_arguments_and_an_unbatched_input():
    kwargs = dict(kernel_size=(3, 1, 2), stride=(1, 2, 1), padding=(1, 0, 2), dilation=(2, 1, 1))
    compare_layer(*_pair("Conv3d", 2, 3, **kwargs), RNG.standard_normal((2, 5, 4, 3)))
    kwargs = dict(kernel_size=(3, 1, 2), stride=(1, 2, 3), padding=(1, 0, 1), output_padding=(0, 1, 2))
    compare_layer(*_pair("ConvTranspose3d", 2, 3, **kwargs), RNG.standard_normal((2, 3, 4, 3)))


@pytest.mark.parametrize("name", sorted(LAYERS))
@pytest.mark.parametrize("kwargs", [
    dict(kernel_size=3),
    dict(kernel_size=3, stride=2, padding=1, dilation=2, groups=2, bias=False),
    dict(kernel_size=3, stride=(2,), padding=(0,), dilation=(2,)),
])
def test_repr_and_attributes_match_torch(name, kwargs):
    f, t = _pair(name, 4, 6, **kwargs)
    assert repr(f) == repr(t)
    for attribute in ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups",
                      "padding_mode", "output_padding", "transposed"):
        assert getattr(f, attribute) == getattr(t, attribute), attribute
    assert f.weight.shape == tuple(t.weight.shape)
    assert (f.bias is None) == (t.bias is None)


@pytest.mark.parametrize("name, kwargs", [("Conv1d", dict(padding="same")), ("Conv3d", dict(padding="valid")),
                                          ("ConvTranspose2d", dict(stride=2, output_padding=(1, 0)))])
def test_repr_of_string_padding_and_output_padding_match_torch(name, kwargs):
    f, t = _pair(name, 4, 6, 3, **kwargs)
    assert repr(f) == repr(t)
    assert f.padding == t.padding and f.output_padding == t.output_padding


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_default_init_bounds_follow_the_weights_fan_in(name):
    frost.manual_seed(2)
    dims = LAYERS[name]
    layer = getattr(nn, name)(8, 12, 3, groups=2)
    fan_in = (12 if "Transpose" in name else 8) // 2 * 3 ** dims  # weight.shape[1] * prod(kernel_size)
    bound = 1 / math.sqrt(fan_in)
    w, b = layer.weight.detach().numpy(), layer.bias.detach().numpy()
    assert np.abs(w).max() <= bound and np.abs(b).max() <= bound
    assert abs(w.std() - bound / math.sqrt(3)) < 0.1 * bound


@pytest.mark.parametrize("output_size", [(9, 10), (2, 4, 10, 9), [10, 10]])
def test_conv_transpose_output_size_picks_the_output_padding(output_size):
    f, t = _pair("ConvTranspose2d", 6, 4, 3, stride=(2, 2), padding=1)
    f.to(frost.float64)
    t.double()
    f.load_state_dict({k: v.detach().numpy().copy() for k, v in t.state_dict().items()})
    x = RNG.standard_normal((2, 6, 5, 5))
    got = f(frost.tensor(x), output_size=output_size)
    want = t(torch.tensor(x), output_size=output_size)
    assert got.shape == tuple(want.shape)
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_conv_transpose_output_size_out_of_range_is_refused():
    layer = nn.ConvTranspose1d(2, 2, 3, stride=2)
    x = frost.zeros((1, 2, 4))
    with pytest.raises(ValueError, match=r"ConvTranspose1d: requested an output size of \(11,\), but valid sizes "
                                         r"range from \(9,\) to \(10,\)"):
        layer(x, output_size=(11,))
    with pytest.raises(ValueError, match="ConvTranspose1d: output_size must have 1 or 3 elements"):
        layer(x, output_size=(9, 9))


@pytest.mark.parametrize("call, error, message", [
    (lambda: nn.Conv1d(3, 3, 3, padding_mode="reflect"), NotImplementedError,
     "Conv1d: padding_mode='reflect' is not supported"),
    (lambda: nn.Conv3d(3, 3, 3, padding_mode="mirror"), ValueError, "Conv3d: padding_mode must be one of"),
    (lambda: nn.ConvTranspose2d(3, 3, 3, padding_mode="circular"), ValueError,
     'ConvTranspose2d: only "zeros" padding mode is supported'),
    (lambda: nn.Conv1d(3, 4, 3, groups=2), ValueError, r"Conv1d: in_channels \(3\) must be divisible by groups"),
    (lambda: nn.ConvTranspose3d(4, 3, 3, groups=2), ValueError,
     r"ConvTranspose3d: out_channels \(3\) must be divisible by groups"),
    (lambda: nn.Conv3d(4, 4, 3, groups=0), ValueError, "Conv3d: groups must be a positive integer"),
    (lambda: nn.Conv1d(4, 4, 3, padding="full"), ValueError, "Conv1d: invalid padding string 'full'"),
    (lambda: nn.Conv3d(4, 4, 3, stride=2, padding="same"), ValueError,
     "Conv3d: padding='same' is not supported for strided convolutions"),
    (lambda: nn.ConvTranspose1d(4, 4, 3, padding="same"), ValueError,
     "ConvTranspose1d: padding must be an int or a tuple of ints, got 'same'"),
    (lambda: nn.Conv3d(4, 4, (3, 3)), ValueError, r"Conv3d: kernel_size must be an int or a tuple of 3 ints"),
    (lambda: nn.ConvTranspose2d(4, 4, 3, stride=(1, 2, 3)), ValueError,
     r"ConvTranspose2d: stride must be an int, a one-element tuple or a tuple of 2 ints"),
])
def test_bad_construction_is_refused_with_a_clear_error(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_wrong_input_rank_or_channels_name_the_op_and_shapes():
    with pytest.raises(RuntimeError, match=r"conv3d: expected a 5-D input \(N, C, D, H, W\) or a 4-D one"):
        nn.Conv3d(2, 2, 1)(frost.zeros((1, 2, 3, 3, 3, 3)))
    with pytest.raises(RuntimeError, match=r"conv_transpose1d: input of shape \(1, 3, 5\) has 3 channels but weight "
                                           r"\(2, 4, 3\) expects 2"):
        nn.ConvTranspose1d(2, 4, 3)(frost.zeros((1, 3, 5)))


@pytest.mark.cuda
@pytest.mark.parametrize("tf32", [False, True])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layers_on_cuda_match_cpu(name, tf32, monkeypatch):
    """With TF32 off the GPU's float32 convolutions agree with the CPU's up to summation order; with it on (the
    default), up to TF32's 10-bit products, whose error grows with a sum's length, not with its (cancelling) value."""
    monkeypatch.setattr(frost.backends, "allow_tf32", tf32)
    layer = getattr(nn, name)(4, 4, 3, stride=2, padding=1, groups=2)
    x = RNG.standard_normal((2, 4) + (6,) * LAYERS[name]).astype(np.float32)
    results = []
    for device in ("cpu", "cuda"):
        layer.to(device)
        layer.zero_grad()
        fx = frost.tensor(x, device=device, requires_grad=True)
        out = layer(fx)
        (out * out).sum().backward()
        results.append([t.detach().cpu().numpy() for t in (out, fx.grad, layer.weight.grad, layer.bias.grad)])
    rtol = 2e-3 if tf32 else 1e-4
    for what, cpu_result, gpu_result in zip(("output", "input grad", "weight grad", "bias grad"), *results):
        np.testing.assert_allclose(gpu_result, cpu_result, rtol=rtol, atol=rtol * np.abs(cpu_result).max(),
                                   err_msg=f"{name} {what}")
