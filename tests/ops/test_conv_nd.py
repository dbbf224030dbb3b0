"""Tests of frost/ops/conv_nd.py: conv1d, conv3d and conv_transpose1d/2d/3d against PyTorch CPU float64 (values and
the input, weight and bias gradients), plus their errors."""
import warnings

import numpy as np
import pytest

import frost
import frost.nn.functional as F
from frost.ops import conv_nd

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(7)
DIMS = {"conv1d": 1, "conv3d": 3, "conv_transpose1d": 1, "conv_transpose2d": 2, "conv_transpose3d": 3}


def _weight_shape(name: str, cin: int, cout: int, kernel: tuple, groups: int) -> tuple:
    """PyTorch's weight layout: (Cout, Cin/groups, *k), or (Cin, Cout/groups, *k) for a transposed convolution."""
    return (cin, cout // groups) + kernel if "transpose" in name else (cout, cin // groups) + kernel


def _run(name: str, x, w, b, upstream_seed: int, frost_view, torch_view, **kwargs):
    """Forward and backward of frost's and torch's op on the same float64 arrays, the input first passed through
    the same view (to make it non-contiguous); returns [(frost array, torch array), ...] for out and the grads."""
    fx, fw = frost.tensor(x, requires_grad=True), frost.tensor(w, requires_grad=True)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    fb = None if b is None else frost.tensor(b, requires_grad=True)
    tb = None if b is None else torch.tensor(b, requires_grad=True)
    fo = getattr(F, name)(frost_view(fx), fw, fb, **kwargs)
    with warnings.catch_warnings():  # torch's note that 'same' with an even kernel pads a copy
        warnings.simplefilter("ignore", UserWarning)
        to = getattr(torch.nn.functional, name)(torch_view(tx), tw, tb, **kwargs)
    assert fo.shape == tuple(to.shape), f"{name} {kwargs}: shape {fo.shape} != torch's {tuple(to.shape)}"
    up = np.random.default_rng(upstream_seed).standard_normal(fo.shape)
    fo.backward(frost.tensor(up))
    to.backward(torch.tensor(up))
    pairs = [(fo.detach().numpy(), to.detach().numpy()), (fx.grad.numpy(), tx.grad.numpy()),
             (fw.grad.numpy(), tw.grad.numpy())]
    return pairs + ([] if b is None else [(fb.grad.numpy(), tb.grad.numpy())])


def _check(name: str, batch: int, cin: int, cout: int, size: tuple, kernel: tuple, bias: bool = True,
           contiguous: bool = True, **kwargs):
    groups = kwargs.get("groups", 1)
    w = RNG.standard_normal(_weight_shape(name, cin, cout, kernel, groups))
    b = RNG.standard_normal(cout) if bias else None
    if contiguous:
        x = RNG.standard_normal((batch, cin) + size)
        frost_view = torch_view = lambda t: t  # noqa: E731
    else:  # channels and batch swapped, every other element of the last dim: strides no conv sees contiguous
        x = RNG.standard_normal((cin, batch) + size[:-1] + (2 * size[-1],))
        frost_view = torch_view = lambda t: t.transpose(0, 1)[..., ::2]  # noqa: E731
    for what, (got, want) in zip(("output", "input grad", "weight grad", "bias grad"),
                                 _run(name, x, w, b, 1, frost_view, torch_view, **kwargs)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-11, err_msg=f"{name} {kwargs}: {what}")


CONV_CASES = [
    dict(),
    dict(stride=2, padding=1),
    dict(stride=(3,), padding=(2,), dilation=(2,)),
    dict(padding="same", dilation=2),
    dict(padding="valid", groups=2),
    dict(stride=2, dilation=2, groups=2),
]


@pytest.mark.parametrize("kwargs", CONV_CASES)
@pytest.mark.parametrize("batch", [1, 3])
def test_conv1d_matches_torch(kwargs, batch):
    _check("conv1d", batch, 4, 6, (11,), (3,), contiguous=batch == 1, **kwargs)


@pytest.mark.parametrize("kwargs", CONV_CASES + [dict(stride=(2, 1, 3), padding=(1, 0, 2), dilation=(1, 2, 1))])
def test_conv3d_matches_torch(kwargs):
    _check("conv3d", 2, 4, 6, (5, 6, 7), (3, 2, 3), contiguous=False, **kwargs)


def test_conv_same_padding_with_an_even_kernel_puts_the_extra_at_the_end():
    _check("conv1d", 2, 3, 2, (9,), (4,), padding="same")
    _check("conv3d", 1, 2, 2, (4, 5, 4), (2, 3, 4), padding="same", bias=False)


TRANSPOSE_CASES = [
    dict(),
    dict(stride=2),
    dict(stride=2, padding=1, output_padding=1),
    dict(stride=3, padding=2, output_padding=2, groups=2),
    dict(dilation=3, output_padding=2),  # output_padding below the dilation, not the stride
    dict(stride=(2,), padding=(1,), output_padding=(1,), dilation=(2,), groups=2),
]


@pytest.mark.parametrize("kwargs", TRANSPOSE_CASES)
@pytest.mark.parametrize("batch", [1, 3])
def test_conv_transpose1d_matches_torch(kwargs, batch):
    _check("conv_transpose1d", batch, 4, 6, (7,), (3,), contiguous=batch == 3, **kwargs)


@pytest.mark.parametrize("kwargs", TRANSPOSE_CASES + [
    dict(stride=(2, 1), padding=(1, 0), output_padding=(1, 0), dilation=(1, 2)),
    dict(stride=(1, 3), padding=(0, 1), output_padding=(0, 2), groups=2, dilation=2),
])
def test_conv_transpose2d_matches_torch(kwargs):
    _check("conv_transpose2d", 2, 4, 6, (5, 6), (3, 2), contiguous=False, **kwargs)


@pytest.mark.parametrize("kwargs", TRANSPOSE_CASES + [dict(stride=(1, 2, 3), padding=(0, 1, 1),
                                                            output_padding=(0, 1, 2), dilation=(2, 1, 1))])
def test_conv_transpose3d_matches_torch(kwargs):
    _check("conv_transpose3d", 2, 4, 2, (3, 4, 5), (2, 3, 2), contiguous=False, **kwargs)


@pytest.mark.parametrize("name", sorted(DIMS))
def test_without_bias_and_with_a_one_sized_kernel(name):
    dims = DIMS[name]
    _check(name, 2, 3, 4, (4,) * dims, (1,) * dims, bias=False)
    _check(name, 2, 3, 3, (3,) * dims, (3,) * dims, bias=False, padding=1)


@pytest.mark.parametrize("name", sorted(DIMS))
def test_unbatched_input_matches_torch(name):
    dims = DIMS[name]
    x, w = RNG.standard_normal((4,) + (5,) * dims), RNG.standard_normal(_weight_shape(name, 4, 2, (3,) * dims, 1))
    b = RNG.standard_normal(2)
    for got, want in _run(name, x, w, b, 2, lambda t: t, lambda t: t, stride=2, padding=1):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("name", ["conv1d", "conv_transpose2d"])
def test_gradients_only_for_what_requires_them(name):
    dims = DIMS[name]
    x = frost.tensor(RNG.standard_normal((2, 4) + (5,) * dims))
    w = frost.tensor(RNG.standard_normal((4, 4) + (3,) * dims), requires_grad=True)
    b = frost.tensor(RNG.standard_normal(4))
    getattr(F, name)(x, w, b, padding=1).sum().backward()
    assert x.grad is None and b.grad is None
    tw = torch.tensor(w.detach().numpy(), requires_grad=True)
    getattr(torch.nn.functional, name)(torch.tensor(x.numpy()), tw, torch.tensor(b.numpy()), padding=1).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("name", ["conv3d", "conv_transpose1d"])
def test_half_precision_computes_in_float32_and_keeps_the_dtype(name):
    dims = DIMS[name]
    x = RNG.standard_normal((2, 4) + (4,) * dims).astype(np.float16)
    w = RNG.standard_normal((4, 4) + (2,) * dims).astype(np.float16)
    out = getattr(F, name)(frost.tensor(x), frost.tensor(w))
    want = getattr(torch.nn.functional, name)(*(torch.tensor(a, dtype=torch.float32) for a in (x, w)))
    assert out.dtype == frost.float16
    np.testing.assert_allclose(out.numpy().astype(np.float32), want.numpy(), rtol=1e-2, atol=1e-2)


def _t(shape, dtype=np.float64):
    return frost.tensor(RNG.standard_normal(shape).astype(dtype))


@pytest.mark.parametrize("call, error, message", [
    (lambda: F.conv1d(_t((2, 3, 4, 5)), _t((4, 3, 3))), RuntimeError,
     r"conv1d: expected a 3-D input \(N, C, L\) or a 2-D one \(C, L\), got shape \(2, 3, 4, 5\)"),
    (lambda: F.conv3d(_t((2, 3, 4, 4, 4)), _t((4, 3, 3, 3))), RuntimeError,
     r"conv3d: expected a 5-D weight .*, got shape \(4, 3, 3, 3\)"),
    (lambda: F.conv3d(_t((2, 3, 4, 4, 4)), _t((4, 2, 3, 3, 3))), RuntimeError,
     r"conv3d: input of shape \(2, 3, 4, 4, 4\) has 3 channels but weight \(4, 2, 3, 3, 3\) with groups=1 expects 2"),
    (lambda: F.conv1d(_t((2, 4, 9)), _t((3, 2, 3)), groups=2), RuntimeError,
     r"conv1d: groups=2 must divide both the input channels \(4\) and the weight's 3"),
    (lambda: F.conv1d(_t((2, 4, 9)), _t((4, 4, 3)), groups=0), RuntimeError, "conv1d: groups must be a positive"),
    (lambda: F.conv1d(_t((2, 4, 2)), _t((4, 4, 3))), RuntimeError,
     r"conv1d: output size \(0,\) is too small: input \(2, 4, 2\) padded to \(2,\) is smaller than the dilated "
     r"kernel \(3,\)"),
    (lambda: F.conv1d(_t((2, 4, 9)), _t((4, 4, 3)), padding="same", stride=2), ValueError,
     r"conv1d: padding='same' is not supported for strided convolutions"),
    (lambda: F.conv3d(_t((1, 2, 4, 4, 4)), _t((2, 2, 1, 1, 1)), padding="full"), ValueError,
     r"conv3d: padding must be an int, a tuple, 'valid' or 'same', got 'full'"),
    (lambda: F.conv3d(_t((1, 2, 4, 4, 4)), _t((2, 2, 1, 1, 1)), stride=(1, 2)), ValueError,
     r"conv3d: stride must be an int or a tuple of 3 ints, got \(1, 2\)"),
    (lambda: F.conv1d(_t((1, 2, 4)), _t((2, 2, 1)), dilation=0), ValueError, r"conv1d: dilation must be positive"),
    (lambda: F.conv1d(_t((1, 2, 4)), _t((2, 2, 1)), padding=-1), ValueError,
     r"conv1d: padding must be non-negative"),
    (lambda: F.conv1d(_t((1, 2, 4)), _t((2, 2, 1)), _t((3,))), RuntimeError,
     r"conv1d: bias of shape \(3,\) does not fit weight \(2, 2, 1\); expected \(2,\)"),
    (lambda: F.conv1d(_t((1, 2, 4)), _t((2, 2, 1), np.float32)), RuntimeError,
     r"conv1d: Input type \(float64\) and weight type \(float32\) should be the same"),
    (lambda: F.conv1d(frost.ones((1, 2, 4), dtype=frost.int64), frost.ones((2, 2, 1), dtype=frost.int64)),
     RuntimeError, r"conv1d: expected floating-point tensors, got int64"),
    (lambda: F.conv1d(np.ones((1, 2, 4)), _t((2, 2, 1))), TypeError, r"conv1d: input must be a Tensor"),
    (lambda: F.conv_transpose2d(_t((2, 3, 4, 4)), _t((4, 2, 3, 3))), RuntimeError,
     r"conv_transpose2d: input of shape \(2, 3, 4, 4\) has 3 channels but weight \(4, 2, 3, 3\) expects 4"),
    (lambda: F.conv_transpose2d(_t((2, 3, 4, 4)), _t((3, 2, 3))), RuntimeError,
     r"conv_transpose2d: expected a 4-D weight .*, got shape \(3, 2, 3\)"),
    (lambda: F.conv_transpose1d(_t((2, 3, 4)), _t((3, 2, 3)), groups=2), RuntimeError,
     r"conv_transpose1d: groups=2 must divide both the input channels \(3\)"),
    (lambda: F.conv_transpose1d(_t((2, 4, 4)), _t((4, 2, 3)), stride=2, output_padding=2), ValueError,
     r"conv_transpose1d: output_padding \(2,\) must be non-negative and smaller than either stride \(2,\) or "
     r"dilation \(1,\)"),
    (lambda: F.conv_transpose3d(_t((1, 2, 3, 3, 3)), _t((2, 2, 1, 1, 1)), padding="same"), ValueError,
     r"conv_transpose3d: padding must be an int or a tuple of 3 ints, got 'same'"),
    (lambda: F.conv_transpose1d(_t((1, 2, 2)), _t((2, 2, 1)), padding=1), RuntimeError,
     r"conv_transpose1d: output size \(0,\) is too small"),
    (lambda: F.conv_transpose2d(_t((1, 2, 3, 3)), _t((2, 2, 1, 1)), _t((2, 1))), RuntimeError,
     r"conv_transpose2d: bias of shape \(2, 1\) does not fit weight \(2, 2, 1, 1\) with groups=1; expected \(2,\)"),
])
def test_bad_input_is_refused_with_a_clear_error(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_geometry_of_a_transposed_convolution_is_the_forward_one_reversed():
    geo = conv_nd.transpose_geometry((2, 4, 5, 6), (4, 3, 3, 2), stride=2, padding=1, output_padding=1)
    assert geo.size == (10, 11) and geo.out == (5, 6) and geo.c == 3 and geo.cout == 4
    forward = conv_nd.conv_geometry((2, 3, 10, 11), (4, 3, 3, 2), stride=2, padding=1)
    assert forward == geo


@pytest.mark.cuda
@pytest.mark.parametrize("name, kwargs", [
    ("conv1d", dict(stride=2, padding=1, groups=2)),
    ("conv3d", dict(padding="same", dilation=2)),
    ("conv_transpose1d", dict(stride=2, padding=1, output_padding=1)),
    ("conv_transpose2d", dict(stride=2, padding=1, output_padding=1, groups=2)),
    ("conv_transpose3d", dict(stride=(1, 2, 2), dilation=2)),
])
def test_cuda_matches_cpu(name, kwargs, monkeypatch):
    monkeypatch.setattr(frost.backends, "allow_tf32", False)  # float32 products as on the CPU, not TF32's 10 bits
    dims = DIMS[name]
    x = RNG.standard_normal((2, 4) + (5,) * dims).astype(np.float32)
    w = RNG.standard_normal((4, 4 // kwargs.get("groups", 1)) + (3,) * dims).astype(np.float32)
    b = RNG.standard_normal(4).astype(np.float32)
    results = []
    for device in ("cpu", "cuda"):
        fx, fw, fb = (frost.tensor(a, device=device, requires_grad=True) for a in (x, w, b))
        out = getattr(F, name)(fx, fw, fb, **kwargs)
        (out * out).sum().backward()
        results.append([t.detach().cpu().numpy() for t in (out, fx.grad, fw.grad, fb.grad)])
    for cpu_result, gpu_result in zip(*results):
        np.testing.assert_allclose(gpu_result, cpu_result, rtol=1e-4, atol=1e-4)
