"""Our convolution weight-gradient kernels (frost/accel/conv_wgrad.py): simulator vs a float64 NumPy twin, sm_90
compiles of the seed ResNet's variants, and (on a GPU) equality with cuDNN, `choose`, and CUDA-graph capture."""
import json

import ml_dtypes
import numpy as np
import pytest

from frost.layout import as_channels_last, is_channels_last
from frost.accel import conv_wgrad as cw

# the seed ResNet's weight gradients (batch 32, CIFAR 32x32): (N, Cin, Cout, H, stride, k); padding k // 2
SEED_SHAPES = [(32, 3, 16, 32, 1, 3), (32, 16, 16, 32, 1, 3), (32, 16, 32, 32, 2, 3), (32, 32, 32, 16, 1, 3),
               (32, 16, 32, 32, 2, 1), (32, 32, 64, 16, 2, 3), (32, 64, 64, 8, 1, 3), (32, 32, 64, 16, 2, 1)]
H200_SMS = 132


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def wgrad64(g, x, w_shape, stride, padding):
    """The NumPy float64 twin: dW = einsum over im2col columns of the zero-padded x."""
    (sh, sw), (ph, pw) = _pair(stride), _pair(padding)
    _, _, kh, kw = w_shape
    n, co, ho, wo = g.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    cols = np.stack([np.stack([xp[:, :, i:i + (ho - 1) * sh + 1:sh, j:j + (wo - 1) * sw + 1:sw]
                               for j in range(kw)], axis=2) for i in range(kh)], axis=2)  # n, ci, kh, kw, ho, wo
    return np.einsum("nohw,ncijhw->ocij", g.astype(np.float64), cols)


def _inputs(n, cin, cout, h, w, k, stride, padding, seed=0):
    (kh, kw), (sh, sw), (ph, pw) = _pair(k), _pair(stride), _pair(padding)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, cin, h, w)).astype(np.float32)
    ho, wo = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    g = rng.standard_normal((n, cout, ho, wo)).astype(np.float32)
    return g, x, (cout, cin, kh, kw)


# (N, Cin, Cout, H, W, k, stride, padding, tiles): odd sizes, channels that are not multiples of the tiles,
# chunks that overrun the image (rows and columns), more chunks than splits, several output tiles, P > 1 groups.
CASES = [
    ((2, 3, 5, 6, 7, 3, 1, 1), dict(TM=2, BM=4, BC=2, P=2, RP=1, WT=4, splits=3)),   # 2x2 tiles, 12 chunks / 3
    ((2, 4, 3, 7, 6, 3, 2, 1), {}),                                                  # defaults, stride 2
    ((2, 5, 4, 6, 7, 1, 2, 0), {}),                                                  # 1x1 stride 2, TC = 4
    ((2, 5, 4, 6, 7, 1, 2, 0), dict(TM=3, TC=2, BM=3, BC=4, P=2, RP=2, WT=3, splits=2)),
    ((2, 3, 4, 6, 7, 3, 2, 1), dict(TM=2, BM=4, BC=3, P=1, RP=3, WT=2, splits=5)),    # P = 1, 8 chunks / 5
    ((1, 2, 3, 5, 5, (2, 3), (1, 2), (1, 0)), dict(P=2, RP=1, WT=2)),                # 2x3 kernel, mixed stride
    ((1, 2, 3, 9, 11, 5, 2, 2), {}),                                                 # 5x5 stride 2: no sliding
    ((1, 3, 2, 5, 40, 3, 1, 1), {}),                                                 # Wo 40: two column tiles
]


@pytest.mark.parametrize("shape,tiles", CASES)
def test_simulated_kernels_match_float64(shape, tiles):
    g, x, w_shape = _inputs(*shape, seed=sum(map(hash, map(str, shape))) % 1000)
    stride, padding = shape[6], shape[7]
    geo = cw.geometry(g.shape, x.shape, w_shape, stride, padding)
    plan = cw.make_plan(geo, x.shape[0], blocks=4, **tiles)
    out = np.full(w_shape, np.nan, np.float32)
    cw.launch(plan, g, x, out, simulate=True)
    np.testing.assert_allclose(out, wgrad64(g, x, w_shape, stride, padding), rtol=1e-5, atol=1e-5)


def test_the_plans_of_the_cases_cover_what_they_claim():
    plans = [cw.make_plan(cw.geometry(*(lambda g, x, w: (g.shape, x.shape, w))(*_inputs(*s)), s[6], s[7]),
                          s[0], blocks=4, **t) for s, t in CASES]
    assert plans[0].tiles_m == 2 and plans[0].tiles_c == 2 and plans[0].splits == 3 and plans[0].total_chunks == 12
    assert plans[0].consts["P"] == 2 and plans[4].consts["P"] == 1 and plans[4].splits == 4  # 8 chunks: 2 each
    assert plans[2].consts["TC"] == 4 and plans[2].consts["KH"] == 1
    for p in plans:
        assert p.splits * p.chunks_per_block >= p.total_chunks > (p.splits - 1) * p.chunks_per_block


def test_public_function_writes_out_or_makes_it():
    g, x, w_shape = _inputs(2, 3, 4, 5, 6, 3, 1, 1, seed=1)
    want = wgrad64(g, x, w_shape, 1, 1)
    out = np.full(w_shape, np.nan, np.float32)
    got = cw.conv2d_backward_weight_gpu(g, x, w_shape, 1, 1, out=out, simulate=True)
    assert got is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    made = cw.conv2d_backward_weight_gpu(g, x, w_shape, 1, 1, simulate=True)
    assert made.shape == w_shape and made.dtype == np.float32
    np.testing.assert_allclose(made, want, rtol=1e-5, atol=1e-5)


def test_one_split_writes_straight_into_out():
    g, x, w_shape = _inputs(1, 2, 3, 4, 5, 3, 1, 1, seed=2)
    plan = cw.make_plan(cw.geometry(g.shape, x.shape, w_shape, 1, 1), 1, P=2, RP=2, WT=5, splits=1)
    assert plan.splits == 1 and plan.total_chunks == 1
    out = np.full(w_shape, np.nan, np.float32)
    cw.launch(plan, g, x, out, simulate=True)
    np.testing.assert_allclose(out, wgrad64(g, x, w_shape, 1, 1), rtol=1e-5, atol=1e-5)


def test_errors_name_the_shapes():
    g, x, w_shape = _inputs(2, 3, 4, 5, 6, 3, 1, 1)
    with pytest.raises(ValueError, match=r"dy of shape \(2, 4, 5, 6\) does not fit x \(2, 3, 5, 6\), weight "
                                         r"\(4, 3, 3, 3\), stride \(2, 2\), padding \(1, 1\) \(expected dy of shape "
                                         r"\(2, 4, 3, 3\)\)"):
        cw.conv2d_backward_weight_gpu(g, x, w_shape, 2, 1, simulate=True)
    with pytest.raises(ValueError, match=r"out must be a float32 array of shape \(4, 3, 3, 3\), C-contiguous or "
                                         r"channels-last, got float32 \(4, 3, 9\)"):
        cw.conv2d_backward_weight_gpu(g, x, w_shape, 1, 1, out=np.zeros((4, 3, 9), np.float32), simulate=True)
    with pytest.raises(TypeError, match=r"dy and x must both be float32 or both bfloat16 arrays, got dy float32 and "
                                        r"x float64"):
        cw.conv2d_backward_weight_gpu(g, x.astype(np.float64), w_shape, 1, 1, simulate=True)
    assert not cw.supported(g, x.astype(ml_dtypes.bfloat16), w_shape, 1, 1)  # mixed dtypes
    assert not cw.supported(g, x, w_shape, 1, 1, dilation=2)
    assert not cw.supported(g, x, w_shape, 1, 1, groups=3)
    assert not cw.supported(g, x, w_shape, 2, 1)
    assert cw.supported(g, x, w_shape, 1, 1)


# ------------------------------------------------------------------ channels-last (NHWC) inputs, KRSC outputs
# the seed ResNet's kinds of layers (first 3x3, 3x3, 3x3 stride 2, 1x1 stride 2 shortcut) scaled down to what the
# simulator runs in well under a second, (N, Cin, Cout, H, stride, k) with padding k // 2; the last one odd
SMALL_SEED_SHAPES = [(2, 3, 8, 4, 1, 3), (2, 4, 4, 4, 1, 3), (2, 4, 8, 6, 2, 3), (2, 4, 8, 6, 2, 1),
                     (2, 5, 3, 5, 1, 3)]


def _nhwc(a):
    """a copy of `a` with NHWC memory (for 1x1 weights that is also KCRS memory)."""
    out = as_channels_last(a)
    assert out.transpose(0, 2, 3, 1).flags.c_contiguous and np.array_equal(out, a, equal_nan=True)
    return out


def _nan_out(w_shape, channels_last: bool):
    out = np.full(w_shape, np.nan, np.float32)
    return _nhwc(out) if channels_last else out


@pytest.mark.parametrize("shape", SMALL_SEED_SHAPES, ids=[str(s) for s in SMALL_SEED_SHAPES])
def test_nhwc_inputs_give_the_nchw_result_in_both_output_layouts(shape):
    n, cin, cout, h, s, k = shape
    g, x, w_shape = _inputs(n, cin, cout, h, h, k, s, k // 2, seed=cin + cout + h)
    want = wgrad64(g, x, w_shape, s, k // 2)
    nchw = cw.conv2d_backward_weight_gpu(g, x, w_shape, s, k // 2, simulate=True)
    np.testing.assert_allclose(nchw, want, rtol=1e-5, atol=1e-5)
    gl, xl = _nhwc(g), _nhwc(x)
    assert cw.supported(gl, xl, w_shape, s, k // 2)
    for channels_last_out in (False, True):
        out = _nan_out(w_shape, channels_last_out)
        got = cw.conv2d_backward_weight_gpu(gl, xl, w_shape, s, k // 2, out=out, simulate=True)
        assert got is out and is_channels_last(out) == (channels_last_out and k > 1)  # 1x1: KCRS == KRSC
        # same tiles, same shared-memory contents, same FFMA order: bit for bit the NCHW sums
        np.testing.assert_array_equal(out, nchw, err_msg=f"channels-last out: {channels_last_out}")


@pytest.mark.parametrize("case", [3, 4, 5, 6])
def test_nhwc_launch_with_explicit_tiles_matches_float64(case):
    shape, tiles = CASES[case]   # partial channel tiles (Cin % BC, Cout % BM != 0), P 1 and 2, several splits
    g, x, w_shape = _inputs(*shape, seed=7 + case)
    stride, padding = shape[6], shape[7]
    plan = cw.make_plan(cw.geometry(g.shape, x.shape, w_shape, stride, padding), x.shape[0], blocks=4, **tiles)
    want = wgrad64(g, x, w_shape, stride, padding)
    out = _nan_out(w_shape, channels_last=True)
    cw.launch(plan, _nhwc(g), _nhwc(x), out, simulate=True)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_nhwc_output_defaults_to_x_layout():
    g, x, w_shape = _inputs(2, 3, 4, 6, 5, 3, 1, 1, seed=3)
    made = cw.conv2d_backward_weight_gpu(_nhwc(g), _nhwc(x), w_shape, 1, 1, simulate=True)
    assert made.shape == w_shape and made.dtype == np.float32 and is_channels_last(made)
    np.testing.assert_allclose(made, wgrad64(g, x, w_shape, 1, 1), rtol=1e-5, atol=1e-5)
    assert cw.conv2d_backward_weight_gpu(g, x, w_shape, 1, 1, simulate=True).flags.c_contiguous


def test_inputs_dense_in_both_layouts_go_with_the_other_one():
    g, x, w_shape = _inputs(2, 1, 4, 6, 5, 3, 1, 1, seed=5)   # Cin 1: x is NCHW and NHWC at once
    gl = _nhwc(g)
    assert x.flags.c_contiguous and cw.input_layout(gl, x) == "nhwc" and cw.input_layout(g, x) == "nchw"
    out = cw.conv2d_backward_weight_gpu(gl, x, w_shape, 1, 1, simulate=True)
    np.testing.assert_allclose(out, wgrad64(g, x, w_shape, 1, 1), rtol=1e-5, atol=1e-5)


def test_mixed_or_strided_layouts_are_not_supported():
    g, x, w_shape = _inputs(2, 3, 4, 5, 6, 3, 1, 1)
    gl, xl = _nhwc(g), _nhwc(x)
    assert cw.supported(g, x, w_shape, 1, 1) and cw.supported(gl, xl, w_shape, 1, 1)
    assert cw.input_layout(g, xl) is None and cw.input_layout(gl, x) is None
    assert not cw.supported(g, xl, w_shape, 1, 1)
    assert not cw.supported(gl, x, w_shape, 1, 1)
    assert not cw.supported(g, x[:, :, :, ::-1], w_shape, 1, 1)
    wide = np.zeros((2, 3, 5, 12), np.float32)[:, :, :, ::2]   # strided view
    assert not cw.supported(g, wide, w_shape, 1, 1)
    with pytest.raises(ValueError, match=r"dy and x must both be C-contiguous \(NCHW\) or both channels-last "
                                         r"\(NHWC memory\), got dy \(2, 4, 5, 6\) with strides \(480, 120, 24, 4\) "
                                         r"and x \(2, 3, 5, 6\) with strides \(360, 4, 72, 12\)"):
        cw.conv2d_backward_weight_gpu(g, xl, w_shape, 1, 1, simulate=True)
    plan = cw.make_plan(cw.geometry(g.shape, x.shape, w_shape, 1, 1), 2, blocks=4)
    with pytest.raises(ValueError, match=r"unsupported memory layouts"):
        cw.launch(plan, gl, x, np.zeros(w_shape, np.float32), simulate=True)


def test_bad_out_is_an_error():
    g, x, w_shape = _inputs(2, 3, 4, 5, 6, 3, 1, 1)
    gl, xl = _nhwc(g), _nhwc(x)
    swapped = np.zeros((4, 3, 3, 3), np.float32).transpose(0, 1, 3, 2)   # neither KCRS nor KRSC memory
    with pytest.raises(ValueError, match=r"out must be a float32 array of shape \(4, 3, 3, 3\), C-contiguous or "
                                         r"channels-last, got float32 \(4, 3, 3, 3\) with strides \(108, 36, 4, 12\)"):
        cw.conv2d_backward_weight_gpu(gl, xl, w_shape, 1, 1, out=swapped, simulate=True)
    with pytest.raises(ValueError, match=r"got float64 \(4, 3, 3, 3\)"):
        cw.conv2d_backward_weight_gpu(gl, xl, w_shape, 1, 1, out=_nhwc(np.zeros(w_shape)), simulate=True)
    with pytest.raises(ValueError, match=r"got float32 \(4, 3, 3\)"):
        cw.conv2d_backward_weight_gpu(gl, xl, w_shape, 1, 1, out=np.zeros((4, 3, 3), np.float32), simulate=True)
    with pytest.raises(TypeError, match=r"dy and x must both be float32 or both bfloat16 arrays, got dy float64"):
        cw.conv2d_backward_weight_gpu(_nhwc(g.astype(np.float64)), xl, w_shape, 1, 1, simulate=True)


def test_choices_are_remembered_per_layout():
    g, x, w_shape = _inputs(2, 3, 4, 5, 6, 3, 1, 1)
    assert cw._key(g, x, w_shape, 1, 1) != cw._key(_nhwc(g), _nhwc(x), w_shape, 1, 1)


def _seed_geometry(n, cin, cout, h, s, k):
    p = k // 2
    ho = (h + 2 * p - k) // s + 1
    return cw.geometry((n, cout, ho, ho), (n, cin, h, h), (cout, cin, k, k), s, p)


@pytest.mark.parametrize("shape", SEED_SHAPES, ids=[str(s) for s in SEED_SHAPES])
def test_seed_plans_fit_the_h200(shape):
    geo = _seed_geometry(*shape)
    for tiles in cw.candidate_tiles(geo, shape[0], H200_SMS):
        plan = cw.make_plan(geo, shape[0], **tiles)
        assert plan.threads <= 256 and plan.smem <= cw.MAX_SMEM
        assert plan.splits * plan.tiles_m * plan.tiles_c <= 4 * H200_SMS


@pytest.mark.parametrize("shape", SEED_SHAPES, ids=[str(s) for s in SEED_SHAPES])
def test_seed_variants_compile_for_sm90_without_spills(shape, tmp_path, monkeypatch):
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    plan = cw.make_plan(_seed_geometry(*shape), shape[0], blocks=2 * H200_SMS)
    cubin = cw.conv_wgrad_partial.compile("sm_90", **plan.consts)
    assert cubin[:4] == b"\x7fELF"
    assert b".nv.local" not in cubin, f"{shape} {plan.tiles()} spills registers to local memory"


@pytest.mark.parametrize("shape", [SEED_SHAPES[1], SEED_SHAPES[4], SEED_SHAPES[6]],
                         ids=[str(s) for s in [SEED_SHAPES[1], SEED_SHAPES[4], SEED_SHAPES[6]]])
def test_channels_last_variants_compile_for_sm90_without_spills(shape, tmp_path, monkeypatch):
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    plan = cw.make_plan(_seed_geometry(*shape), shape[0], blocks=2 * H200_SMS)
    cubin = cw.conv_wgrad_partial.compile("sm_90", **plan.consts, NHWC=1, KRSC=1)
    assert cubin[:4] == b"\x7fELF"
    assert b".nv.local" not in cubin, f"{shape} {plan.tiles()} spills registers to local memory"


def test_finalize_compiles_for_sm90(tmp_path, monkeypatch):
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    assert cw.conv_wgrad_finalize.compile("sm_90")[:4] == b"\x7fELF"


def test_finalize_sums_the_splits_in_order():
    rng = np.random.default_rng(4)
    n_out, splits = 70, 19   # outputs beyond a block of 32, more splits than the 8 warps
    part = rng.standard_normal(splits * n_out).astype(np.float32)
    out = np.full(n_out, np.nan, np.float32)
    cw.conv_wgrad_finalize.simulate[3, 256](part, out, n_out, splits)
    np.testing.assert_allclose(out, part.reshape(splits, n_out).astype(np.float64).sum(0), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ on a GPU
def _cuda_case(shape, seed=0):
    import cupy as cp
    n, cin, cout, h, s, k = shape
    g, x, w_shape = _inputs(n, cin, cout, h, h, k, s, k // 2, seed=seed)
    return cp.asarray(g), cp.asarray(x), w_shape, s, k // 2


def _cudnn(g, x, w_shape, s, p, out=None):
    from frost.backend import cudnn
    return cudnn.conv2d_backward_weight(g, x, w_shape, (s, s), (p, p), (1, 1), out=out)


@pytest.mark.cuda
@pytest.mark.parametrize("shape", SEED_SHAPES, ids=[str(s) for s in SEED_SHAPES])
def test_gpu_matches_cudnn_at_seed_shapes(shape, exact_gpu_math):
    import cupy as cp
    g, x, w_shape, s, p = _cuda_case(shape)
    want = cp.asnumpy(_cudnn(g, x, w_shape, s, p)).astype(np.float64)
    geo = cw.geometry(g.shape, x.shape, w_shape, s, p)
    for tiles in cw.candidate_tiles(geo, shape[0], cw.multiprocessor_count(cp.cuda.runtime.getDevice())):
        got = cp.asnumpy(cw.conv2d_backward_weight_gpu(g, x, w_shape, s, p, tiles=tiles))
        scale = np.abs(want).max()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale, err_msg=str(tiles))
    again = cw.conv2d_backward_weight_gpu(g, x, w_shape, s, p)
    assert cp.array_equal(again, cw.conv2d_backward_weight_gpu(g, x, w_shape, s, p))  # deterministic


@pytest.mark.cuda
@pytest.mark.parametrize("shape", SEED_SHAPES, ids=[str(s) for s in SEED_SHAPES])
def test_gpu_channels_last_matches_cudnn_at_seed_shapes(shape, exact_gpu_math):
    import cupy as cp
    from frost.layout import empty_like_format
    g, x, w_shape, s, p = _cuda_case(shape, seed=6)
    gl, xl = _nhwc_gpu(g), _nhwc_gpu(x)
    want = cp.asnumpy(_cudnn(gl, xl, w_shape, s, p, out=empty_like_format(w_shape, xl))).astype(np.float64)
    scale = np.abs(want).max()
    geo = cw.geometry(g.shape, x.shape, w_shape, s, p)
    candidates = cw.candidate_tiles(geo, shape[0], cw.multiprocessor_count(cp.cuda.runtime.getDevice()))
    for tiles in candidates:   # every candidate with KRSC out (what channels-last training uses), the first with KCRS
        nchw = cw.conv2d_backward_weight_gpu(g, x, w_shape, s, p, tiles=tiles)
        outs = [empty_like_format(w_shape, xl)] + ([cp.empty(w_shape, cp.float32)] if tiles == candidates[0] else [])
        for out in outs:
            out.fill(cp.nan)
            got = cw.conv2d_backward_weight_gpu(gl, xl, w_shape, s, p, out=out, tiles=tiles)
            assert got is out
            np.testing.assert_allclose(cp.asnumpy(out), want, rtol=1e-4, atol=1e-4 * scale, err_msg=str(tiles))
            assert cp.array_equal(out, nchw), f"{tiles}: NHWC differs from NCHW"
    made = cw.conv2d_backward_weight_gpu(gl, xl, w_shape, s, p)
    assert is_channels_last(made) or shape[5] == 1
    assert cp.array_equal(made, cw.conv2d_backward_weight_gpu(gl, xl, w_shape, s, p))   # deterministic


@pytest.mark.cuda
def test_choose_remembers_nchw_and_nhwc_separately(tmp_path, monkeypatch, exact_gpu_math):
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    cw.forget()
    g, x, w_shape, s, p = _cuda_case((32, 16, 32, 32, 2, 1))
    gl, xl = _nhwc_gpu(g), _nhwc_gpu(x)
    cw.choose(g, x, w_shape, s, p, lambda: _cudnn(g, x, w_shape, s, p))
    assert cw.remembered(gl, xl, w_shape, s, p) is None
    cw.choose(gl, xl, w_shape, s, p, lambda: _cudnn(gl, xl, w_shape, s, p))
    assert cw.remembered(gl, xl, w_shape, s, p) is not None and cw.remembered(g, x, w_shape, s, p) is not None
    assert len(json.loads((tmp_path / "conv_wgrad.json").read_text())) == 2
    cw.forget()


def _nhwc_gpu(a):
    out = as_channels_last(a)
    assert is_channels_last(out)
    return out


@pytest.mark.cuda
def test_gpu_odd_shapes_match_float64():
    import cupy as cp
    for shape in [(3, 5, 7, 9, 11, 3, 1, 1), (2, 6, 5, 13, 10, 3, 2, 1), (4, 7, 3, 9, 9, 1, 2, 0),
                  (2, 3, 4, 40, 70, 5, 2, 2)]:
        g, x, w_shape = _inputs(*shape, seed=5)
        got = cw.conv2d_backward_weight_gpu(cp.asarray(g), cp.asarray(x), w_shape, shape[6], shape[7])
        np.testing.assert_allclose(cp.asnumpy(got), wgrad64(g, x, w_shape, shape[6], shape[7]), rtol=1e-4,
                                   atol=1e-4, err_msg=str(shape))


@pytest.mark.cuda
def test_choose_times_once_and_remembers(tmp_path, monkeypatch, exact_gpu_math):
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    cw.forget()
    g, x, w_shape, s, p = _cuda_case((32, 16, 16, 32, 1, 3))
    calls = []

    def cudnn_fn():
        calls.append(1)
        _cudnn(g, x, w_shape, s, p)

    ours = cw.choose(g, x, w_shape, s, p, cudnn_fn)
    timed = len(calls)
    assert timed > 0
    record = cw.remembered(g, x, w_shape, s, p)
    assert record["ours"] == ours == (record["ours_us"] < record["cudnn_us"])
    assert cw.choose(g, x, w_shape, s, p, cudnn_fn) == ours and len(calls) == timed   # from memory
    on_disk = json.loads((tmp_path / "conv_wgrad.json").read_text())
    assert list(on_disk.values())[0]["tiles"] == record["tiles"]
    cw.forget()
    assert cw.choose(g, x, w_shape, s, p, cudnn_fn) == ours and len(calls) == timed   # from disk
    cw.forget()


@pytest.mark.cuda
def test_works_inside_a_cuda_graph_capture(tmp_path, monkeypatch, exact_gpu_math):
    import cupy as cp
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    cw.forget()
    g, x, w_shape, s, p = _cuda_case((32, 32, 32, 16, 1, 3), seed=3)
    want = cp.asnumpy(_cudnn(g, x, w_shape, s, p))
    out = cp.zeros(w_shape, cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    pool = cp.cuda.MemoryPool()  # as frost.jit: the graph's scratch comes from a pool that lives with it
    with stream:
        cw.conv2d_backward_weight_gpu(g, x, w_shape, s, p, out=out)  # compile and load outside the capture
        out.fill(0)
        stream.synchronize()
        with cp.cuda.using_allocator(pool.malloc):
            stream.begin_capture()
            assert cw.choose(g, x, w_shape, s, p, lambda: None) is False   # unknown during a capture: cuDNN
            cw.conv2d_backward_weight_gpu(g, x, w_shape, s, p, out=out)
            graph = stream.end_capture()
        assert not out.any()   # captured, not run
        graph.launch(stream)
        stream.synchronize()
    assert cw.remembered(g, x, w_shape, s, p) is None
    np.testing.assert_allclose(cp.asnumpy(out), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    cw.forget()


@pytest.mark.parametrize("channels_last", [False, True])
def test_bf16_operands_give_float32_sums_of_their_values(channels_last):
    """Under autocast dy and x are bf16: the kernel loads them as f32 and sums in f32 into a float32 dW, so it equals
    the float32 kernel run on the bf16 values widened to float32, bit for bit."""
    g, x, w_shape = _inputs(2, 5, 6, 7, 7, 3, 1, 1)
    gb, xb = g.astype(ml_dtypes.bfloat16), x.astype(ml_dtypes.bfloat16)
    layout = _nhwc if channels_last else (lambda a: a)
    got = cw.conv2d_backward_weight_gpu(layout(gb), layout(xb), w_shape, 1, 1, simulate=True)
    want = cw.conv2d_backward_weight_gpu(layout(gb.astype(np.float32)), layout(xb.astype(np.float32)), w_shape, 1, 1,
                                         simulate=True)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    ref = wgrad64(gb.astype(np.float64), xb.astype(np.float64), w_shape, 1, 1)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_prefetch_queues_a_shape_once_and_skips_decided_shapes(monkeypatch):
    """conv2d's forward calls prefetch on every eager step: a shape is queued the first time only, a shape that
    `choose` already decided is not queued, an unsupported one (float64) neither."""
    queued = []

    class Spec:
        def __init__(self, tiles):
            self.tiles = tiles

        def prefetch(self, arch):
            queued.append((arch, self.tiles))

    monkeypatch.setattr(cw, "_looked_at", set())
    monkeypatch.setattr(cw, "capturing", lambda: False)
    monkeypatch.setattr(cw, "device_arch", lambda: "sm_90")
    monkeypatch.setattr(cw, "candidates", lambda *args: [{"TM": 1}, {"TM": 2}])
    monkeypatch.setattr(cw, "_candidate_specs", lambda g, x, w, s, p, tiles, out: [Spec(t) for t in tiles])
    g, x, w_shape = _inputs(2, 3, 4, 6, 6, 3, 1, 1)
    out = np.zeros(w_shape, np.float32)
    for _ in range(3):
        cw.prefetch(g, x, w_shape, 1, 1, out=out)
    assert queued == [("sm_90", {"TM": 1}), ("sm_90", {"TM": 2})]
    g2, x2, w2 = _inputs(2, 3, 5, 6, 6, 3, 1, 1)
    monkeypatch.setattr(cw._choices, "load", lambda: {cw._key(g2, x2, w2, 1, 1): {"ours": True}})
    cw.prefetch(g2, x2, w2, 1, 1, out=np.zeros(w2, np.float32))
    cw.prefetch(g.astype(np.float64), x.astype(np.float64), w_shape, 1, 1, out=out)
    assert len(queued) == 2
