"""Resampling layers (Upsample, PixelShuffle, Fold / Unfold, MaxUnpool) against their PyTorch twins: values,
gradients and repr."""
import numpy as np
import pytest

import frost
from frost import nn
from .helpers import assert_close, compare_layer

torch = pytest.importorskip("torch")

rng = np.random.default_rng(32)


@pytest.mark.parametrize("name,kwargs,shape", [
    ("Upsample", dict(scale_factor=2), (2, 3, 4, 5)),
    ("Upsample", dict(size=(7, 3), mode="bilinear"), (2, 3, 4, 5)),
    ("Upsample", dict(scale_factor=1.5, mode="bicubic", align_corners=True), (1, 2, 4, 5)),
    ("Upsample", dict(scale_factor=(2.0, 0.5), mode="nearest-exact"), (1, 2, 4, 6)),
    ("Upsample", dict(scale_factor=2.3, mode="linear", recompute_scale_factor=True), (2, 3, 6)),
    ("Upsample", dict(size=5, mode="trilinear"), (1, 2, 3, 4, 3)),
    ("UpsamplingNearest2d", dict(scale_factor=3), (2, 1, 3, 4)),
    ("UpsamplingBilinear2d", dict(size=(6, 9)), (2, 1, 3, 4)),
    ("PixelShuffle", dict(upscale_factor=2), (2, 8, 3, 4)),
    ("PixelUnshuffle", dict(downscale_factor=3), (2, 1, 6, 9)),
    ("Unfold", dict(kernel_size=(2, 3), dilation=2, padding=1, stride=(2, 1)), (2, 3, 7, 8)),
    ("Fold", dict(output_size=(4, 5), kernel_size=2), (2, 12, 12)),
])
def test_resample_layers_match_torch(name, kwargs, shape):
    f, t = getattr(nn, name)(**kwargs), getattr(torch.nn, name)(**kwargs)
    compare_layer(f, t, rng.standard_normal(shape))
    assert repr(f) == repr(t)


@pytest.mark.parametrize("name,kwargs", [("MaxUnpool1d", dict(kernel_size=2)),
                                         ("MaxUnpool2d", dict(kernel_size=3, stride=2, padding=1))])
def test_max_unpool_layers_invert_torchs_pooling(name, kwargs):
    dims = 1 if name.endswith("1d") else 2
    torch_pool = getattr(torch.nn, f"MaxPool{dims}d")(return_indices=True, **kwargs)
    values, indices = torch_pool(torch.tensor(rng.standard_normal((2, 3) + (7,) * dims)))
    f, t = getattr(nn, name)(**kwargs), getattr(torch.nn, name)(**kwargs)
    f_in = frost.tensor(values.numpy(), requires_grad=True)
    t_in = values.detach().requires_grad_()
    size = (7,) * dims
    f_out, t_out = f(f_in, frost.tensor(indices.numpy()), output_size=size), t(t_in, indices, output_size=size)
    assert_close(f_out, t_out, what="forward")
    upstream = rng.standard_normal(tuple(t_out.shape))
    f_out.backward(frost.tensor(upstream))
    t_out.backward(torch.tensor(upstream))
    assert_close(f_in.grad, t_in.grad, what="grad of input")
    assert repr(f) == repr(t)


def test_max_pool2d_layer_returns_indices_for_max_unpool2d():
    x = rng.standard_normal((2, 3, 6, 8))
    values, indices = nn.MaxPool2d(2, return_indices=True)(frost.tensor(x))
    t_values, t_indices = torch.nn.MaxPool2d(2, return_indices=True)(torch.tensor(x))
    np.testing.assert_array_equal(indices.numpy(), t_indices.numpy())
    restored = nn.MaxUnpool2d(2)(values, indices)
    assert_close(restored, torch.nn.MaxUnpool2d(2)(t_values, t_indices), what="unpooled")
