"""Our convolution weight-gradient kernels (frost/ops/conv_wgrad.py): simulator vs a float64 NumPy twin, sm_90
compiles of the seed ResNet's variants, and (on a GPU) equality with cuDNN, `choose`, and CUDA-graph capture."""
import json

import numpy as np
import pytest

from frost.ops import conv_wgrad as cw

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
    with pytest.raises(ValueError, match=r"out must be a C-contiguous float32 array of shape \(4, 3, 3, 3\), "
                                         r"got float32 \(4, 3, 9\)"):
        cw.conv2d_backward_weight_gpu(g, x, w_shape, 1, 1, out=np.zeros((4, 3, 9), np.float32), simulate=True)
    with pytest.raises(TypeError, match=r"x must be a C-contiguous float32 array, got float64"):
        cw.conv2d_backward_weight_gpu(g, x.astype(np.float64), w_shape, 1, 1, simulate=True)
    assert not cw.supported(g, x, w_shape, 1, 1, dilation=2)
    assert not cw.supported(g, x, w_shape, 1, 1, groups=3)
    assert not cw.supported(g, x, w_shape, 2, 1)
    assert cw.supported(g, x, w_shape, 1, 1)


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
    for tiles in cw.candidate_tiles(geo, shape[0], cw._sm_count(cp.cuda.runtime.getDevice())):
        got = cp.asnumpy(cw.conv2d_backward_weight_gpu(g, x, w_shape, s, p, tiles=tiles))
        scale = np.abs(want).max()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale, err_msg=str(tiles))
    again = cw.conv2d_backward_weight_gpu(g, x, w_shape, s, p)
    assert cp.array_equal(again, cw.conv2d_backward_weight_gpu(g, x, w_shape, s, p))  # deterministic


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
