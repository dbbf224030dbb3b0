"""Resampling and patch ops (interpolate, pixel_shuffle / pixel_unshuffle, unfold / fold, max_unpool) against
PyTorch CPU float64: values, gradients (random upstream gradient) and errors."""
import numpy as np
import pytest

import frost
import frost.nn.functional as F
from frost.ops import resample

torch = pytest.importorskip("torch")
TF = torch.nn.functional

RNG = np.random.default_rng(32)


def _run(frost_fn, torch_fn, array):
    """(frost out, torch out, frost grad, torch grad) after a backward of the same random upstream gradient."""
    f = frost.Tensor(array, requires_grad=True)  # keeps the array's strides
    t = torch.tensor(np.ascontiguousarray(array), requires_grad=True)
    fo, to = frost_fn(f), torch_fn(t)
    up = RNG.standard_normal(tuple(to.shape))
    to.backward(torch.tensor(up))
    fo.backward(frost.tensor(up))
    return fo, to, f.grad, t.grad


def _check(frost_fn, torch_fn, array, atol=1e-12, grads=True):
    fo, to, fg, tg = _run(frost_fn, torch_fn, array)
    assert fo.shape == tuple(to.shape) and fo.dtype.name == str(to.dtype).replace("torch.", "")
    np.testing.assert_allclose(fo.detach().numpy(), to.detach().numpy(), rtol=1e-10, atol=atol)
    if grads:
        assert fg.dtype == fo.dtype and fg.shape == tuple(array.shape)
        np.testing.assert_allclose(fg.numpy(), tg.numpy(), rtol=1e-10, atol=atol)


def _noncontiguous(shape):
    """A float64 array of `shape` whose batch and channel dims are swapped in memory."""
    return RNG.standard_normal((shape[1], shape[0]) + tuple(shape[2:])).swapaxes(0, 1)


# ------------------------------------------------------------------ interpolate

SPECS = [dict(size=1), dict(size=3), dict(size=8), dict(size=13), dict(scale_factor=2), dict(scale_factor=0.5),
         dict(scale_factor=1.7), dict(scale_factor=0.6), dict(scale_factor=2.3, recompute_scale_factor=True),
         dict(scale_factor=3.0), dict(scale_factor=1 / 3)]
MODES = [("nearest", 1), ("nearest", 2), ("nearest", 3), ("nearest-exact", 1), ("nearest-exact", 2), ("area", 1),
         ("area", 2), ("linear", 1), ("bilinear", 2), ("bicubic", 2), ("trilinear", 3)]


def _interpolate_case(mode, dims, spec, align_corners, n=5):
    kwargs = dict(spec, mode=mode)
    if align_corners is not None:
        kwargs["align_corners"] = align_corners
    return _noncontiguous((2, 3) + (n,) * dims), kwargs


@pytest.mark.parametrize("spec", SPECS, ids=str)
@pytest.mark.parametrize("mode,dims", MODES)
def test_interpolate_matches_torch(mode, dims, spec):
    for align_corners in ([None] if mode in ("nearest", "nearest-exact", "area") else [False, True]):
        a, kwargs = _interpolate_case(mode, dims, spec, align_corners)
        _check(lambda x: F.interpolate(x, **kwargs), lambda x: TF.interpolate(x, **kwargs), a)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic", "nearest", "nearest-exact", "area"])
def test_interpolate_per_axis_sizes_and_scales(mode):
    a = RNG.standard_normal((2, 2, 4, 7))
    corners = {} if mode in ("nearest", "nearest-exact", "area") else {"align_corners": False}
    for spec in (dict(size=(9, 3)), dict(size=[2, 11]), dict(scale_factor=(1.5, 0.5)), dict(scale_factor=[2.5, 1.3])):
        kwargs = dict(spec, mode=mode, **corners)
        _check(lambda x: F.interpolate(x, **kwargs), lambda x: TF.interpolate(x, **kwargs), a)


@pytest.mark.parametrize("mode,dims", MODES)
def test_interpolate_float32_matches_torch(mode, dims):
    """float32 runs PyTorch's index math in float32 (floor of j * scale lands on the same pixel)."""
    a = RNG.standard_normal((1, 2) + (10,) * dims).astype(np.float32)
    for spec in (dict(size=3), dict(size=7), dict(scale_factor=2.3), dict(scale_factor=0.7)):
        kwargs = dict(spec, mode=mode)
        fo = F.interpolate(frost.tensor(a), **kwargs)
        assert fo.dtype == frost.float32
        np.testing.assert_allclose(fo.numpy(), TF.interpolate(torch.tensor(a), **kwargs).numpy(), rtol=1e-5,
                                   atol=1e-5)


@pytest.mark.parametrize("mode,dims", [("linear", 1), ("bicubic", 2), ("area", 2), ("nearest", 2), ("trilinear", 3)])
def test_interpolate_taps_path_for_long_axes(mode, dims, monkeypatch):
    """Axes too long for a dense weight matrix gather the taps forward and scatter-add them back."""
    monkeypatch.setattr(resample, "_DENSE_LIMIT", 0)
    for spec in (dict(scale_factor=1.7), dict(size=3)):
        kwargs = dict(spec, mode=mode)
        _check(lambda x: F.interpolate(x, **kwargs), lambda x: TF.interpolate(x, **kwargs),
               _noncontiguous((2, 3) + (5,) * dims))


def test_nearest_on_integers_and_bicubic_overshoot():
    a = RNG.integers(0, 255, (1, 3, 5, 6)).astype(np.uint8)
    out = F.interpolate(frost.tensor(a), scale_factor=1.5, mode="nearest")
    assert out.dtype == frost.uint8
    np.testing.assert_array_equal(out.numpy(), TF.interpolate(torch.tensor(a), scale_factor=1.5).numpy())
    # A = -0.75 rings past a step edge: the values leave [0, 1], as PyTorch's (no clamping of values)
    step = np.repeat(np.array([0.0, 0.0, 1.0, 1.0])[None, None, None], 4, axis=2)
    _check(lambda x: F.interpolate(x, size=(4, 9), mode="bicubic"),
           lambda x: TF.interpolate(x, size=(4, 9), mode="bicubic"), step)
    assert F.interpolate(frost.tensor(step), size=(4, 9), mode="bicubic").numpy().min() < 0


@pytest.mark.parametrize("mode,dims,scale", [("nearest", 1, 1.1), ("nearest", 3, 2.3), ("bicubic", 2, 1.1)])
def test_interpolate_gradient_is_the_adjoint_where_torch_takes_shortcuts(mode, dims, scale):
    """Where the output size equals the input size (or twice it) but the scale factor says otherwise, PyTorch's
    backward copies (or halves) while its forward follows the scale factor; frost's gradient is the true one: the
    transpose of the forward map, so <A x, u> = <x, A^T u>."""
    a = RNG.standard_normal((1, 2) + (3,) * dims)
    kwargs = dict(scale_factor=scale, mode=mode)
    _check(lambda x: F.interpolate(x, **kwargs), lambda x: TF.interpolate(x, **kwargs), a, grads=False)
    x = frost.tensor(a, requires_grad=True)
    out = F.interpolate(x, **kwargs)
    up = RNG.standard_normal(out.shape)
    (out * frost.tensor(up)).sum().backward()
    np.testing.assert_allclose(np.sum(out.detach().numpy() * up), np.sum(a * x.grad.numpy()), rtol=1e-12)


def test_interpolate_errors():
    x = frost.ones(1, 2, 4, 4)
    with pytest.raises(ValueError, match="interpolate: unknown mode 'cubic'"):
        F.interpolate(x, size=2, mode="cubic")
    with pytest.raises(NotImplementedError, match=r"interpolate: mode 'linear' needs a 3-D input, got shape "
                                                  r"\(1, 2, 4, 4\)"):
        F.interpolate(x, size=2, mode="linear")
    with pytest.raises(NotImplementedError, match=r"only 3-D, 4-D and 5-D inputs .* got shape \(2, 4\)"):
        F.interpolate(frost.ones(2, 4), size=2)
    with pytest.raises(ValueError, match="interpolate: align_corners can only be set .* got mode 'nearest'"):
        F.interpolate(x, size=2, align_corners=False)
    with pytest.raises(ValueError, match="exactly one of size and scale_factor"):
        F.interpolate(x, size=2, scale_factor=2)
    with pytest.raises(ValueError, match="exactly one of size and scale_factor"):
        F.interpolate(x)
    with pytest.raises(ValueError, match=r"interpolate: size \(2, 2, 2\) must have one entry per spatial dim"):
        F.interpolate(x, size=(2, 2, 2))
    with pytest.raises(TypeError, match="interpolate: size must be an int"):
        F.interpolate(x, size=2.5)
    with pytest.raises(ValueError, match="recompute_scale_factor is not meaningful with an explicit size"):
        F.interpolate(x, size=2, recompute_scale_factor=True)
    with pytest.raises(RuntimeError, match=r"greater than 0, got input \(4, 4\) and output \(0, 0\)"):
        F.interpolate(x, scale_factor=0.2)
    with pytest.raises(RuntimeError, match="interpolate: mode 'bilinear' needs a floating-point input, got int64"):
        F.interpolate(frost.zeros(1, 1, 2, 2, dtype=frost.int64), size=3, mode="bilinear")
    with pytest.raises(RuntimeError, match=r"non-empty channel and spatial dims, got shape \(1, 0, 4, 4\)"):
        F.interpolate(frost.ones(1, 0, 4, 4), size=2)
    with pytest.raises(NotImplementedError, match="antialias"):
        F.interpolate(x, size=2, mode="bilinear", antialias=True)
    with pytest.raises(TypeError, match="interpolate: expected input to be a Tensor, got ndarray"):
        F.interpolate(np.ones((1, 1, 2)), size=3)


# ------------------------------------------------------------------ pixel shuffle


@pytest.mark.parametrize("shape,factor", [((2, 8, 3, 5), 2), ((18, 2, 3), 3), ((2, 1, 4, 3, 2), 2), ((1, 5, 2, 2), 1)])
def test_pixel_shuffle_matches_torch(shape, factor):
    a = RNG.standard_normal(shape).swapaxes(-1, -2).copy().swapaxes(-1, -2)  # strides of a transposed array
    a = a[..., ::-1]  # and negative ones
    _check(lambda x: F.pixel_shuffle(x, factor), lambda x: TF.pixel_shuffle(x, factor), a, atol=0)
    shuffled = TF.pixel_shuffle(torch.tensor(a.copy()), factor).numpy()
    _check(lambda x: frost.pixel_unshuffle(x, factor), lambda x: TF.pixel_unshuffle(x, factor), shuffled, atol=0)


def test_pixel_shuffle_errors():
    with pytest.raises(RuntimeError, match=r"pixel_shuffle: the channel dim \(-3\) of input \(1, 6, 2, 2\) must be "
                                           r"divisible by upscale_factor\^2 = 4, got 6"):
        F.pixel_shuffle(frost.ones(1, 6, 2, 2), 2)
    with pytest.raises(RuntimeError, match=r"pixel_unshuffle: height and width of input \(1, 1, 4, 5\) must be "
                                           "divisible by downscale_factor 2"):
        F.pixel_unshuffle(frost.ones(1, 1, 4, 5), 2)
    with pytest.raises(RuntimeError, match=r"pixel_shuffle: expected an input of at least 3 dims .* got shape "
                                           r"\(4, 4\)"):
        F.pixel_shuffle(frost.ones(4, 4), 2)
    with pytest.raises(RuntimeError, match="pixel_unshuffle: downscale_factor must be a positive int, got 0"):
        F.pixel_unshuffle(frost.ones(1, 1, 4, 4), 0)


# ------------------------------------------------------------------ unfold / fold

GEOMETRIES = [dict(kernel_size=2), dict(kernel_size=(2, 3), stride=(2, 1)), dict(kernel_size=3, padding=1),
              dict(kernel_size=(3, 2), dilation=(2, 1), padding=(1, 2), stride=(1, 3)),
              dict(kernel_size=1, stride=2)]


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
@pytest.mark.parametrize("batched", [True, False])
def test_unfold_and_fold_match_torch(geometry, batched):
    shape = (2, 3, 7, 8) if batched else (3, 7, 8)
    a = RNG.standard_normal(shape)[..., ::-1]
    _check(lambda x: F.unfold(x, **geometry), lambda x: TF.unfold(x, **geometry), a)
    cols = TF.unfold(torch.tensor(a.copy()), **geometry).numpy()[..., ::-1].copy()
    _check(lambda x: F.fold(x, (7, 8), **geometry), lambda x: TF.fold(x, (7, 8), **geometry), cols)


def test_fold_of_unfold_counts_the_overlaps():
    """fold(unfold(x)) multiplies each pixel by the number of blocks that cover it, as PyTorch documents."""
    x = frost.ones(1, 1, 4, 4)
    counts = F.fold(F.unfold(x, 2, stride=1), (4, 4), 2, stride=1)
    np.testing.assert_array_equal(counts.numpy()[0, 0], [[1, 2, 2, 1], [2, 4, 4, 2], [2, 4, 4, 2], [1, 2, 2, 1]])


def test_unfold_fold_errors():
    with pytest.raises(RuntimeError, match=r"unfold: expected a 3-D \(C, H, W\) or 4-D .* got shape \(4, 4\)"):
        F.unfold(frost.ones(4, 4), 2)
    with pytest.raises(RuntimeError, match=r"unfold: spatial size \(4, 4\) with kernel_size=\(5, 5\).* gives "
                                           r"\(0, 0\) sliding blocks"):
        F.unfold(frost.ones(1, 1, 4, 4), 5)
    with pytest.raises(RuntimeError, match="unfold: kernel_size, dilation and stride must be positive"):
        F.unfold(frost.ones(1, 1, 4, 4), 2, stride=0)
    with pytest.raises(RuntimeError, match=r"fold: dim -2 of input \(1, 5, 9\) must be divisible by the kernel's "
                                           "2 \\* 2 = 4 elements, got 5"):
        F.fold(frost.ones(1, 5, 9), (4, 4), 2, stride=1)
    with pytest.raises(RuntimeError, match=r"fold: .* give 3 \* 3 = 9 sliding blocks, but dim -1 of input "
                                           r"\(1, 4, 8\) is 8"):
        F.fold(frost.ones(1, 4, 8), (4, 4), 2, stride=1)
    with pytest.raises(ValueError, match=r"fold: output_size must be an int or 2 ints, got \(4, 4, 4\)"):
        F.fold(frost.ones(1, 4, 9), (4, 4, 4), 2)


# ------------------------------------------------------------------ max unpooling


@pytest.mark.parametrize("kwargs", [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
                                    dict(kernel_size=(2, 3), stride=(1, 2))], ids=str)
def test_max_unpool2d_matches_torch(kwargs):
    a = RNG.standard_normal((2, 3, 6, 8))
    values, indices = TF.max_pool2d(torch.tensor(a), return_indices=True, **kwargs)
    frost_values, frost_indices = F.max_pool2d(frost.tensor(a), return_indices=True, **kwargs)
    np.testing.assert_array_equal(frost_indices.numpy(), indices.numpy())
    idx = frost.tensor(indices.numpy())
    # the pooled input's size; the default size (in - 1) * stride - 2 * padding + kernel can be smaller
    _check(lambda x: F.max_unpool2d(x, idx, output_size=(6, 8), **kwargs),
           lambda x: TF.max_unpool2d(x, indices, output_size=(6, 8), **kwargs), values.numpy(), atol=0)
    unbatched = F.max_unpool2d(frost.tensor(values.numpy()[0]), frost.tensor(indices.numpy()[0]),
                               output_size=(6, 8), **kwargs)
    np.testing.assert_array_equal(unbatched.numpy(), TF.max_unpool2d(values[0], indices[0], output_size=(6, 8),
                                                                     **kwargs).numpy())


def test_max_unpool2d_default_size():
    a = RNG.standard_normal((2, 3, 6, 8))[..., ::-1]
    values, indices = TF.max_pool2d(torch.tensor(a.copy()), 2, return_indices=True)
    idx = frost.tensor(indices.numpy())
    _check(lambda x: F.max_unpool2d(x, idx, 2), lambda x: TF.max_unpool2d(x, indices, 2), values.numpy(), atol=0)


@pytest.mark.parametrize("kwargs", [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1)], ids=str)
def test_max_unpool1d_matches_torch(kwargs):
    a = RNG.standard_normal((2, 3, 9))
    values, indices = TF.max_pool1d(torch.tensor(a), return_indices=True, **kwargs)
    idx = frost.tensor(indices.numpy())
    _check(lambda x: F.max_unpool1d(x, idx, **kwargs), lambda x: TF.max_unpool1d(x, indices, **kwargs),
           values.numpy(), atol=0)
    _check(lambda x: F.max_unpool1d(x, idx, output_size=[2, 3, 9], **kwargs),
           lambda x: TF.max_unpool1d(x, indices, output_size=[2, 3, 9], **kwargs), values.numpy(), atol=0)


def test_max_unpool_errors():
    x, idx = frost.ones(1, 1, 2, 2), frost.tensor([[[[0, 1], [4, 17]]]])
    with pytest.raises(RuntimeError, match=r"max_unpool2d: found an invalid max index 17 \(output planes are of "
                                           r"size 4 x 4\)"):
        F.max_unpool2d(x, idx, 2)
    with pytest.raises(ValueError, match=r"max_unpool2d: invalid output_size \(6, 4\) \(dim 0 must be between 2 "
                                         r"and 6, exclusive\)"):
        F.max_unpool2d(x, frost.zeros(1, 1, 2, 2, dtype=frost.int64), 2, output_size=(6, 4))
    with pytest.raises(RuntimeError, match=r"max_unpool2d: indices must be an int64 tensor of the input's shape "
                                           r"\(1, 1, 2, 2\), got int64 of shape \(1, 4\)"):
        F.max_unpool2d(x, frost.zeros(1, 4, dtype=frost.int64), 2)
    with pytest.raises(RuntimeError, match=r"max_unpool1d: expected a 2-D or 3-D input, got shape \(1, 1, 2, 2\)"):
        F.max_unpool1d(x, idx, 2)


# ------------------------------------------------------------------ GPU


@pytest.mark.cuda
@pytest.mark.parametrize("fn", [
    lambda x: F.interpolate(x, scale_factor=1.7, mode="bilinear", align_corners=False),
    lambda x: F.interpolate(x, size=(5, 9), mode="bicubic", align_corners=True),
    lambda x: F.interpolate(x, scale_factor=2.3, mode="nearest"),
    lambda x: F.interpolate(x, size=(3, 4), mode="area"),
    lambda x: F.pixel_unshuffle(x, 2),
    lambda x: F.fold(F.unfold(x, 3, padding=1, stride=2), (6, 8), 3, padding=1, stride=2),
])
def test_resample_cuda_matches_cpu(fn):
    a = RNG.standard_normal((2, 3, 6, 8))
    up = RNG.standard_normal(fn(frost.tensor(a)).shape)
    results = []
    for device in ("cpu", "cuda"):
        x = frost.tensor(a, device=device, requires_grad=True)
        out = fn(x)
        out.backward(frost.tensor(up, device=device))
        results.append((out.detach().cpu().numpy(), x.grad.cpu().numpy()))
    for cpu_result, gpu_result in zip(*results):
        np.testing.assert_allclose(gpu_result, cpu_result, rtol=1e-10, atol=1e-12)


@pytest.mark.cuda
def test_max_unpool2d_cuda_matches_cpu():
    a = RNG.standard_normal((2, 3, 6, 8))
    results = []
    for device in ("cpu", "cuda"):
        values, indices = F.max_pool2d(frost.tensor(a, device=device), 2, return_indices=True)
        x = values.detach().requires_grad_()
        out = F.max_unpool2d(x, indices, 2)
        out.sum().backward()
        results.append((out.detach().cpu().numpy(), x.grad.cpu().numpy()))
    for cpu_result, gpu_result in zip(*results):
        np.testing.assert_array_equal(gpu_result, cpu_result)
