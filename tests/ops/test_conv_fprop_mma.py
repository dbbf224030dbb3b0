"""The tensor-core forward convolution (frost/accel/conv_fprop_mma.py): simulator vs float64 sums of the same bf16
values, its plans and support rules, sm_90 compiles at the seed ResNet's stride-1 shapes, and (on a GPU) the
float64 sums, `choose` and conv2d with it."""
import ml_dtypes
import numpy as np
import pytest

import frost
from frost.layout import as_channels_last
from frost.accel import conv_fprop_mma as fm


def fprop64(x, w, padding, stride=(1, 1)):
    """The float64 twin: y[n, co, ho, wo] = sum over ci, kh, kw of w * the zero-padded x (at the stride)."""
    (ph, pw), (sh, sw) = padding, stride
    _, _, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    ho, wo = (xp.shape[2] - kh) // sh + 1, (xp.shape[3] - kw) // sw + 1
    return sum(np.einsum("nchw,oc->nohw", xp[:, :, i:i + sh * (ho - 1) + 1:sh, j:j + sw * (wo - 1) + 1:sw],
                         w[:, :, i, j].astype(np.float64)) for i in range(kh) for j in range(kw))


def _inputs(n, cin, cout, h, wd, k, padding, seed=0, stride=(1, 1)):
    rng = np.random.default_rng(seed)
    kh, kw = (k, k) if isinstance(k, int) else k
    x = rng.standard_normal((n, cin, h, wd)).astype(ml_dtypes.bfloat16)
    w = (rng.standard_normal((cout, cin, kh, kw)) / 4).astype(ml_dtypes.bfloat16)
    return (as_channels_last(x), as_channels_last(w),
            fprop64(x.astype(np.float32), w.astype(np.float32), padding, stride))


# (N, Cin, Cout, H, W, k, padding, plan keywords): tiles that overrun the image rows (HO % R), pixels past 16-row
# m-tiles (R * WO % 16), several output-channel blocks (BN < Cout) and a partial one, several k steps per tap, a warp
# with two m-tiles, 1x1 and 1x3 kernels, no padding.
CASES = [
    ((2, 16, 16, 5, 6, 3, (1, 1)), dict(R=2, WARPS=1)),            # 12-pixel tiles, HO 5 = 2 + 2 + 1
    ((1, 32, 24, 6, 8, 3, (1, 1)), dict(R=3, BN=16, WARPS=1)),     # Cout 24 = 16 + 8 (a partial block); 2 k steps
    ((1, 16, 8, 4, 8, 1, (0, 0)), dict(R=4, WARPS=2)),             # 1x1
    ((1, 16, 16, 5, 7, (1, 3), (0, 1)), dict(R=3, WARPS=2)),       # 1x3, 21-pixel tiles
    ((2, 16, 16, 6, 6, 3, (0, 0)), {}),                            # no padding: 4x4 out, defaults
    ((1, 32, 24, 6, 8, 3, (1, 1)), dict(R=3, BN=16, WARPS=1, KSPLIT=2)),   # taps shared by 2 groups of warps
    ((2, 16, 16, 5, 7, (1, 3), (0, 1)), dict(R=3, WARPS=2, KSPLIT=3)),    # ... by 3: one tap each
]


@pytest.mark.parametrize("shape,tiles", CASES)
def test_simulated_kernel_matches_float64(shape, tiles):
    n, cin, cout, h, wd, k, padding = shape
    x, w, want = _inputs(*shape, seed=len(str(shape)))
    out = as_channels_last(np.full(want.shape, np.nan, ml_dtypes.bfloat16))
    fm.conv2d_forward_gpu(x, w, padding, out, tiles=tiles, simulate=True)
    np.testing.assert_allclose(out.astype(np.float32), want, rtol=1e-2, atol=1e-2)   # bf16 out: one rounding
    assert np.abs(out.astype(np.float64) - want).max() <= 2 ** -8 * np.abs(want).max()



def tile_stats64(y, R):
    """Batch norm's partials of y (N, C, HO, WO) over tiles of R rows of one image, float64: (mean, M2) as [C][split]
    arrays, split = image * HO/R + tile."""
    n, c, ho, wo = y.shape
    tiles = y.astype(np.float64).reshape(n, c, ho // R, R * wo).transpose(1, 0, 2, 3).reshape(c, -1, R * wo)
    mean = tiles.mean(axis=2)
    return mean, ((tiles - mean[..., None]) ** 2).sum(axis=2)


# (N, Cin, Cout, H, W, k, padding, stride, plan keywords): whole tiles (HO a multiple of R) with pixels past the
# 16-row m-tiles (R * WO = 12), two channel blocks and a partial one, two m-tiles per warp, KSPLIT, stride 2
STATS_CASES = [
    ((2, 16, 16, 4, 6, 3, (1, 1)), (1, 1), dict(R=2, WARPS=1)),
    ((1, 32, 24, 6, 8, 3, (1, 1)), (1, 1), dict(R=3, BN=16, WARPS=1, KSPLIT=2)),
    ((2, 16, 8, 8, 8, 3, (1, 1)), (1, 1), dict(R=4, WARPS=1)),
    ((2, 16, 32, 8, 8, 3, (1, 1)), (2, 2), dict(R=2, BN=16, WARPS=2)),
]


@pytest.mark.parametrize("shape,stride,tiles", STATS_CASES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_simulated_kernel_makes_batch_norm_partials_of_y_as_stored(shape, stride, tiles, dtype):
    x, w, want = _inputs(*shape, seed=len(str(shape)), stride=stride)
    x, w = as_channels_last(x.astype(dtype)), as_channels_last(w.astype(dtype))
    out = as_channels_last(np.full(want.shape, np.nan, x.dtype))
    out, stats = fm.conv2d_forward_gpu_stats(x, w, shape[6], out, tiles=tiles, simulate=True, stride=stride)
    assert np.abs(out.astype(np.float64) - want).max() <= 2 ** -8 * np.abs(want).max()
    R, (n, cout, ho, wo) = tiles["R"], want.shape
    assert stats.y is out and (stats.splits, stats.chunk) == (n * ho // R, R * wo)
    mean, m2 = tile_stats64(out, R)   # of the values stored (bf16: rounded), so batch norm sees what it normalizes
    np.testing.assert_allclose(stats.part_mean.reshape(cout, -1), mean, rtol=1e-5, atol=1e-6 * np.abs(mean).max())
    np.testing.assert_allclose(stats.part_m2.reshape(cout, -1), m2, rtol=1e-5)


# channel counts the kernel pads in shared memory: (N, Cin, Cout, H, W, k, padding, plan keywords): the stem's 3 (odd
# rows, read an element at a time), 8 (whole 16-byte pieces, less than one bf16 mma step), 4 (one f32 piece, half a
# TF32 step) and 24 (one and a half bf16 steps), with statistics (whole tiles), a partial channel block and KSPLIT
PADDED_CASES = [
    ((2, 3, 16, 4, 6, 3, (1, 1)), dict(R=2, WARPS=1)),
    ((1, 8, 8, 4, 8, 3, (1, 1)), dict(R=2, WARPS=2)),
    ((1, 4, 24, 4, 4, 3, (1, 1)), dict(R=2, BN=16, WARPS=1)),
    ((1, 24, 8, 4, 4, 3, (1, 1)), dict(R=2, WARPS=1, KSPLIT=2)),
]


@pytest.mark.parametrize("shape,tiles", PADDED_CASES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_simulated_kernel_pads_channels_that_are_not_whole_mma_steps(shape, tiles, dtype):
    x, w, want = _inputs(*shape, seed=len(str(shape)))
    x, w = as_channels_last(x.astype(dtype)), as_channels_last(w.astype(dtype))
    assert fm.supported(x, w, (1, 1), shape[6], (1, 1), 1)
    assert fm.padded_channels(shape[1], x.dtype.itemsize) == -(-shape[1] // (32 // x.dtype.itemsize)) * (
        32 // x.dtype.itemsize)
    out = as_channels_last(np.full(want.shape, np.nan, x.dtype))
    out, stats = fm.conv2d_forward_gpu_stats(x, w, shape[6], out, tiles=tiles, simulate=True)
    assert np.abs(out.astype(np.float64) - want).max() <= 2 ** -8 * np.abs(want).max()
    mean, m2 = tile_stats64(out, tiles["R"])
    np.testing.assert_allclose(stats.part_mean.reshape(shape[2], -1), mean, rtol=1e-5, atol=1e-6 * np.abs(mean).max())
    np.testing.assert_allclose(stats.part_m2.reshape(shape[2], -1), m2, rtol=1e-5)


def test_partial_tiles_and_input_gradients_make_no_statistics():
    x, w, want = _inputs(2, 16, 16, 5, 6, 3, (1, 1))
    out = as_channels_last(np.full(want.shape, np.nan, x.dtype))
    out, stats = fm.conv2d_forward_gpu_stats(x, w, (1, 1), out, tiles=dict(R=2, WARPS=1), simulate=True)
    assert stats is None   # HO 5 = 2 + 2 + 1: the last tile of each image is short
    assert np.abs(out.astype(np.float64) - want).max() <= 2 ** -8 * np.abs(want).max()
    dx = as_channels_last(np.zeros(want.shape, x.dtype))
    assert fm.conv2d_forward_gpu_stats(x, w, (1, 1), dx, tiles=dict(R=2, WARPS=1), simulate=True, flip=True)[1] is None
    geo = fm.geometry((2, 16, 16, 16), (64, 16, 3, 3), (1, 1))
    assert fm.makes_stats(fm.fprop_plan(geo, 2, R=8, WARPS=4))
    assert not fm.makes_stats(fm.fprop_plan(geo, 2, R=8, WARPS=8))   # 8 warps x 64 channels: more than the slots

# stride 2: (N, Cin, Cout, H, W, k, padding, stride, plan keywords): a 3x3 one whose tiles overrun the image (7x7 in,
# 4x4 out), a 1x1 shortcut (no padding), a tile of 2 output rows over a 5-row halo
STRIDED_CASES = [
    ((2, 16, 32, 7, 7, 3, (1, 1)), (2, 2), dict(R=3, BN=16, WARPS=1)),
    ((2, 16, 32, 8, 8, 1, (0, 0)), (2, 2), {}),
    ((1, 32, 16, 8, 6, 3, (1, 1)), (2, 2), dict(R=2, WARPS=1, KSPLIT=2)),
]


@pytest.mark.parametrize("shape,stride,tiles", STRIDED_CASES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_simulated_strided_kernel_matches_float64(shape, stride, tiles, dtype):
    x, w, want = _inputs(*shape, seed=len(str(shape)), stride=stride)
    if dtype == "float32":   # TF32 sums of the bf16 values (exact in TF32 too)
        x, w = as_channels_last(x.astype(np.float32)), as_channels_last(w.astype(np.float32))
    assert fm.supported(x, w, stride, shape[6], (1, 1), 1)
    out = as_channels_last(np.full(want.shape, np.nan, x.dtype))
    fm.conv2d_forward_gpu(x, w, shape[6], out, tiles=tiles, simulate=True, stride=stride)
    assert np.abs(out.astype(np.float64) - want).max() <= 2 ** -8 * np.abs(want).max()


@pytest.mark.parametrize("h,w", [(8, 8), (7, 9)])   # dx of even size (its last row and column zero) and odd
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_simulated_input_gradient_of_a_strided_1x1_convolution(h, w, dtype):
    import torch
    rng = np.random.default_rng(h * w)
    weight = (rng.standard_normal((32, 16, 1, 1)) / 4).astype(ml_dtypes.bfloat16)
    dy = rng.standard_normal((2, 32, (h - 1) // 2 + 1, (w - 1) // 2 + 1)).astype(ml_dtypes.bfloat16)
    want = torch.nn.grad.conv2d_input((2, 16, h, w), torch.tensor(weight.astype(np.float64)),
                                      torch.tensor(dy.astype(np.float64)), stride=2).numpy()
    dy, weight = as_channels_last(dy.astype(dtype)), as_channels_last(weight.astype(dtype))
    assert fm.supported(dy, weight, (2, 2), (0, 0), (1, 1), 1, flip=True)
    out = as_channels_last(np.full(want.shape, np.nan, dy.dtype))
    fm.conv2d_forward_gpu(dy, weight, (0, 0), out, tiles=dict(R=2, WARPS=1), simulate=True, flip=True, stride=(2, 2))
    assert np.abs(out.astype(np.float64) - want).max() <= 2 ** -8 * np.abs(want).max()
    assert (out[:, :, 1::2] == 0).all() and (out[:, :, :, 1::2] == 0).all()   # no tap reaches the odd pixels
    assert not fm.supported(dy, weight, (2, 1), (0, 0), (1, 1), 1, flip=True)   # unequal strides: cuDNN's


# input gradients of strided convolutions with a kernel (DOWN: dy read spread apart): (N, Cin, Cout, H, W, k,
# padding, stride, plan keywords); dx of even and odd sizes, a tile overrunning dx's rows
STRIDED_FLIP_CASES = [
    ((2, 16, 32, 8, 8, 3, (1, 1)), 2, dict(R=2, WARPS=1)),
    ((1, 16, 16, 7, 9, 3, (1, 1)), 2, dict(R=3, BN=8, WARPS=2)),
    ((1, 16, 16, 9, 8, 3, (0, 1)), 3, dict(R=4, WARPS=1, KSPLIT=2)),
]


@pytest.mark.parametrize("shape,s,tiles", STRIDED_FLIP_CASES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_simulated_input_gradient_of_a_strided_convolution(shape, s, tiles, dtype):
    import torch
    n, cin, cout, h, wd, k, padding = shape
    rng = np.random.default_rng(h * wd + s)
    weight = (rng.standard_normal((cout, cin, k, k)) / 4).astype(ml_dtypes.bfloat16)
    ho, wo = (h + 2 * padding[0] - k) // s + 1, (wd + 2 * padding[1] - k) // s + 1
    dy = rng.standard_normal((n, cout, ho, wo)).astype(ml_dtypes.bfloat16)
    want = torch.nn.grad.conv2d_input((n, cin, h, wd), torch.tensor(weight.astype(np.float64)),
                                      torch.tensor(dy.astype(np.float64)), stride=s, padding=padding).numpy()
    dy, weight = as_channels_last(dy.astype(dtype)), as_channels_last(weight.astype(dtype))
    assert fm.supported(dy, weight, (s, s), padding, (1, 1), 1, flip=True)
    assert fm.geometry(dy.shape, weight.shape, padding, True, (s, s), (h, wd))["DOWN"] == s
    out = as_channels_last(np.full(want.shape, np.nan, dy.dtype))
    fm.conv2d_forward_gpu(dy, weight, padding, out, tiles=tiles, simulate=True, flip=True, stride=(s, s))
    assert np.abs(out.astype(np.float64) - want).max() <= 2 ** -8 * np.abs(want).max()


# input gradients of stride-1 convolutions as forward ones (flip): (N, Cin, Cout, H, W, k, padding, plan keywords)
FLIP_CASES = [
    ((2, 16, 16, 5, 6, 3, (1, 1)), dict(R=2, WARPS=1)),
    ((1, 24, 32, 6, 8, 3, (1, 1)), dict(R=3, BN=16, WARPS=1)),     # dx channels 24 = 16 + 8; dy channels 32
    ((1, 8, 16, 5, 7, (1, 3), (0, 1)), dict(R=3, WARPS=2)),        # 1x3, dx channels 8
    ((2, 16, 16, 6, 6, 3, (0, 0)), {}),                            # no padding: dy 4x4, dx 6x6
    ((1, 24, 32, 6, 8, 3, (1, 1)), dict(R=3, BN=16, WARPS=2, KSPLIT=3)),
]


@pytest.mark.parametrize("shape,tiles", FLIP_CASES)
def test_simulated_input_gradient_matches_torch_float64(shape, tiles):
    import torch
    n, cin, cout, h, wd, k, padding = shape
    x, w, y = _inputs(*shape, seed=len(str(shape)))
    rng = np.random.default_rng(7)
    dy = as_channels_last(rng.standard_normal(y.shape).astype(ml_dtypes.bfloat16))
    want = torch.nn.grad.conv2d_input(x.shape, torch.tensor(w.astype(np.float64)), torch.tensor(dy.astype(np.float64)),
                                      padding=padding).numpy()
    out = as_channels_last(np.full(x.shape, np.nan, ml_dtypes.bfloat16))
    fm.conv2d_forward_gpu(dy, w, padding, out, tiles=tiles, simulate=True, flip=True)
    assert np.abs(out.astype(np.float64) - want).max() <= 2 ** -8 * np.abs(want).max()


def _on_gpu(a, dtype=None):
    """A channels-last copy on the GPU ((N, H, W, C) memory seen as NCHW), in `dtype` when given."""
    import cupy as cp
    nhwc = np.ascontiguousarray(a.transpose(0, 2, 3, 1))
    return cp.asarray(nhwc if dtype is None else nhwc.astype(dtype)).transpose(0, 3, 1, 2)


def _nan_channels_last(shape, dtype):
    """An NCHW-shaped output with channels-last memory, every byte 0xFF (NaN in float32 and bf16), made without a
    copy: an element a kernel leaves unwritten then fails the comparison, as the CPU tests' NaN-filled outputs do
    (as_channels_last of a cp.empty copied memory nothing wrote, which initcheck reported: H100, ff5e4f2)."""
    import cupy as cp
    n, c, h, w = shape
    return cp.full((n, h, w, c * np.dtype(dtype).itemsize), 0xFF, cp.uint8).view(dtype).transpose(0, 3, 1, 2)


def _tf32(a):
    """float32 values as the tensor cores read TF32 operands (the low 13 mantissa bits dropped), in float64."""
    return (a.astype(np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)


@pytest.mark.parametrize("shape,tiles", CASES)
def test_simulated_tf32_kernel_matches_float64_of_tf32_operands(shape, tiles):
    """float32 x and w (channels-last) on TF32: the sums of the operands' TF32 values, float32 out."""
    n, cin, cout, h, wd, k, padding = shape
    rng = np.random.default_rng(len(str(shape)))
    kh, kw = (k, k) if isinstance(k, int) else k
    x = rng.standard_normal((n, cin, h, wd)).astype(np.float32)
    w = (rng.standard_normal((cout, cin, kh, kw)) / 4).astype(np.float32)
    want = fprop64(_tf32(x), _tf32(w), padding)
    out = as_channels_last(np.full(want.shape, np.nan, np.float32))
    fm.conv2d_forward_gpu(as_channels_last(x), as_channels_last(w), padding, out, tiles=tiles, simulate=True)
    scale = np.abs(want).max()
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-6 * scale)
    exact = fprop64(x, w, padding)
    assert 1e-6 * scale < np.abs(out - exact).max() <= 2 ** -9 * scale   # TF32, not float32 sums


@pytest.mark.parametrize("shape,tiles", FLIP_CASES[:2])
def test_simulated_tf32_input_gradient_matches_float64_of_tf32_operands(shape, tiles):
    import torch
    n, cin, cout, h, wd, k, padding = shape
    rng = np.random.default_rng(len(str(shape)))
    w = (rng.standard_normal((cout, cin, k, k)) / 4).astype(np.float32)
    ho, wo = h + 2 * padding[0] - k + 1, wd + 2 * padding[1] - k + 1
    dy = rng.standard_normal((n, cout, ho, wo)).astype(np.float32)
    want = torch.nn.grad.conv2d_input((n, cin, h, wd), torch.tensor(_tf32(w)), torch.tensor(_tf32(dy)),
                                      padding=padding).numpy()
    out = as_channels_last(np.full(want.shape, np.nan, np.float32))
    fm.conv2d_forward_gpu(as_channels_last(dy), as_channels_last(w), padding, out, tiles=tiles, simulate=True,
                          flip=True)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-6 * np.abs(want).max())


def test_plans_and_support(monkeypatch):
    geo = fm.geometry((32, 16, 32, 32), (16, 16, 3, 3), (1, 1))
    plan = fm.fprop_plan(geo, 32)
    assert plan.consts["R"] == 2 and plan.grid == (512, 1) and plan.threads == 128 and plan.smem <= fm.smem_budget(2)
    big = fm.fprop_plan(fm.geometry((32, 64, 8, 8), (64, 64, 3, 3), (1, 1)), 32)
    assert big.smem <= fm.smem_budget(2) and big.grid[1] * big.consts["BN"] >= 64
    x = as_channels_last(np.zeros((2, 16, 8, 8), ml_dtypes.bfloat16))
    w = as_channels_last(np.zeros((16, 16, 3, 3), ml_dtypes.bfloat16))
    assert fm.supported(x, w, (1, 1), (1, 1), (1, 1), 1)
    assert fm.supported(x, w, (2, 2), (1, 1), (1, 1), 1)                             # stride 2 too ...
    assert fm.supported(x, w, (2, 2), (1, 1), (1, 1), 1, flip=True)                  # ... and its dgrad (DOWN) ...
    assert not fm.supported(x, w, (2, 1), (1, 1), (1, 1), 1, flip=True)              # ... but not unequal strides
    assert not fm.supported(x.astype(np.float32), w, (1, 1), (1, 1), (1, 1), 1)      # mixed dtypes: cuDNN
    x32, w32 = as_channels_last(x.astype(np.float32)), as_channels_last(w.astype(np.float32))
    assert fm.supported(x32, w32, (1, 1), (1, 1), (1, 1), 1)                         # float32: TF32 ...
    monkeypatch.setattr(frost.backends, "allow_tf32", False)
    assert not fm.supported(x32, w32, (1, 1), (1, 1), (1, 1), 1)                     # ... only where allowed
    f32_plan = fm.fprop_plan(fm.geometry((32, 64, 8, 8), (64, 64, 3, 3), (1, 1)), 32, item=4)
    assert f32_plan.smem <= fm.smem_budget(4) and f32_plan.tiles() == big.tiles()   # bf16's tiles
    assert not fm.supported(np.ascontiguousarray(x), w, (1, 1), (1, 1), (1, 1), 1)   # NCHW: cuDNN
    x8 = as_channels_last(np.zeros((2, 8, 8, 8), ml_dtypes.bfloat16))
    w8 = as_channels_last(np.zeros((16, 8, 3, 3), ml_dtypes.bfloat16))
    assert fm.supported(x8, w8, (1, 1), (1, 1), (1, 1), 1)                           # Cin 8: padded to 16
    x3 = as_channels_last(np.zeros((2, 3, 8, 8), ml_dtypes.bfloat16))
    assert fm.supported(x3, as_channels_last(np.zeros((16, 3, 3, 3), ml_dtypes.bfloat16)), (1, 1), (1, 1),
                        (1, 1), 1)                                                    # a stem's Cin 3 too
    assert len(fm.candidate_tiles(geo, 32)) >= 3


def test_switched_off_by_the_environment(monkeypatch):
    x = as_channels_last(np.zeros((2, 16, 8, 8), ml_dtypes.bfloat16))
    w = as_channels_last(np.zeros((16, 16, 3, 3), ml_dtypes.bfloat16))
    assert fm.supported(x, w, (1, 1), (1, 1), (1, 1), 1, flip=True)       # input gradients: on by default
    monkeypatch.setenv("FROST_CONV_DGRAD_MMA", "0")
    assert not fm.supported(x, w, (1, 1), (1, 1), (1, 1), 1, flip=True)   # ... and switched off alone
    assert fm.supported(x, w, (1, 1), (1, 1), (1, 1), 1)
    monkeypatch.setenv("FROST_CONV_DGRAD_MMA", "1")
    dy8 = as_channels_last(np.zeros((2, 8, 8, 8), ml_dtypes.bfloat16))
    assert not fm.supported(dy8, as_channels_last(np.zeros((8, 16, 3, 3), ml_dtypes.bfloat16)), (1, 1), (1, 1),
                            (1, 1), 1, flip=True)                                   # dy with 8 channels
    monkeypatch.setenv("FROST_CONV_FPROP_MMA", "0")
    assert not fm.supported(x, w, (1, 1), (1, 1), (1, 1), 1)
    assert not fm.supported(x, w, (1, 1), (1, 1), (1, 1), 1, flip=True)


@pytest.mark.parametrize("cin,cout,h", [(16, 16, 32), (32, 32, 16), (64, 64, 8)])
def test_seed_shapes_candidates_compile_for_sm90(cin, cout, h):
    for flip in (False, True):
        geo = fm.geometry((32, cin, h, h), (cout, cin, 3, 3), (1, 1), flip)
        for t in fm.candidate_tiles(geo, 32, flip):
            plan = fm.fprop_plan(geo, 32, flip=flip, **t)
            assert fm.conv_fprop_mma.compile("sm_90", **plan.consts)[:4] == b"\x7fELF"
        for t in fm.candidate_tiles(geo, 32, flip, item=4):   # float32 on TF32
            plan = fm.fprop_plan(geo, 32, flip=flip, item=4, **t)
            assert fm.KERNELS["float32"].compile("sm_90", **plan.consts)[:4] == b"\x7fELF"


@pytest.mark.parametrize("item,dtype", [(2, "bfloat16"), (4, "float32")])
def test_stem_candidates_compile_for_sm90(item, dtype):
    geo = fm.geometry((32, 3, 32, 32), (16, 3, 3, 3), (1, 1))
    for t in fm.candidate_tiles(geo, 32, item=item):
        plan = fm.fprop_plan(geo, 32, item=item, **t)
        assert fm.KERNELS[dtype].compile("sm_90", **plan.consts, STATS=int(fm.makes_stats(plan)))[:4] == b"\x7fELF"


STRIDED_SEED_SHAPES = [(16, 32, 32, 3), (16, 32, 32, 1), (32, 64, 16, 3), (32, 64, 16, 1)]   # Cin, Cout, H, k


@pytest.mark.parametrize("cin,cout,h,k", STRIDED_SEED_SHAPES)
def test_strided_seed_shapes_candidates_compile_for_sm90(cin, cout, h, k):
    geo = fm.geometry((32, cin, h, h), (cout, cin, k, k), (k // 2, k // 2), stride=(2, 2))
    assert geo["HO"] == geo["WO"] == h // 2
    for item, dtype in ((2, "bfloat16"), (4, "float32")):
        for t in fm.candidate_tiles(geo, 32, item=item):
            plan = fm.fprop_plan(geo, 32, item=item, **t)
            assert fm.KERNELS[dtype].compile("sm_90", **plan.consts)[:4] == b"\x7fELF"


@pytest.mark.cuda
@pytest.mark.parametrize("cin,cout,h,k", STRIDED_SEED_SHAPES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_gpu_strided_candidates_and_conv2d_match_float64(cin, cout, h, k, dtype):
    import cupy as cp

    from frost.ops.conv import conv2d_forward
    pad = (k // 2, k // 2)
    x, w, want = _inputs(32, cin, cout, h, h, k, pad, seed=h + k, stride=(2, 2))


    xd, wd = _on_gpu(x, dtype), _on_gpu(w, dtype)
    scale = np.abs(want).max()
    for t in fm.candidate_tiles(fm.geometry(xd.shape, wd.shape, pad, stride=(2, 2)), 32, item=xd.dtype.itemsize):
        out = fm.conv2d_forward_gpu(xd, wd, pad, _nan_channels_last(want.shape, xd.dtype), tiles=t,
                                    stride=(2, 2))
        assert np.abs(cp.asnumpy(out).astype(np.float64) - want).max() <= 2 ** -8 * scale, t
    for _ in range(2):   # a shape's first call may only queue our candidates (cuDNN runs it); the next one picks
        y = conv2d_forward(xd, wd, 2, k // 2)
        assert np.abs(cp.asnumpy(y).astype(np.float64) - want).max() <= 2 ** -7 * scale
    assert fm._choices.load().get(fm._key(xd, wd, pad, stride=(2, 2))) is not None


@pytest.mark.cuda
@pytest.mark.parametrize("cin,cout,h", [(3, 16, 32), (16, 16, 32), (32, 32, 16), (64, 64, 8)])
def test_gpu_candidates_and_conv2d_match_float64(cin, cout, h):
    import cupy as cp

    from frost.layout import is_channels_last
    from frost.ops.conv import conv2d_forward
    x, w, want = _inputs(32, cin, cout, h, h, 3, (1, 1), seed=h)


    xd, wd = _on_gpu(x), _on_gpu(w)
    scale = np.abs(want).max()
    for t in fm.candidate_tiles(fm.geometry(xd.shape, wd.shape, (1, 1)), 32):
        out = fm.conv2d_forward_gpu(xd, wd, (1, 1), _nan_channels_last(want.shape, xd.dtype), tiles=t)
        assert np.abs(cp.asnumpy(out).astype(np.float64) - want).max() <= 2 ** -8 * scale, t
    for _ in range(2):   # a shape's first call may only queue our candidates (cuDNN runs it); the next one picks
        y = conv2d_forward(xd, wd, 1, 1)
        assert is_channels_last(y) and np.abs(cp.asnumpy(y).astype(np.float64) - want).max() <= 2 ** -7 * scale
    assert fm._choices.load().get(fm._key(xd, wd, (1, 1))) is not None


@pytest.mark.cuda
@pytest.mark.parametrize("cin,cout,h", [(16, 16, 32), (32, 32, 16), (64, 64, 8)])
def test_gpu_input_gradients_match_torch_float64(cin, cout, h, monkeypatch):
    import cupy as cp
    import torch

    from frost.ops.conv import conv2d_backward_input
    monkeypatch.setenv("FROST_CONV_DGRAD_MMA", "1")
    x, w, y = _inputs(32, cin, cout, h, h, 3, (1, 1), seed=h)
    dy = as_channels_last(np.random.default_rng(h).standard_normal(y.shape).astype(ml_dtypes.bfloat16))
    want = torch.nn.grad.conv2d_input(x.shape, torch.tensor(w.astype(np.float64)), torch.tensor(dy.astype(np.float64)),
                                      padding=1).numpy()


    dyd, wd = _on_gpu(dy), _on_gpu(w)
    scale = np.abs(want).max()
    for t in fm.candidate_tiles(fm.geometry(dyd.shape, wd.shape, (1, 1), True), 32, True):
        out = fm.conv2d_forward_gpu(dyd, wd, (1, 1), _nan_channels_last(x.shape, dyd.dtype), tiles=t,
                                    flip=True)
        assert np.abs(cp.asnumpy(out).astype(np.float64) - want).max() <= 2 ** -8 * scale, t
    for _ in range(2):   # a shape's first call may only queue our candidates (cuDNN runs it); the next one picks
        dx = conv2d_backward_input(dyd, wd, x.shape, 1, 1)
        assert np.abs(cp.asnumpy(dx).astype(np.float64) - want).max() <= 2 ** -7 * scale
    assert fm._choices.load().get(fm._key(dyd, wd, (1, 1), True)) is not None


@pytest.mark.cuda
@pytest.mark.parametrize("cin,cout,h", [(16, 16, 32), (32, 32, 16), (64, 64, 8)])
def test_gpu_tf32_forward_and_input_gradient_match_float64(cin, cout, h):
    """float32 on TF32: every candidate, forward and input gradient, within TF32's rounding of the float64 sums,
    and conv2d / conv2d_backward_input with whichever `choose` picked."""
    import cupy as cp
    import torch

    from frost.ops.conv import conv2d_backward_input, conv2d_forward
    rng = np.random.default_rng(h)
    x = rng.standard_normal((32, cin, h, h)).astype(np.float32)
    w = (rng.standard_normal((cout, cin, 3, 3)) / 4).astype(np.float32)
    dy = rng.standard_normal((32, cout, h, h)).astype(np.float32)
    want_y = fprop64(x, w, (1, 1))
    want_dx = torch.nn.grad.conv2d_input(x.shape, torch.tensor(w.astype(np.float64)),
                                         torch.tensor(dy.astype(np.float64)), padding=1).numpy()


    xd, wd, dyd = _on_gpu(x), _on_gpu(w), _on_gpu(dy)
    for src, want, flip in ((xd, want_y, False), (dyd, want_dx, True)):
        scale = np.abs(want).max()
        for t in fm.candidate_tiles(fm.geometry(src.shape, wd.shape, (1, 1), flip), 32, flip, item=4):
            out = fm.conv2d_forward_gpu(src, wd, (1, 1), _nan_channels_last(want.shape, cp.float32), tiles=t,
                                        flip=flip)
            assert np.abs(cp.asnumpy(out) - want).max() <= 2 ** -9 * scale, (t, flip)
    for _ in range(2):   # a shape's first call may only queue our candidates (cuDNN runs it); the next one picks
        y = conv2d_forward(xd, wd, 1, 1)
        assert np.abs(cp.asnumpy(y) - want_y).max() <= 2 ** -9 * np.abs(want_y).max()
    for _ in range(2):
        dx = conv2d_backward_input(dyd, wd, x.shape, 1, 1)
        assert np.abs(cp.asnumpy(dx) - want_dx).max() <= 2 ** -9 * np.abs(want_dx).max()
    assert fm._choices.load().get(fm._key(xd, wd, (1, 1))) is not None


@pytest.mark.cuda
@pytest.mark.parametrize("cin,cout,h", [(16, 32, 32), (32, 64, 16)])
@pytest.mark.parametrize("k,pad", [(1, 0), (3, 1)])   # the shortcuts (UP) and the stride-2 3x3 ones (DOWN)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_gpu_input_gradient_of_the_strided_convolutions_matches_torch_float64(cin, cout, h, k, pad, dtype):
    import cupy as cp
    import torch

    from frost.ops.conv import conv2d_backward_input
    rng = np.random.default_rng(h + k)
    w = (rng.standard_normal((cout, cin, k, k)) / 4).astype(ml_dtypes.bfloat16)
    dy = rng.standard_normal((32, cout, h // 2, h // 2)).astype(ml_dtypes.bfloat16)
    want = torch.nn.grad.conv2d_input((32, cin, h, h), torch.tensor(w.astype(np.float64)),
                                      torch.tensor(dy.astype(np.float64)), stride=2, padding=pad).numpy()
    dyd, wd = _on_gpu(dy, dtype), _on_gpu(w, dtype)
    scale, padding = np.abs(want).max(), (pad, pad)
    geo = fm.geometry(dyd.shape, wd.shape, padding, True, (2, 2), (h, h))
    for t in fm.candidate_tiles(geo, 32, True, dyd.dtype.itemsize):
        out = fm.conv2d_forward_gpu(dyd, wd, padding, as_channels_last(cp.full(want.shape, cp.nan, dyd.dtype)),
                                    tiles=t, flip=True, stride=(2, 2))
        assert np.abs(cp.asnumpy(out).astype(np.float64) - want).max() <= 2 ** -8 * scale, t
    for _ in range(2):   # a shape's first call may only queue our candidates (cuDNN runs it); the next one picks
        dx = conv2d_backward_input(dyd, wd, want.shape, 2, pad)
        assert np.abs(cp.asnumpy(dx).astype(np.float64) - want).max() <= 2 ** -7 * scale
    assert fm._choices.load().get(fm._key(dyd, wd, padding, True, (2, 2), (h, h))) is not None


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("cin,cout,h", [(3, 16, 32), (16, 16, 32), (32, 32, 16), (64, 64, 8)])
def test_gpu_statistics_from_the_epilogue_feed_batch_norm(cin, cout, h, dtype, monkeypatch):
    """Every forward candidate's partials equal float64 ones of the y it stored; conv2d -> batch_norm_act with them
    equals batch norm computing its own statistics (output, running statistics, gradients)."""
    import cupy as cp

    from frost.accel import batch_norm as bn
    from frost.ops import norm
    from frost.ops.conv import conv2d
    x, w, _ = _inputs(32, cin, cout, h, h, 3, (1, 1), seed=h)
    xd, wd = _on_gpu(x, dtype), _on_gpu(w, dtype)
    for t in fm.candidate_tiles(fm.geometry(xd.shape, wd.shape, (1, 1)), 32, item=xd.dtype.itemsize):
        out = _nan_channels_last((32, cout, h, h), xd.dtype)
        out, stats = fm.conv2d_forward_gpu_stats(xd, wd, (1, 1), out, tiles=t)
        mean, m2 = tile_stats64(cp.asnumpy(out), t["R"])
        np.testing.assert_allclose(cp.asnumpy(stats.part_mean).reshape(cout, -1), mean, rtol=1e-5,
                                   atol=1e-6 * np.abs(mean).max(), err_msg=str(t))
        np.testing.assert_allclose(cp.asnumpy(stats.part_m2).reshape(cout, -1), m2, rtol=1e-5, err_msg=str(t))
    monkeypatch.setattr(fm, "choose", lambda *args, **kw: True)   # ours, whatever the timing says
    results = []
    for keep in (True, False):
        X, W = frost.Tensor(xd, requires_grad=True), frost.Tensor(wd, requires_grad=True)
        y = conv2d(X, W, padding=1)
        assert (bn.conv_stats_of(y) is not None) and y.data.dtype == xd.dtype
        if not keep:
            y.__dict__.pop("_channel_stats")
        y.retain_grad()
        rm, rv = frost.zeros(cout, device="cuda"), frost.ones(cout, device="cuda")
        gamma = frost.ones(cout, device="cuda", requires_grad=True)
        out = norm.batch_norm_act(y, rm, rv, gamma, frost.zeros(cout, device="cuda"), training=True, relu=True)
        (out.float() * out.float()).sum().backward()
        results.append([cp.asnumpy(a).astype(np.float64) for a in (out.data, rm.data, rv.data, y.grad.data,
                                                                   gamma.grad.data, X.grad.data, W.grad.data)])
    tol = 2 ** -7 if dtype == "bfloat16" else 1e-5   # bf16 y: one rounding may land on the other side
    for name, got, want in zip(("y", "running_mean", "running_var", "dy", "dgamma", "dx", "dw"), *results):
        # dx, dw: the convolution's TF32 gradients turn dy's last-bit differences into TF32-sized ones
        tol = max(tol, 2 ** -9) if name in ("dx", "dw") else tol
        assert np.isfinite(got).all() and np.isfinite(want).all(), name   # NaN-equal would pass assert_allclose
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max(), err_msg=name)


@pytest.mark.cuda
def test_a_forward_shape_first_queues_its_candidates_then_picks_and_jit_waits_for_the_pick(tmp_path, monkeypatch):
    """The first forward call of an unknown shape runs cuDNN and only queues our candidates' compiles (so that a
    pass's shapes compile side by side); the next call times and picks. frost.jit with warmup=1 then runs one more
    eager call, so that the capture holds the picked kernel, not cuDNN's for good."""
    import cupy as cp

    from frost.accel import conv_common
    from frost.ops.conv import conv2d_forward
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(conv_common, "_asked_once", set())
    monkeypatch.setattr(conv_common, "_undecided", set())
    fm._choices.forget()
    x, w, want = _inputs(32, 16, 16, 16, 16, 3, (1, 1), seed=5)
    xd, wd = _on_gpu(x), _on_gpu(w)
    key = fm._key(xd, wd, (1, 1))
    y = conv2d_forward(xd, wd, 1, 1)
    assert fm._choices.load().get(key) is None and conv_common.pending_choices()
    assert np.abs(cp.asnumpy(y).astype(np.float64) - want).max() <= 2 ** -7 * np.abs(want).max()   # cuDNN's
    y = conv2d_forward(xd, wd, 1, 1)
    assert fm._choices.load().get(key) is not None and not conv_common.pending_choices()
    assert np.abs(cp.asnumpy(y).astype(np.float64) - want).max() <= 2 ** -7 * np.abs(want).max()

    fm._choices.forget()
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path / "again"))
    calls, conv = [], frost.nn.Conv2d(16, 16, 3, padding=1, bias=False).to("cuda", memory_format=frost.channels_last)
    xt = frost.tensor(np.ascontiguousarray(x.astype(np.float32)), device="cuda").to(memory_format=frost.channels_last)

    def step(inp):
        calls.append(1)
        return conv(inp)
    jitted = frost.jit(step, warmup=1)
    jitted(xt)                                   # eager: the shape's candidates queued
    assert conv_common.pending_choices() and len(jitted.captures) == 1
    jitted(xt)                                   # one eager call more: picked
    assert not conv_common.pending_choices() and all(e.graph is None for e in jitted.captures.values())
    out = jitted(xt)                             # captured with the pick
    assert all(e.graph is not None for e in jitted.captures.values()) and len(calls) == 3
    np.testing.assert_allclose(cp.asnumpy(out.data), cp.asnumpy(conv(xt).data), rtol=1e-5, atol=1e-5)
    fm._choices.forget()
