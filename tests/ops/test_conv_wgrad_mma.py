"""The tensor-core weight-gradient kernel (frost/accel/conv_wgrad_mma.py): simulator vs float64 sums of the same bf16
values, its plans, sm_90 compiles at the seed ResNet's shapes, and (on a GPU) equality with the float64 sums."""
import ml_dtypes
import numpy as np
import pytest

import frost
from frost.accel import conv_fprop_mma as fm
from frost.accel import conv_wgrad as cw
from frost.accel import conv_wgrad_mma as mma
from frost.kernel import compile as kernel_compile
from frost.layout import as_channels_last

from test_conv_fprop_mma import _tf32
from test_conv_wgrad import SEED_SHAPES, _inputs, wgrad64


def _bf16_inputs(*shape, seed=0):
    """dy, x rounded to bf16 (channels-last NHWC memory) and the float64 dW of those rounded values."""
    n, cin, cout, h, w, k, stride, padding = shape
    g, x, w_shape = _inputs(n, cin, cout, h, w, k, stride, padding, seed=seed)
    g, x = g.astype(ml_dtypes.bfloat16), x.astype(ml_dtypes.bfloat16)
    want = wgrad64(g.astype(np.float32), x.astype(np.float32), w_shape, stride, padding)
    return as_channels_last(g), as_channels_last(x), w_shape, want


# (N, Cin, Cout, H, W, k, stride, padding, plan keywords): padding and the zero row, several chunks per block (both
# shared buffers), chunks that overrun the image (HO % R), k steps padded past the chunk (R * WO % 16), n-tile groups
# and warps that own none of a group's tiles, several m-tiles, stride 2, 1x1 kernels, one split (dW written directly).
CASES = [
    ((2, 8, 16, 6, 6, 3, 1, 1), dict(R=2, WARPS=2, splits=2)),            # 6 chunks, 3 per block; 12-pixel chunks
    ((1, 16, 32, 7, 5, 3, 1, 1), dict(R=3, WARPS=3, groups=2, splits=2)),  # HO 7 = 3 + 3 + 1; 2 m-tiles
    ((2, 16, 16, 8, 8, 3, 2, 1), dict(R=2, WARPS=4, groups=3)),            # stride 2
    ((2, 8, 32, 6, 6, 1, 2, 0), dict(R=1, WARPS=1, splits=1)),             # 1x1 stride 2, one split
    ((1, 8, 16, 5, 9, (1, 3), 1, (0, 1)), dict(R=2, WARPS=2, groups=3)),   # 1x3 kernel
    ((2, 3, 16, 6, 6, 3, 1, 1), dict(R=2, WARPS=3, splits=3)),             # Cin 3 (the stem): zero channels 3..7
    ((2, 12, 16, 6, 6, 3, 1, 1), dict(R=3, WARPS=2, groups=2)),            # Cin 12: 8 + 4 channels
]


@pytest.mark.parametrize("shape,tiles", CASES)
@pytest.mark.parametrize("krsc", [True, False])
def test_simulated_kernel_matches_float64(shape, tiles, krsc):
    g, x, w_shape, want = _bf16_inputs(*shape, seed=len(str(shape)))
    geo = cw.geometry(g.shape, x.shape, w_shape, shape[6], shape[7])
    plan = mma.mma_plan(geo, x.shape[0], **tiles)
    out = np.full(w_shape, np.nan, np.float32)
    if krsc:
        out = as_channels_last(out)
    cw.launch(plan, g, x, out, simulate=True)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,tiles", CASES)
def test_simulated_tf32_kernel_matches_float64_of_tf32_operands(shape, tiles):
    """float32 dy and x on TF32 (element loads of the m16n8k8 fragments): the sums of their TF32 values."""
    n, cin, cout, h, w, k, stride, padding = shape
    g, x, w_shape = _inputs(n, cin, cout, h, w, k, stride, padding, seed=len(str(shape)))
    g, x = g.astype(np.float32), x.astype(np.float32)
    want = wgrad64(_tf32(g), _tf32(x), w_shape, stride, padding)
    geo = cw.geometry(g.shape, x.shape, w_shape, stride, padding)
    plan = mma.mma_plan(geo, x.shape[0], item=4, **tiles)
    out = as_channels_last(np.full(w_shape, np.nan, np.float32))
    cw.launch(plan, as_channels_last(g), as_channels_last(x), out, simulate=True)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    exact = wgrad64(g, x, w_shape, stride, padding)
    assert np.abs(out - exact).max() > 1e-6 * np.abs(exact).max()   # TF32 operands, not float32 ones


def test_plans_cover_the_chunks_and_tiles():
    geo = cw.geometry((32, 64, 8, 8), (32, 64, 8, 8), (64, 64, 3, 3), 1, 1)
    plan = mma.mma_plan(geo, 32)
    c = plan.consts
    assert c["R"] == 8 and plan.total_chunks == 32 and plan.groups * c["NTB"] >= 72
    assert plan.splits * plan.chunks_per_block >= plan.total_chunks > (plan.splits - 1) * plan.chunks_per_block
    assert plan.smem <= mma.MAX_SMEM and plan.threads == 32 * c["WARPS"]
    assert cw.plan_for(np.empty((32, 64, 8, 8), ml_dtypes.bfloat16), np.empty((32, 64, 8, 8), ml_dtypes.bfloat16),
                       (64, 64, 3, 3), 1, 1, tiles=plan.tiles(), sms=132) == plan  # what choose remembers rebuilds it
    assert mma.supports(cw.geometry((32, 16, 32, 32), (32, 3, 32, 32), (16, 3, 3, 3), 1, 1))  # the stem: Cin 3
    with pytest.raises(ValueError, match="needs Cout % 16 == 0"):
        mma.mma_plan(cw.geometry((2, 8, 4, 4), (2, 8, 4, 4), (8, 8, 3, 3), 1, 1), 2)


@pytest.mark.parametrize("n,cin,cout,h,stride,k", SEED_SHAPES)
def test_seed_shapes_candidates_compile_for_sm90(n, cin, cout, h, stride, k):
    geo = cw.geometry((n, cout, (h + 2 * (k // 2) - k) // stride + 1, (h + 2 * (k // 2) - k) // stride + 1),
                      (n, cin, h, h), (cout, cin, k, k), stride, k // 2)
    tiles = mma.candidate_tiles(geo, n, 132)
    assert 2 <= len(tiles) <= 4
    for t in tiles:
        plan = mma.mma_plan(geo, n, **{k: v for k, v in t.items() if k != "kernel"})
        assert plan.smem <= mma.MAX_SMEM
        assert mma.conv_wgrad_mma.compile("sm_90", **plan.specialization(True, True))[:4] == b"\x7fELF"
    assert mma.candidate_tiles(geo, n, 132, item=4) == tiles   # float32 on TF32: bf16's tiles, twice the bytes
    for t in tiles:
        plan = mma.mma_plan(geo, n, item=4, **{k: v for k, v in t.items() if k != "kernel"})
        assert plan.smem <= mma.smem_budget(4)
        assert mma.KERNELS["float32"].compile("sm_90", **plan.specialization(True, True))[:4] == b"\x7fELF"


def _on_gpu(a):
    """A channels-last copy on the GPU: (N, H, W, C) memory seen as NCHW."""
    import cupy as cp
    return cp.asarray(np.ascontiguousarray(a.transpose(0, 2, 3, 1))).transpose(0, 3, 1, 2)


@pytest.mark.cuda
@pytest.mark.parametrize("n,cin,cout,h,stride,k", SEED_SHAPES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_gpu_candidates_match_float64_at_the_seed_shapes(n, cin, cout, h, stride, k, dtype):
    import cupy as cp
    if dtype == "bfloat16":   # float32 sums of the same bf16 values
        g, x, w_shape, want = _bf16_inputs(n, cin, cout, h, h, k, stride, k // 2, seed=h + cin)
        tolerance = 2e-5
    else:                     # TF32 operands
        g, x, w_shape = _inputs(n, cin, cout, h, h, k, stride, k // 2, seed=h + cin)
        want, tolerance = wgrad64(g, x, w_shape, stride, k // 2), 2 ** -8
    gd, xd = _on_gpu(g), _on_gpu(x)
    tiles = [t for t in cw.candidates(gd, xd, w_shape, stride, k // 2) if t.get("kernel") == "mma"]
    assert tiles
    for t in tiles:
        out = cw.conv2d_backward_weight_gpu(gd, xd, w_shape, stride, k // 2, tiles=t)
        assert np.abs(cp.asnumpy(out) - want).max() <= tolerance * np.abs(want).max(), t


def test_channels_last_shapes_time_only_the_tensor_core_candidates(monkeypatch):
    monkeypatch.setattr(cw, "multiprocessor_count", lambda device: 132)
    monkeypatch.setattr(cw, "_cupy", lambda: type("cp", (), {"cuda": type("c", (), {"runtime": type(
        "r", (), {"getDevice": staticmethod(lambda: 0)})})}))
    g, x, w_shape, _ = _bf16_inputs(2, 16, 16, 8, 8, 3, 1, 1)
    assert {t.get("kernel") for t in cw.candidates(g, x, w_shape, 1, 1)} == {"mma"}
    g32, x32 = g.astype(np.float32), x.astype(np.float32)
    assert {t.get("kernel") for t in cw.candidates(g32, x32, w_shape, 1, 1)} == {"mma"}   # float32: on TF32
    monkeypatch.setattr(frost.backends, "allow_tf32", False)
    assert all("kernel" not in t for t in cw.candidates(g32, x32, w_shape, 1, 1))   # no TF32: the FFMA kernel
    gn, xn = np.ascontiguousarray(g), np.ascontiguousarray(x)
    assert all("kernel" not in t for t in cw.candidates(gn, xn, w_shape, 1, 1))     # NCHW bf16: the FFMA kernel


def test_tensor_core_kernels_need_an_ampere_or_newer_gpu(monkeypatch):
    on_gpu = type("GpuArray", (), {"device": type("Device", (), {"id": 0})()})()
    monkeypatch.setattr(kernel_compile, "device_arch", lambda device=None: "sm_75")   # Turing: no bf16/TF32 mma
    assert not kernel_compile.has_mma(on_gpu)
    for arch in ("sm_80", "sm_90", "sm_90a"):
        monkeypatch.setattr(kernel_compile, "device_arch", lambda device=None, arch=arch: arch)
        assert kernel_compile.has_mma(on_gpu)
    assert kernel_compile.has_mma(np.zeros(2))   # the simulator
    monkeypatch.setattr(fm, "has_mma", lambda a: False)
    x = as_channels_last(np.zeros((2, 16, 8, 8), ml_dtypes.bfloat16))
    assert not fm.supported(x, as_channels_last(np.zeros((16, 16, 3, 3), ml_dtypes.bfloat16)), (1, 1), (1, 1),
                            (1, 1), 1)


def _deferred_and_immediate(cases):
    """dW of each case by deferred launches (each carrying the one before) and by immediate ones, both simulated."""
    deferred, immediate = [], []
    for shape, tiles in cases:
        g, x, w_shape, _ = _bf16_inputs(*shape, seed=len(str(shape)))
        plan = mma.mma_plan(cw.geometry(g.shape, x.shape, w_shape, shape[6], shape[7]), x.shape[0], **tiles)
        for outs, defer in ((deferred, True), (immediate, False)):
            outs.append(np.full(w_shape, np.nan, np.float32))
            cw.launch(plan, g, x, outs[-1], simulate=True, defer=defer)
    return deferred, immediate


def test_a_deferred_finalize_rides_with_the_next_launch_and_sums_in_the_same_order():
    cases = [CASES[0], CASES[1], CASES[5], CASES[3]]   # 2 splits (3 warps carry it), 2 (a 3-split stem carries)...
    deferred, immediate = _deferred_and_immediate(cases)
    pending = cw._pending()
    assert len(pending) == 0   # the 1-split last launch carried the stem's finalize and left none of its own
    for got, want in zip(deferred, immediate):
        np.testing.assert_array_equal(got, want)   # bit for bit: the carried sums use the finalize kernel's order
    deferred, immediate = _deferred_and_immediate(cases[:3])
    assert len(pending) == 1 and np.isnan(deferred[-1]).all()   # the last one waits for a carrier ...
    from frost.autograd import complete_deferred_gradients
    complete_deferred_gradients()   # ... or for autograd, before anything reads a gradient
    assert not pending
    for got, want in zip(deferred, immediate):
        np.testing.assert_array_equal(got, want)


def test_launches_outside_backward_never_carry_or_leave_a_finalize():
    g, x, w_shape, want = _bf16_inputs(*CASES[0][0], seed=1)
    plan = mma.mma_plan(cw.geometry(g.shape, x.shape, w_shape, 1, 1), x.shape[0], **CASES[0][1])
    waiting = np.full(w_shape, np.nan, np.float32)
    cw.launch(plan, g, x, waiting, simulate=True, defer=True)
    out = np.full(w_shape, np.nan, np.float32)
    cw.launch(plan, g, x, out, simulate=True)   # as choose times it: its own finalize, the pending one untouched
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    assert np.isnan(waiting).all() and len(cw._pending()) == 1
    cw.finalize_pending()
    np.testing.assert_array_equal(waiting, out)


@pytest.mark.cuda
def test_gpu_seed_resnet_gradients_with_carried_finalizes_equal_the_immediate_ones(monkeypatch):
    # bf16 autocast, channels-last, AdamW's flat buffers (claimed .grad): each weight gradient's finalize rides with
    # the next launch; anomaly mode completes every one at once (no carrying): the same sums in the same order
    import contextlib

    import frost
    import frost.nn.functional as F
    from frost import autograd
    from frost.models.resnet import cifar_resnet
    carried = []
    take = cw._take_pending

    def counting_take(part):
        c = take(part)
        carried.append(c is not None)
        return c
    monkeypatch.setattr(cw, "_take_pending", counting_take)
    frost.manual_seed(0)
    model = cifar_resnet().to("cuda", memory_format=frost.channels_last)
    opt = frost.optim.AdamW(model.parameters())
    rng = np.random.default_rng(0)
    x = frost.tensor(rng.random((32, 3, 32, 32), dtype=np.float32), device="cuda").to(
        memory_format=frost.channels_last)
    y = frost.tensor(rng.integers(0, 10, 32), device="cuda")

    def gradients(anomaly: bool) -> dict:
        opt.zero_grad()
        with frost.autocast(frost.bfloat16), autograd.detect_anomaly() if anomaly else contextlib.nullcontext():
            F.cross_entropy(model(x).float(), y).backward()
        return {n: p.grad.numpy().astype(np.float64) for n, p in model.named_parameters()}

    gradients(False)   # the first backward chooses ours or cuDNN per shape
    opt.step()         # AdamW's flat buffers: zero_grad marks them, backward claims them
    carried.clear()
    deferred = gradients(False)
    assert sum(carried) >= 10, carried   # most of the 21 weight gradients rode with the next launch
    carried.clear()
    immediate = gradients(True)
    assert not any(carried)
    monkeypatch.setenv("FROST_CONV_WGRAD_CARRY", "0")   # each finalize in a launch of its own
    own = gradients(False)
    assert not any(carried)
    for name, want in immediate.items():
        for got in (deferred[name], own[name]):
            off = np.linalg.norm(got - want)
            assert off <= 1e-6 * np.linalg.norm(want), (name, off)
