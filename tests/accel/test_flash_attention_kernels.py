"""The flash-attention kernels (frost/accel/flash_*.py) in the kernel simulator at small sizes: O, the
log-sum-exp and dQ, dK, dV against PyTorch's float64 attention of the same bf16/f16 values and against Frost's
composed path, for causal (top-left, also with Lq != Lk) and not, ragged lengths, grouped-query attention and
key-padding masks with fully masked rows; the rules of `supported`; sm_90 compiles; and (on a GPU) the real kernels
behind scaled_dot_product_attention against the composed path."""

import inspect

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import frost
from frost import dispatch
from frost.accel import cudnn_attention
from frost.accel import flash_attention as fa
from frost.accel import flash_bulk, flash_fused_backward, flash_mma, flash_wgmma
from frost.ops.attention import scaled_dot_product_attention as sdpa

from attention_reference import DTYPES, UNIT, assert_close, inputs, reference, reference_with_dropout

SMALL = dict(BR=32, BC=32)   # 2 warps a block: quick in the simulator, and several tiles at these lengths
TINY = dict(BR=16, BC=16)    # 1 warp


def _composed(q, k, v, do, causal, group, mask):
    """Frost's composed scaled_dot_product_attention in the 16-bit type: (O, dQ, dK, dV)."""
    tq, tk, tv = (frost.Tensor(a, requires_grad=True) for a in (q, k, v))
    attn_mask = None if mask is None else frost.Tensor(mask[:, None, None, :])
    out = sdpa(tq, tk, tv, attn_mask=attn_mask, is_causal=causal, enable_gqa=group > 1)
    out.backward(frost.Tensor(do))
    return [t.detach().numpy().astype(np.float64) for t in (out, tq.grad, tk.grad, tv.grad)]


def _check(b, hq, hkv, lq, lk, d, causal, dtype="bfloat16", mask=None, tiles=SMALL, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v, do = inputs(rng, b, hq, hkv, lq, lk, d, dtype)
    group = hq // hkv
    p = fa.Problem(b, hq, group, lq, lk, d, causal, 1 / np.sqrt(d), mask is not None)
    o, lse = fa.forward_arrays(np, q, k, v, p, mask, tiles)
    grads = fa.backward_arrays(np, q, k, v, o, lse, do, p, mask, tiles)
    want = reference(q, k, v, do, causal, group, mask)
    composed = _composed(q, k, v, do, causal, group, mask)
    assert o.dtype == q.dtype and lse.dtype == np.float32 and [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    np.testing.assert_allclose(lse, want[1], rtol=1e-5, atol=1e-5)   # float32 sums of exact bf16 products
    unit = UNIT[dtype]
    for name, got, ref, comp in zip(("O", "dQ", "dK", "dV"), (o, *grads), want[:1] + want[2:], composed):
        assert_close(name, got, ref, comp, unit)
    return o, lse, grads


# (B, Hq, Hkv, Lq, Lk, D, causal, dtype, tiles): several tiles and ragged ends (33 = 32 + 1), causal with Lq > Lk
# and Lq < Lk (top-left), f16, GQA ratios 4 and 8
CASES = [
    (2, 2, 2, 16, 16, 64, False, "bfloat16", TINY),
    (1, 2, 2, 33, 33, 64, True, "bfloat16", SMALL),
    (1, 2, 2, 33, 20, 64, True, "float16", TINY),
    (1, 2, 2, 20, 47, 64, True, "bfloat16", TINY),
    (1, 1, 1, 33, 40, 64, False, "float16", TINY),
    (1, 4, 1, 24, 17, 64, True, "bfloat16", TINY),
    (1, 8, 1, 16, 16, 64, False, "bfloat16", TINY),
]


@pytest.mark.parametrize("b,hq,hkv,lq,lk,d,causal,dtype,tiles", CASES)
def test_simulated_kernels_match_float64_and_composed(b, hq, hkv, lq, lk, d, causal, dtype, tiles):
    _check(b, hq, hkv, lq, lk, d, causal, dtype, tiles=tiles)


def test_head_dim_128_with_default_tiles():
    _check(1, 1, 1, 20, 20, 128, True, tiles=None)   # the backward's swapped tiles (BR=64, BC=32) at their defaults


def test_key_padding_mask_with_a_fully_masked_row_gives_zeros():
    mask = np.ones((2, 33), bool)
    mask[0, 5:] = False
    mask[1, :] = False   # batch entry 1 attends nothing: O = 0, log-sum-exp -inf, no gradient
    o, lse, (dq, dk, dv) = _check(2, 1, 1, 17, 33, 64, False, mask=mask, tiles=TINY)
    assert (o[1] == 0).all() and np.isneginf(lse[1]).all() and (dq[1] == 0).all() and (dk[1] == 0).all()
    assert (dk[0, :, 5:] == 0).all() and (dv[0, :, 5:] == 0).all()   # masked keys get no gradient


@pytest.mark.slow
def test_default_tiles_at_a_ragged_length():
    _check(1, 1, 1, 71, 71, 64, True, tiles=None)   # 64 + 7: two 64-row tiles, the second mostly padding


def test_the_op_runs_forward_and_backward_through_autograd():
    rng = np.random.default_rng(1)
    q, k, v, do = inputs(rng, 1, 2, 1, 17, 17, 64, "bfloat16")
    tq, tk, tv = (frost.Tensor(a, requires_grad=True) for a in (q, k, v))
    out = fa.flash_attention(tq, tk, tv, is_causal=True, enable_gqa=True, tiles=TINY)
    out.backward(frost.Tensor(do))
    want = reference(q, k, v, do, True, 2, None)
    unit = UNIT["bfloat16"]
    for name, got, ref in zip(("O", "dQ", "dK", "dV"), (out, tq.grad, tk.grad, tv.grad), want[:1] + want[2:]):
        assert_close(name, got.detach().numpy(), ref, None, unit)


def _projection_heads(rng, b, h, lq, d, parts=3):
    """q, k, v (B, H, L, D) sliced out of one (B, L, parts x H x D) projection, as a GPT's attention takes them."""
    proj = rng.standard_normal((b, lq, parts * h * d)).astype(ml_dtypes.bfloat16)
    c = h * d
    return proj, [proj[..., i * c:(i + 1) * c].reshape(b, lq, h, d).transpose(0, 2, 1, 3) for i in range(parts)]


def _as_laid_out_and_contiguous(q, k, v, do, p):
    """(O, log-sum-exp, dQ, dK, dV) of q, k, v as they are, and of C-order copies of them; the first asserted equal,
    bit for bit, to the second."""
    o, lse = fa.forward_arrays(np, q, k, v, p, tiles=TINY)
    grads = fa.backward_arrays(np, q, k, v, o, lse, do, p, tiles=TINY)
    contiguous = [np.ascontiguousarray(a) for a in (q, k, v)]
    o_c, lse_c = fa.forward_arrays(np, *contiguous, p, tiles=TINY)
    grads_c = fa.backward_arrays(np, *contiguous, o_c, lse_c, np.ascontiguousarray(do), p, tiles=TINY)
    np.testing.assert_array_equal(lse, lse_c)
    for got, want in zip((o, *grads), (o_c, *grads_c)):
        np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
    return o, grads


@pytest.mark.parametrize("causal", [False, True])
def test_heads_read_where_they_lie_give_the_results_of_contiguous_copies(causal):
    # the kernels read q, k, v strided out of the projection and write O laid out (B, L, H, D); the gradients of
    # q, k, v are views of one block laid out as the projection: bit for bit the contiguous inputs' results
    rng = np.random.default_rng(3)
    b, h, lq, d = 2, 2, 17, 64
    proj, (q, k, v) = _projection_heads(rng, b, h, lq, d)
    do = rng.standard_normal((b, h, lq, d)).astype(ml_dtypes.bfloat16)
    o, grads = _as_laid_out_and_contiguous(q, k, v, do, fa.Problem(b, h, 1, lq, lq, d, causal, 1 / np.sqrt(d), False))
    assert o.transpose(0, 2, 1, 3).flags.c_contiguous   # (B, L, H, D): O.transpose(1, 2).reshape(B, L, C) a view
    assert [g.strides for g in grads] == [q.strides] * 3
    step = q.shape[1] * d * 2   # one head group (C values) apart, as q, k and v in the projection
    assert [g.ctypes.data - grads[0].ctypes.data for g in grads] == [0, step, 2 * step]


def test_keys_and_values_of_different_layouts_and_unaligned_rows_are_copied_first():
    rng = np.random.default_rng(4)
    b, h, lq, d = 1, 2, 17, 64
    _, (q, k, v) = _projection_heads(rng, b, h, lq, d)
    wide = rng.standard_normal((b, h, lq, d + 1)).astype(ml_dtypes.bfloat16)
    unaligned = wide[..., 1:]   # rows 2 bytes past 16-byte boundaries: the kernels' 16-byte copies cannot read them
    do = rng.standard_normal((b, h, lq, d)).astype(ml_dtypes.bfloat16)
    p = fa.Problem(b, h, 1, lq, lq, d, True, 1 / np.sqrt(d), False)
    _as_laid_out_and_contiguous(unaligned, k, np.ascontiguousarray(v), do, p)


def test_gradients_like_shares_one_block_only_for_slices_that_tile_one():
    proj = np.zeros((2, 5, 3 * 4 * 8), np.float32)
    heads = [proj[..., i * 32:(i + 1) * 32].reshape(2, 5, 4, 8).transpose(0, 2, 1, 3) for i in range(3)]
    shared = fa.gradients_like(np, tuple(heads))
    assert [g.strides for g in shared] == [heads[0].strides] * 3
    assert shared[2].ctypes.data - shared[0].ctypes.data == 2 * 32 * 4
    two_of_three = fa.gradients_like(np, (heads[0], heads[2]))   # a gap between them: each its own C-order array
    assert all(g.flags.c_contiguous for g in two_of_three)
    dense = np.zeros((2, 5, 4, 8), np.float32).transpose(0, 2, 1, 3)
    (like,) = fa.gradients_like(np, (dense,))
    assert like.strides == dense.strides and like.shape == dense.shape


def test_a_gpt_attention_through_autograd_matches_float64_and_joins_the_gradient_of_the_projection():
    # split, heads (B, H, T, D) as views, flash attention, back to (B, T, C): the gradient of the projection is the
    # block the kernels wrote dQ, dK and dV into (a view), and matches PyTorch float64
    rng = np.random.default_rng(5)
    b, h, t, d = 1, 2, 17, 64
    c = h * d
    proj = rng.standard_normal((b, t, 3 * c)).astype(ml_dtypes.bfloat16)
    dy = rng.standard_normal((b, t, c)).astype(ml_dtypes.bfloat16)
    x = frost.Tensor(proj, requires_grad=True)
    q, k, v = (u.reshape(b, t, h, d).transpose(1, 2) for u in x.split(c, dim=2))
    y = fa.flash_attention(q, k, v, is_causal=True, tiles=TINY).transpose(1, 2).reshape(b, t, c)
    y.backward(frost.Tensor(dy))
    tx = torch.tensor(proj.astype(np.float64), requires_grad=True)
    tq, tk, tv = (u.reshape(b, t, h, d).transpose(1, 2) for u in tx.split(c, dim=2))
    ty = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True).transpose(1, 2).reshape(b, t, c)
    ty.backward(torch.tensor(dy.astype(np.float64)))
    unit = UNIT["bfloat16"]
    assert_close("y", y.detach().numpy(), ty.detach().numpy(), None, unit)
    assert_close("dx", x.grad.numpy(), tx.grad.numpy(), None, unit)


def _tensors(*shapes, dtype="bfloat16"):
    return [frost.Tensor(np.zeros(s, DTYPES.get(dtype, dtype))) for s in shapes]


def test_applies_covers_only_what_the_kernels_compute():
    q, k, v = _tensors((2, 4, 8, 64), (2, 2, 8, 64), (2, 2, 8, 64))
    assert fa.applies(q, k, v, enable_gqa=True)
    assert not fa.applies(q, k, v)                                    # grouped heads need enable_gqa
    assert fa.applies(q, k, v, dropout_p=0.1, enable_gqa=True)
    assert not fa.applies(q, k, v, dropout_p=1.5, enable_gqa=True)
    assert fa.applies(q, q, q, attn_mask=frost.Tensor(np.ones((2, 1, 1, 8), bool)))   # key padding
    assert fa.applies(q, q, q, attn_mask=frost.Tensor(np.ones((1, 1, 1, 8), bool)))
    assert not fa.applies(q, q, q, attn_mask=frost.Tensor(np.ones((2, 1, 8, 8), bool)))  # per-query mask
    assert not fa.applies(q, q, q, attn_mask=frost.Tensor(np.zeros((2, 1, 1, 8), np.float32)))  # additive
    assert not fa.applies(*_tensors((2, 4, 8, 64), (2, 4, 8, 64), (2, 4, 8, 64), dtype="float32"))
    assert not fa.applies(*_tensors((2, 4, 8, 32), (2, 4, 8, 32), (2, 4, 8, 32)))          # head dim 32
    assert not fa.applies(*_tensors((4, 8, 64), (4, 8, 64), (4, 8, 64)))                   # 3-D
    assert not fa.applies(*_tensors((2, 4, 8, 64), (2, 4, 8, 64), (2, 4, 8, 128)))         # Ev != E
    assert not fa.applies(*_tensors((2, 4, 0, 64), (2, 4, 8, 64), (2, 4, 8, 64)))          # empty
    assert fa.applies(q, q, q, scale=0.01)
    for scale in (0.0, -0.125, float("inf"), float("nan"), 1e-46, 1e39):   # the online softmax scales each row's
        assert not fa.applies(q, q, q, scale=scale), scale                  # maximum; float32 0 and inf


def test_flash_attention_refuses_a_scale_its_softmax_cannot_take():
    """Called directly, a causal problem (tiles that are not whole) with a zero or negative scale gave NaN; now an
    error naming the op and the scale (scaled_dot_product_attention takes such scales on its composed path)."""
    q = frost.Tensor(np.random.default_rng(0).standard_normal((1, 1, 16, 64)).astype(DTYPES["bfloat16"]))
    for scale in (0.0, -0.125, 1e-46):
        with pytest.raises(ValueError, match=r"flash_attention: scale must be positive and finite .* got "):
            fa.flash_attention(q, q, q, is_causal=True, scale=scale, tiles=TINY)


@pytest.mark.parametrize("b,hq,hkv,lq,lk,causal,drop_p", [(1, 2, 2, 33, 33, True, 0.3), (1, 4, 2, 20, 37, False, 0.5),
                                                         (1, 2, 2, 16, 16, False, 1.0)])
def test_simulated_kernels_with_dropout_match_float64_with_the_twins_mask(b, hq, hkv, lq, lk, causal, drop_p):
    rng = np.random.default_rng(7)
    q, k, v, do = inputs(rng, b, hq, hkv, lq, lk, 64, "bfloat16")
    state = np.array([0x12345678, 0x9ABCDEF0, 77, 0], np.uint32)
    p = fa.Problem(b, hq, hq // hkv, lq, lk, 64, causal, 1 / 8, False, drop_p)
    o, lse = fa.forward_arrays(np, q, k, v, p, None, TINY, rng=state)
    grads = fa.backward_arrays(np, q, k, v, o, lse, do, p, None, TINY, rng=state)
    keep = fa.dropout_keep_numpy(state, b * hq, lq, lk, drop_p).reshape(b, hq, lq, lk).astype(np.float64)
    want = reference_with_dropout(q, k, v, do, causal, hq // hkv, keep)
    no_dropout = reference(q, k, v, do, causal, hq // hkv, None)
    np.testing.assert_allclose(lse, no_dropout[1], rtol=1e-5, atol=1e-5)   # the undropped weights' log-sum-exp
    for name, got, ref in zip(("O", "dQ", "dK", "dV"), (o, *grads), want):
        # the kept weights are scaled by 1 / (1 - p) (up to 2) before rounding: twice the units of no dropout
        assert_close(name, got, ref, None, 2 * UNIT["bfloat16"])
    if drop_p == 1.0:
        assert not o.astype(np.float64).any() and not grads[2].astype(np.float64).any()


@pytest.mark.cuda
@pytest.mark.parametrize("causal, d", [(True, 64), (False, 128)])
def test_gpu_kernels_with_dropout_match_float64_with_the_twins_mask(causal, d):
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(8)
    q, k, v, do = inputs(rng, 2, 4, 2, 200, 130, d, "bfloat16")
    state = np.array([0xDEADBEEF, 5, 1 << 20, 0], np.uint32)
    p = fa.Problem(2, 4, 2, 200, 130, d, causal, 1 / np.sqrt(d), False, 0.2)
    arrays = [cp.asarray(a) for a in (q, k, v, do)]
    o, lse = fa.forward_arrays(cp, *arrays[:3], p, rng=cp.asarray(state))
    grads = fa.backward_arrays(cp, *arrays[:3], o, lse, arrays[3], p, rng=cp.asarray(state))
    keep = fa.dropout_keep_numpy(state, 8, 200, 130, 0.2).reshape(2, 4, 200, 130).astype(np.float64)
    want = reference_with_dropout(q, k, v, do, causal, 2, keep)
    for name, got, ref in zip(("O", "dQ", "dK", "dV"), (o, *grads), want):
        assert_close(name, got.get(), ref, None, 2 * UNIT["bfloat16"])


def test_the_dropout_twin_keeps_one_minus_p_and_depends_on_every_coordinate():
    state = np.array([1, 2, 3, 0], np.uint32)
    keep = fa.dropout_keep_numpy(state, 4, 200, 300, 0.25)
    assert set(np.unique(keep)) == {0.0, np.float32(1 / 0.75)}
    assert abs((keep > 0).mean() - 0.75) < 0.005                     # 240,000 draws: 5 sigma is 0.0044
    for a, b in ((keep[0], keep[1]), (keep[0, 0], keep[0, 1]), (keep[0, :, 0::2], keep[0, :, 1::2])):
        assert (a != b).any()                                         # heads, queries and the two words differ
    moved = fa.dropout_keep_numpy(np.array([1, 2, 4, 0], np.uint32), 4, 200, 300, 0.25)
    assert (moved != keep).mean() > 0.3                               # the next offset draws a new mask


def test_the_op_with_dropout_draws_a_new_mask_each_call_and_follows_manual_seed():
    rng = np.random.default_rng(3)
    q, k, v, _ = inputs(rng, 1, 2, 2, 16, 16, 64, "bfloat16")

    def run():
        return fa.flash_attention(*(frost.Tensor(a) for a in (q, k, v)), tiles=TINY, dropout_p=0.5).numpy()
    frost.manual_seed(11)
    first, second = run(), run()
    frost.manual_seed(11)
    assert np.array_equal(run(), first) and not np.array_equal(first, second)


def test_supported_is_false_on_the_cpu_and_when_switched_off(monkeypatch):
    q, k, v = _tensors((1, 2, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64))
    assert fa.applies(q, k, v) and not fa.supported(q, k, v)   # CPU tensors take the composed path
    monkeypatch.setenv("FROST_FLASH_ATTENTION", "0")
    assert not fa.supported(q, k, v)


def test_bad_input_names_the_op_and_shapes():
    q, k, v = _tensors((1, 3, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64))
    with pytest.raises(ValueError, match=r"flash_attention: query heads 3 .* multiple"):
        fa.flash_attention(q, k, v, enable_gqa=True)
    q, k = _tensors((1, 2, 8, 64), (1, 2, 8, 64))
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape .* \(1, 8\)"):
        fa.flash_attention(q, k, k, key_padding_mask=frost.Tensor(np.ones((1, 7), bool)))
    with pytest.raises(ValueError, match="tiles BR=24"):
        fa.check_tiles(dict(BR=24, BC=32), 64)
    with pytest.raises(ValueError, match="flash_attention: dropout_p must be between 0 and 1, got 1.5"):
        fa.flash_attention(q, k, k, dropout_p=1.5)
    p = fa.Problem(1, 2, 1, 8, 8, 64, False, 0.125, False, 0.5)
    with pytest.raises(ValueError, match="flash_attention: dropout needs the generator state"):
        fa.forward_arrays(np, q.data, k.data, k.data, p)
    with pytest.raises(ValueError, match=r"flash_attention: rng must be 4 uint32 words, got int64 \(4,\)"):
        fa.forward_arrays(np, q.data, k.data, k.data, p, rng=np.zeros(4, np.int64))


@pytest.mark.parametrize("d", fa.HEAD_DIMS)
def test_kernels_compile_for_sm90(d, tmp_path, monkeypatch):
    pytest.importorskip("cuda.bindings")
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    kernels = flash_mma.kernels_for("bfloat16")
    fwd, bwd = fa.FORWARD_TILES[d], fa.BACKWARD_TILES[d]
    for dropout in (0, 1):
        flags = dict(D=d, CAUSAL=1, MASKED=1, DROPOUT=dropout)
        for kern, tiles in ((kernels.forward, fwd), (kernels.dq, bwd),
                            (kernels.dkdv, dict(BR=bwd["BC"], BC=bwd["BR"]))):
            assert kern.compile("sm_90", **tiles, **flags)[:4] == b"\x7fELF"
    assert kernels.dot.compile("sm_90", D=d)[:4] == b"\x7fELF"


# ------------------------------------------------------------------ the Hopper forward (warpgroup MMA)
WG_SMALL = dict(WGS=1, BC=64)   # one warpgroup of 64 rows: the smallest wgmma tile, quick in the simulator


@pytest.mark.parametrize("b,hq,hkv,lq,lk,d,causal,masked,tiles", [
    (1, 2, 1, 70, 100, 64, True, False, WG_SMALL),      # GQA 2, causal with Lq != Lk, ragged rows and keys
    (2, 2, 2, 40, 90, 64, False, True, WG_SMALL),       # key-padding mask, two key tiles
    (1, 1, 1, 50, 70, 128, True, False, WG_SMALL),      # head dim 128: two 64-column panels of Q and K
    (1, 1, 1, 130, 140, 64, False, False, dict(WGS=2, BC=128)),   # the default shape: two warpgroups, 128 keys
])
def test_wgmma_forward_matches_float64_and_the_mma_forward(b, hq, hkv, lq, lk, d, causal, masked, tiles):
    _check_hopper_forward("wgmma", b, hq, hkv, lq, lk, d, causal, masked, tiles)


def _check_hopper_forward(variant, b, hq, hkv, lq, lk, d, causal, masked, tiles):
    """The forward `variant` in the simulator against float64 and the mma.sync forward."""
    rng = np.random.default_rng(lq + lk)
    q, k, v, do = inputs(rng, b, hq, hkv, lq, lk, d, "bfloat16")
    mask = None
    if masked:
        mask = rng.random((b, lk)) > 0.3
        mask[1, :] = False   # a batch entry that attends nothing: O = 0, log-sum-exp -inf
    p = fa.Problem(b, hq, hq // hkv, lq, lk, d, causal, 1 / np.sqrt(d), masked)
    o, lse = fa.forward_arrays(np, q, k, v, p, mask, tiles, variant=variant)
    o_mma, lse_mma = fa.forward_arrays(np, q, k, v, p, mask, TINY, variant="mma")
    want = reference(q, k, v, do, causal, hq // hkv, mask)
    assert o.dtype == q.dtype and lse.dtype == np.float32
    np.testing.assert_allclose(lse, want[1], rtol=1e-5, atol=1e-5)
    assert_close("O", o, want[0], o_mma.astype(np.float64), UNIT["bfloat16"])
    if masked:
        assert (o[1] == 0).all() and np.isneginf(lse[1]).all()


def test_wgmma_forward_with_dropout_draws_the_mma_forwards_mask():
    """The same mask (the backward regenerates it from the mma.sync kernels' stream), so the two forwards agree to
    rounding: the wgmma forward can sit in front of the existing backward."""
    rng = np.random.default_rng(9)
    q, k, v, do = inputs(rng, 1, 2, 2, 70, 80, 64, "bfloat16")
    state = np.array([0x1234, 0x5678, 9, 0], np.uint32)
    p = fa.Problem(1, 2, 1, 70, 80, 64, True, 1 / 8, False, 0.3)
    o, lse = fa.forward_arrays(np, q, k, v, p, None, WG_SMALL, rng=state, variant="wgmma")
    keep = fa.dropout_keep_numpy(state, 2, 70, 80, 0.3).reshape(1, 2, 70, 80).astype(np.float64)
    want = reference_with_dropout(q, k, v, do, True, 1, keep)
    assert_close("O", o, want[0], None, 2 * UNIT["bfloat16"])
    grads = fa.backward_arrays(np, q, k, v, o, lse, do, p, None, TINY, rng=state)
    for name, got, ref in zip(("dQ", "dK", "dV"), grads, want[1:]):
        assert_close(name, got, ref, None, 2 * UNIT["bfloat16"])


@pytest.mark.parametrize("b,hq,hkv,lq,lk,causal,masked,drop_p,wgs", [
    (1, 2, 1, 40, 150, True, False, 0.0, 1),    # GQA; causal with Lk > Lq: key blocks after every query get zeros
    (2, 1, 1, 40, 70, False, True, 0.0, 1),     # key-padding mask with an empty row
    (1, 1, 1, 130, 130, True, False, 0.0, 2),   # the default two warpgroups
    (1, 1, 1, 80, 80, True, False, 0.3, 1),     # dropout
])
@pytest.mark.parametrize("d", [64, 128])        # 128: steps of 64 keys (dQ), 32 queries (dK/dV, half a panel)
def test_wgmma_backward_matches_float64_and_the_mma_backward(b, hq, hkv, lq, lk, causal, masked, drop_p, wgs, d,
                                                             monkeypatch):
    if d == 128 and (masked or wgs == 2):
        pytest.skip("head dim 128 takes the other cases (the simulator is slow)")
    monkeypatch.setitem(fa.WGMMA_BACKWARD_TILES, d, dict(fa.WGMMA_BACKWARD_TILES[d], WGS=wgs))
    _check_hopper_backward("wgmma", b, hq, hkv, lq, lk, causal, masked, drop_p, d, seed=lq * 7 + lk)


def _check_hopper_backward(variant, b, hq, hkv, lq, lk, causal, masked, drop_p, d, seed):
    """A Hopper backward (simulated) against float64 PyTorch and the mma.sync backward: dQ, dK, dV in bf16, zeros
    for a batch whose keys are all masked."""
    rng = np.random.default_rng(seed)
    q, k, v, do = inputs(rng, b, hq, hkv, lq, lk, d, "bfloat16")
    mask = None
    if masked:
        mask = rng.random((b, lk)) > 0.3
        mask[1, :] = False
    group = hq // hkv
    p = fa.Problem(b, hq, group, lq, lk, d, causal, 1 / np.sqrt(d), masked, drop_p)
    state = np.array([0x9E37, 0x79B9, 3, 0], np.uint32)
    o, lse = fa.forward_arrays(np, q, k, v, p, mask, SMALL, rng=state, variant="mma")
    grads = fa.backward_arrays(np, q, k, v, o, lse, do, p, mask, SMALL, rng=state, variant=variant)
    mma = fa.backward_arrays(np, q, k, v, o, lse, do, p, mask, SMALL, rng=state, variant="mma")
    if drop_p:
        keep = fa.dropout_keep_numpy(state, b * hq, lq, lk, drop_p).reshape(b, hq, lq, lk).astype(np.float64)
        want = reference_with_dropout(q, k, v, do, causal, group, keep)[1:]
        unit = 2 * UNIT["bfloat16"]
    else:
        want = reference(q, k, v, do, causal, group, mask)[2:]
        unit = UNIT["bfloat16"]
    for name, got, ref, other in zip(("dQ", "dK", "dV"), grads, want, mma):
        assert got.dtype == q.dtype
        assert_close(name, got, ref, other.astype(np.float64), unit)
    if masked:
        assert (grads[0][1] == 0).all() and (grads[1][1] == 0).all()


KEYS = dict(RS=0)      # the fused backward with keys as rows, P^T and dS^T through shared memory
KEYS_RS = dict(RS=1)   # ... from registers (the default)
OVERLAPPED = dict(RS=1, OVERLAP_EXP=1)   # P^T's exponentials while dP^T multiplies
OVERLAPPED_SMEM = dict(RS=0, OVERLAP_EXP=1)
FUSED_SETTINGS = [KEYS, KEYS_RS, OVERLAPPED, OVERLAPPED_SMEM]
FUSED_IDS = ["keys", "keys_rs", "overlapped", "overlapped_smem"]


@pytest.mark.parametrize("b,hq,hkv,lq,lk,causal,masked,drop_p,wgs,d", [
    (1, 2, 1, 70, 150, True, False, 0.0, 1, 64),    # GQA, two query tiles; causal Lk > Lq: late key blocks get zeros
    (2, 1, 1, 40, 70, False, True, 0.0, 2, 64),     # key-padding mask with an empty row; dQ split over warpgroups
    (1, 1, 1, 80, 80, True, False, 0.3, 1, 64),     # dropout
    (1, 2, 1, 70, 40, True, False, 0.0, 1, 128),    # head dim 128: two K panels; GQA; Lq > Lk
    (1, 1, 1, 65, 65, False, False, 0.0, 2, 128),   # two warpgroups, each half of dQ's 128 columns
    (1, 2, 1, 130, 70, False, False, 0.0, 2, 64),   # two warpgroups, six steps: each buffer refilled twice
])
@pytest.mark.parametrize("setting", FUSED_SETTINGS, ids=FUSED_IDS)
def test_fused_backward_matches_float64_and_the_mma_backward(b, hq, hkv, lq, lk, causal, masked, drop_p, wgs, d,
                                                             setting, monkeypatch):
    """One kernel per key block, dQ added across blocks in float32 through bulk reductions (variant "fused"), P^T
    and dS^T from shared memory or from registers (RS)."""
    monkeypatch.setitem(fa.FUSED_BACKWARD_TILES, d, dict(setting, WGS=wgs))
    _check_hopper_backward("fused", b, hq, hkv, lq, lk, causal, masked, drop_p, d, seed=lq * 5 + lk)


def test_wgmma_forward_is_asked_for_and_refuses_what_it_does_not_take(monkeypatch):
    rng = np.random.default_rng(1)
    q, k, v, _ = inputs(rng, 1, 1, 1, 16, 16, 64, "float16")
    p = fa.Problem(1, 1, 1, 16, 16, 64, False, 1 / 8, False)
    monkeypatch.setenv("FROST_FLASH_WGMMA", "1")
    assert not fa.uses_wgmma(np, q, None)   # the simulator runs it only when asked by name
    assert fa.uses_wgmma(np, q, "wgmma") and not fa.uses_wgmma(np, q, "mma")
    with pytest.raises(ValueError, match=r"flash_attention: variant must be one of 'mma', 'wgmma', 'bulk', got 'tma'"):
        fa.uses_wgmma(np, q, "tma")
    with pytest.raises(ValueError, match=r"the wgmma forward takes bf16, got float16"):
        fa.forward_arrays(np, q, k, v, p, variant="wgmma")
    qb, kb, vb = (a.astype(ml_dtypes.bfloat16) for a in (q, k, v))
    with pytest.raises(ValueError, match=r"the wgmma forward takes WGS 1 or 2 and BC 64 or 128"):
        fa.forward_arrays(np, qb, kb, vb, p, tiles=dict(BC=32), variant="wgmma")
    assert fa.wgmma_tiles(64, dropout=True)["BC"] == 64 and fa.wgmma_tiles(64, dropout=False)["BC"] == 128


@pytest.mark.parametrize("d", fa.HEAD_DIMS)
def test_wgmma_forward_compiles_for_sm90a_without_spills(d, tmp_path, monkeypatch):
    pytest.importorskip("cuda.bindings")
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    kern = flash_wgmma.wgmma_forward()
    for dropout in (False, True):
        tiles = fa.wgmma_tiles(d, dropout)
        info = kern.inspect("sm_90", D=d, CAUSAL=1, MASKED=1, DROPOUT=int(dropout), **tiles)
        assert info["spill_stores"] == 0 and info["spill_loads"] == 0, (d, dropout, info["registers"])
        assert "C7515" not in info["log"]   # ptxas would serialize the wgmmas


@pytest.mark.parametrize("b,hq,hkv,lq,lk,d,causal,masked,tiles", [
    (1, 2, 1, 70, 100, 64, True, False, dict(WGS=1, BC=64, STAGES=2)),    # GQA 2, causal, Lq != Lk, ragged
    (2, 2, 2, 40, 90, 64, False, True, dict(WGS=1, BC=64, STAGES=1)),     # key-padding mask, one stage reused
    (1, 1, 1, 200, 200, 128, True, False, dict(WGS=1, BC=64, STAGES=2)),  # head dim 128, a stage refilled twice
    (1, 1, 1, 50, 70, 128, True, False, dict(WGS=1, BC=64, STAGES=3)),    # more stages than tiles
    (1, 4, 1, 130, 300, 64, False, False, dict(WGS=2, BC=128, STAGES=2)),  # 2 warpgroups, GQA 4
    (1, 2, 1, 130, 300, 64, True, False, dict(WGS=2, BC=64, STAGES=2, PINGPONG=1)),  # the warpgroups take turns
    (2, 2, 2, 120, 200, 128, False, True, dict(WGS=2, BC=64, STAGES=2, RS=1)),  # P in registers (wgmma_bf16_rs)
    (1, 2, 2, 100, 60, 64, False, False, dict(WGS=2, BC=64, STAGES=2, RS=1, PINGPONG=1)),   # one tile: no turns
    (1, 2, 1, 150, 290, 128, True, False, dict(WGS=2, BC=128, STAGES=2, RS=1)),  # 128-key tiles, P in registers
    (1, 2, 1, 70, 400, 128, False, False, dict(WGS=2, BC=176, STAGES=2, RS=1)),  # 176-key tiles (not panels of 64)
    (1, 1, 1, 250, 200, 64, True, False, dict(WGS=3, BC=64, STAGES=2, RS=1)),    # three consumer warpgroups
    (2, 2, 1, 150, 300, 64, False, True, fa.BULK_TILES[128]),   # 128-key tiles, turns, masked
    # persistent: 3 simulated SMs. 2 x 2 heads x 3 tiles = 12 tiles, 4 each; the rings run on across tiles
    (2, 2, 1, 150, 200, 64, True, False, dict(WGS=1, BC=64, STAGES=2, PERSIST=1)),
    (2, 2, 1, 130, 190, 128, False, True, dict(WGS=2, BC=64, STAGES=3, RS=1, PINGPONG=1, PERSIST=1)),  # turns
    (1, 2, 1, 250, 250, 64, True, False, dict(WGS=2, BC=128, STAGES=2, RS=1, PINGPONG=1, PERSIST=1)),
    (1, 3, 3, 60, 70, 64, False, False, dict(WGS=1, BC=64, STAGES=2, PERSIST=1)),   # a tile a block
])
def test_bulk_forward_matches_float64_and_the_mma_forward(b, hq, hkv, lq, lk, d, causal, masked, tiles):
    """The warp-specialized forward: a producer thread's tensor-map copies through mbarrier rings, consumer warpgroups
    meeting on named barriers; the simulator checks every ordering its race detector can see."""
    _check_hopper_forward("bulk", b, hq, hkv, lq, lk, d, causal, masked, tiles)


def test_kv_tensor_map_reads_k_where_it_lies_or_copies_what_the_copy_engine_cannot():
    """K in (B, L, H, D) order seen as (B, H, L, D), one head (its stride never used), heads repeated by a zero
    stride (copied first): each map's box at (batch, head, key, column) is that slice of K, zeros past the keys."""
    rng = np.random.default_rng(11)
    p = fa.Problem(2, 3, 1, 8, 70, 128, False, 0.1, False)
    blhd = rng.standard_normal((2, 70, 3, 128)).astype(ml_dtypes.bfloat16).transpose(0, 2, 1, 3)
    one_head = rng.standard_normal((2, 1, 70, 128)).astype(ml_dtypes.bfloat16)
    repeated = np.broadcast_to(one_head, (2, 3, 70, 128))
    for k, in_place in ((blhd, True), (one_head, True), (repeated, False)):
        tmap = fa.kv_tensor_map(np, k, p, 64)
        assert np.shares_memory(tmap.array, k) == in_place and min(tmap.array.strides) > 0
        for coords in ((1, k.shape[1] - 1, 0, 64), (0, 0, 64, 0)):
            b, h, k0, c0 = coords
            want = np.zeros((64, 64), np.float32)
            rows = k[b, h, k0:k0 + 64, c0:c0 + 64].astype(np.float32)
            want[:len(rows)] = rows
            got = tmap.box_image(coords).astype(np.float32)
            np.testing.assert_array_equal(got.reshape(64, 64)[np.arange(64)[:, None], swizzled_columns()], want)


def swizzled_columns() -> np.ndarray:
    """Where column c of row r of a 64-column bf16 box lands with the 128-byte swizzle (lib.swizzle's layout)."""
    r, c = np.arange(64)[:, None], np.arange(64)[None, :]
    return (c // 8 ^ r % 8) * 8 + c % 8


# (head dim, causal, masked, which default) -> the spill bytes a thread ptxas gave the defaults measured fastest
# although they spill, when they were timed: they must not grow
SPILLS_WHEN_TIMED = {(64, False, 0, "long"): 44, (64, False, 0, "short"): 44, (128, True, 0, "short"): 68}


@pytest.mark.parametrize("d", fa.HEAD_DIMS)
def test_bulk_forward_compiles_for_sm90a_without_spills(d, tmp_path, monkeypatch):
    """The default tiles (causal or not, with dropout or not, long and short) and the other timed settings compile to
    sm_90a without spills, with a key mask and without, but for the defaults measured fastest although they spill
    (SPILLS_WHEN_TIMED), whose spills must stay as few as when they were timed."""
    pytest.importorskip("cuda.bindings")
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    settings = [("long", causal, dropout, fa.bulk_tiles(d, dropout, causal)) for causal in (False, True)
                for dropout in (False, True)]
    settings += [("other", True, False, dict(WGS=3, BC=64, STAGES=2, PINGPONG=0, RS=1, PERSIST=0))]  # the old default
    settings += [("short", causal, False, fa.bulk_tiles(d, False, causal, lq=512)) for causal in (False, True)]
    for label, causal, dropout, tiles in settings:
        for masked in (0, 1):
            info = flash_bulk.bulk_forward().inspect("sm_90", D=d, CAUSAL=int(causal), MASKED=masked,
                                                     DROPOUT=int(dropout), **tiles)
            allowed = 0 if dropout else SPILLS_WHEN_TIMED.get((d, causal, masked, label), 0)
            assert info["spill_stores"] <= allowed, (d, causal, masked, dropout, tiles, info["spill_stores"])
            assert "C7515" not in info["log"]
            assert "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes" in info["ptx"]


@pytest.mark.parametrize("d", fa.HEAD_DIMS)
def test_wgmma_backward_compiles_for_sm90a_without_spills(d, tmp_path, monkeypatch):
    pytest.importorskip("cuda.bindings")
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    dq, dkdv = flash_wgmma.wgmma_backward()
    tiles = fa.WGMMA_BACKWARD_TILES[d]
    for kern, consts in ((dq, dict(WGS=tiles["WGS"], BC=tiles["BC"])), (dkdv, dict(WGS=tiles["WGS"], BR=tiles["BR"]))):
        for dropout in (0, 1):
            info = kern.inspect("sm_90", D=d, CAUSAL=1, MASKED=1, DROPOUT=dropout, **consts)
            assert info["spill_stores"] == 0 and info["spill_loads"] == 0, (kern.__name__, dropout, info["registers"])
            assert "C7515" not in info["log"]


@pytest.mark.cuda
@pytest.mark.parametrize("b,hq,hkv,lq,lk,d,causal,drop_p", [(2, 4, 4, 300, 300, 64, False, 0.0),
                                                           (2, 8, 2, 257, 300, 128, True, 0.0),
                                                           (2, 4, 2, 200, 130, 64, True, 0.2),
                                                           (1, 4, 4, 150, 150, 128, False, 0.1)])
@pytest.mark.parametrize("variant", ["wgmma", "bulk"])   # bulk: its own forward, the wgmma backward
def test_gpu_wgmma_kernels_match_float64(b, hq, hkv, lq, lk, d, causal, drop_p, variant):
    cp = pytest.importorskip("cupy")
    if cp.cuda.Device().compute_capability != "90":
        pytest.skip("the wgmma forward needs a Hopper GPU")
    rng = np.random.default_rng(4)
    q, k, v, do = inputs(rng, b, hq, hkv, lq, lk, d, "bfloat16")
    state = np.array([3, 1, 4, 0], np.uint32)
    p = fa.Problem(b, hq, hq // hkv, lq, lk, d, causal, 1 / np.sqrt(d), False, drop_p)
    arrays = [cp.asarray(a) for a in (q, k, v, do)]
    o, lse = fa.forward_arrays(cp, *arrays[:3], p, rng=cp.asarray(state), variant=variant)
    grads = fa.backward_arrays(cp, *arrays[:3], o, lse, arrays[3], p, rng=cp.asarray(state), variant=variant)
    if drop_p:
        keep = fa.dropout_keep_numpy(state, b * hq, lq, lk, drop_p).reshape(b, hq, lq, lk).astype(np.float64)
        want, unit = reference_with_dropout(q, k, v, do, causal, hq // hkv, keep), 2 * UNIT["bfloat16"]
    else:
        full = reference(q, k, v, do, causal, hq // hkv, None)
        np.testing.assert_allclose(lse.get(), full[1], rtol=1e-5, atol=1e-5)
        want, unit = full[:1] + full[2:], UNIT["bfloat16"]
    for name, got, ref in zip(("O", "dQ", "dK", "dV"), (o, *grads), want):
        assert_close(name, got.get(), ref, None, unit)


@pytest.mark.cuda
@pytest.mark.parametrize("b,hq,hkv,lq,lk,d,causal,masked,drop_p", [(2, 4, 4, 300, 300, 64, False, False, 0.0),
                                                                  (2, 8, 2, 257, 300, 128, True, False, 0.0),
                                                                  (2, 4, 1, 200, 130, 64, True, False, 0.2),
                                                                  (2, 4, 4, 150, 190, 128, False, True, 0.0),
                                                                  (1, 8, 1, 1000, 1000, 128, True, False, 0.0)])
@pytest.mark.parametrize("setting", FUSED_SETTINGS, ids=FUSED_IDS)
def test_gpu_fused_backward_matches_float64(b, hq, hkv, lq, lk, d, causal, masked, drop_p, setting, monkeypatch):
    cp = pytest.importorskip("cupy")
    if cp.cuda.Device().compute_capability != "90":
        pytest.skip("the fused backward needs a Hopper GPU")
    monkeypatch.setitem(fa.FUSED_BACKWARD_TILES, d, dict(setting, WGS=2))
    rng = np.random.default_rng(5)
    q, k, v, do = inputs(rng, b, hq, hkv, lq, lk, d, "bfloat16")
    mask = None
    if masked:
        mask = rng.random((b, lk)) > 0.3
        mask[1, :] = False
    state = np.array([3, 1, 4, 0], np.uint32)
    p = fa.Problem(b, hq, hq // hkv, lq, lk, d, causal, 1 / np.sqrt(d), masked, drop_p)
    arrays = [cp.asarray(a) for a in (q, k, v, do)]
    kmask = None if mask is None else cp.asarray(mask)
    o, lse = fa.forward_arrays(cp, *arrays[:3], p, kmask, rng=cp.asarray(state), variant="bulk")
    grads = fa.backward_arrays(cp, *arrays[:3], o, lse, arrays[3], p, kmask, rng=cp.asarray(state), variant="fused")
    if drop_p:
        keep = fa.dropout_keep_numpy(state, b * hq, lq, lk, drop_p).reshape(b, hq, lq, lk).astype(np.float64)
        want, unit = reference_with_dropout(q, k, v, do, causal, hq // hkv, keep)[1:], 2 * UNIT["bfloat16"]
    else:
        want, unit = reference(q, k, v, do, causal, hq // hkv, mask)[2:], UNIT["bfloat16"]
    for name, got, ref in zip(("dQ", "dK", "dV"), grads, want):
        assert_close(name, got.get(), ref, None, unit)
    if masked:
        assert (grads[0][1] == 0).all().get() and (grads[1][1] == 0).all().get()


@pytest.mark.cuda
@pytest.mark.parametrize("d, causal", [(64, True), (128, False)])
@pytest.mark.parametrize("tiles", [dict(PINGPONG=1), dict(BC=128), dict(STAGES=3), dict(RS=1), dict(RS=1, PINGPONG=1),
                                   dict(BC=128, RS=1), dict(BC=128, RS=1, PINGPONG=1), dict(BC=176, RS=1),
                                   dict(WGS=3, BC=64, RS=1)])
def test_gpu_bulk_forward_settings_match_float64(d, causal, tiles):
    """The bulk forward's other settings (warpgroups taking turns, 128-key tiles, three stages, P in registers) on
    the GPU."""
    cp = pytest.importorskip("cupy")
    if cp.cuda.Device().compute_capability != "90":
        pytest.skip("the bulk forward needs a Hopper GPU")
    rng = np.random.default_rng(6)
    q, k, v, do = inputs(rng, 2, 4, 2, 333, 390, d, "bfloat16")
    p = fa.Problem(2, 4, 2, 333, 390, d, causal, 1 / np.sqrt(d), False)
    o, lse = fa.forward_arrays(cp, *(cp.asarray(a) for a in (q, k, v)), p, tiles=tiles, variant="bulk")
    full = reference(q, k, v, do, causal, 2, None)
    np.testing.assert_allclose(lse.get(), full[1], rtol=1e-5, atol=1e-5)
    assert_close("O", o.get(), full[0], None, UNIT["bfloat16"])


@pytest.mark.cuda
@pytest.mark.parametrize("d, causal, masked", [(64, True, False), (128, False, True), (128, True, False)])
@pytest.mark.parametrize("tiles", [dict(WGS=2, BC=128, RS=1, PINGPONG=1, PERSIST=1),
                                   dict(WGS=2, BC=176, RS=1, PINGPONG=1, PERSIST=1),
                                   dict(WGS=3, BC=64, RS=1, PERSIST=1)])
def test_gpu_persistent_bulk_forward_matches_float64(d, causal, masked, tiles):
    """The persistent bulk forward with more query tiles than SMs (6 x 16 x 4 = 384 at 128 queries a tile): each block
    takes several, its rings and its queries running on from one to the next."""
    cp = pytest.importorskip("cupy")
    if cp.cuda.Device().compute_capability != "90":
        pytest.skip("the bulk forward needs a Hopper GPU")
    rng = np.random.default_rng(7)
    q, k, v, do = inputs(rng, 4, 16, 4, 700, 900, d, "bfloat16")
    mask = None
    if masked:
        mask = rng.random((4, 900)) > 0.3
        mask[1, :] = False
    p = fa.Problem(4, 16, 4, 700, 900, d, causal, 1 / np.sqrt(d), masked)
    kmask = None if mask is None else cp.asarray(mask)
    o, lse = fa.forward_arrays(cp, *(cp.asarray(a) for a in (q, k, v)), p, kmask, tiles=tiles, variant="bulk")
    assert fa._multiprocessors(cp) < 6 * 16 * 4
    full = reference(q, k, v, do, causal, 4, mask)
    np.testing.assert_allclose(lse.get(), full[1], rtol=1e-5, atol=1e-5)
    assert_close("O", o.get(), full[0], None, UNIT["bfloat16"])


# ------------------------------------------------------------------ on the GPU: the real kernels behind SDPA
GPU_CASES = [
    (2, 4, 4, 300, 300, 64, False, "bfloat16", False),
    (2, 4, 4, 257, 300, 64, True, "bfloat16", False),
    (2, 8, 2, 200, 130, 128, True, "float16", False),
    (2, 8, 1, 129, 129, 128, False, "bfloat16", True),
]


@pytest.mark.cuda
@pytest.mark.parametrize("b,hq,hkv,lq,lk,d,causal,dtype,masked", GPU_CASES)
@pytest.mark.parametrize("forward", ["mma", "wgmma", "bulk"])
def test_gpu_kernels_behind_sdpa_match_composed_path(b, hq, hkv, lq, lk, d, causal, dtype, masked, forward,
                                                     monkeypatch):
    """The flash kernels behind SDPA against the composed path; for bf16 on sm_90 each forward: FROST_FLASH_BULK=0
    (mma), FROST_FLASH_WGMMA=1, and the default (bulk)."""
    monkeypatch.setenv("FROST_FLASH_WGMMA", "1" if forward == "wgmma" else "0")
    monkeypatch.delenv("FROST_FLASH_BULK", raising=False)
    if forward == "mma":
        monkeypatch.setenv("FROST_FLASH_BULK", "0")
    monkeypatch.setenv("FROST_CUDNN_ATTENTION", "0")   # cuDNN's graphs come first where they apply
    hopper_calls = []
    if forward != "mma":
        cp = pytest.importorskip("cupy")
        if dtype != "bfloat16" or cp.cuda.Device().compute_capability != "90":
            pytest.skip("the Hopper kernels take bf16 on a Hopper GPU")
        real_forward = getattr(fa, "forward_" + forward)
        monkeypatch.setattr(fa, "forward_" + forward,
                            lambda *a, **kw: hopper_calls.append(1) or real_forward(*a, **kw))
    rng = np.random.default_rng(0)
    arrays = inputs(rng, b, hq, hkv, lq, lk, d, dtype)
    mask = rng.random((b, lk)) > 0.3 if masked else None
    if masked:
        mask[0] = False   # a fully masked batch entry
    calls = []
    real = fa.flash_attention
    monkeypatch.setattr(fa, "flash_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    results = []
    for switch in ("1", "0"):
        monkeypatch.setenv("FROST_FLASH_ATTENTION", switch)
        q, k, v, do = (frost.Tensor(a).to("cuda") for a in arrays)
        for t in (q, k, v):
            t.requires_grad = True
        attn_mask = None if mask is None else frost.Tensor(mask[:, None, None, :]).to("cuda")
        out = sdpa(q, k, v, attn_mask=attn_mask, is_causal=causal, enable_gqa=hq != hkv)
        out.backward(do)
        results.append([t.detach().cpu().numpy().astype(np.float64) for t in (out, q.grad, k.grad, v.grad)])
    assert calls == [1] and hopper_calls == ([] if forward == "mma" else [1])
    want = reference(*arrays, causal, hq // hkv, mask)
    for name, got, comp, ref in zip(("O", "dQ", "dK", "dV"), results[0], results[1], want[:1] + want[2:]):
        assert_close(name, got, ref, comp, UNIT[dtype])


# ------------------------------------------------------------------ the registration with frost.dispatch
def test_the_layer_registers_flash_attention_for_sdpa_on_cuda_after_cudnns_graphs():
    cudnn_path, path = dispatch.registered("scaled_dot_product_attention")
    assert (path.fn, path.device, path.applies) == (fa.scaled_dot_product_attention_flash, "cuda", fa.supported)
    assert path.dtypes == set(fa.DTYPES)
    assert cudnn_path.fn is cudnn_attention.scaled_dot_product_attention_cudnn and cudnn_path.priority > path.priority


@pytest.fixture
def table(monkeypatch):
    """An empty dispatch table for the test (the real one comes back afterwards)."""
    monkeypatch.setattr(dispatch, "_table", {})


def test_sdpa_asks_the_table_with_its_arguments_and_returns_the_fast_paths_answer(table):
    asked, called = [], []
    answer = frost.zeros(1)

    @dispatch.register("scaled_dot_product_attention", device="cpu",
                       applies=lambda *operands, **params: asked.append((operands, params)) or True)
    def fake(*args):
        called.append(args)
        return answer
    q, k, v = _tensors((1, 2, 8, 64), (1, 1, 8, 64), (1, 1, 8, 64))
    assert sdpa(q, k, v, dropout_p=0.25, is_causal=True, scale=0.5, enable_gqa=True) is answer
    assert asked == [((q, k, v), dict(attn_mask=None, dropout_p=0.25, is_causal=True, scale=0.5, enable_gqa=True))]
    assert called == [(q, k, v, None, 0.25, True, 0.5, True)]


@pytest.mark.parametrize("causal, masked", [(True, False), (False, True)])
def test_the_registered_path_behind_sdpa_matches_float64_and_composed(table, causal, masked):
    """The registered function, taken for CPU tensors where the kernels' rules apply, runs the simulated kernels
    (default tiles) behind scaled_dot_product_attention: the same values and gradients as without it."""
    rng = np.random.default_rng(2)
    q, k, v, do = inputs(rng, 1, 2, 1, 12, 9, 64, "bfloat16")
    mask = np.ones((1, 9), bool)
    mask[0, 4:] = not masked
    composed = _composed(q, k, v, do, causal, 2, mask if masked else None)
    dispatch.register("scaled_dot_product_attention", device="cpu", applies=fa.applies)(
        fa.scaled_dot_product_attention_flash)
    tq, tk, tv = (frost.Tensor(a, requires_grad=True) for a in (q, k, v))
    attn_mask = frost.Tensor(mask[:, None, None, :]) if masked else None
    out = sdpa(tq, tk, tv, attn_mask=attn_mask, is_causal=causal, enable_gqa=True)
    assert out.grad_fn.name == "flash_attention"
    out.backward(frost.Tensor(do))
    want = reference(q, k, v, do, causal, 2, mask if masked else None)
    for name, got, ref, comp in zip(("O", "dQ", "dK", "dV"), (out, tq.grad, tk.grad, tv.grad), want[:1] + want[2:],
                                    composed):
        assert_close(name, got.detach().numpy(), ref, comp, UNIT["bfloat16"])


def test_tile_stats_match_numpy():
    """flash_bwd_tile_stats, the fused backward's statistics, against NumPy: for each 64-query tile of each
    (batch, head), the log-sum-exps in log2 units (+inf for a row that saw no key: its -inf would make exp2 NaN) and
    then rowsum(dO * O), zeros for the queries past the end."""
    rng = np.random.default_rng(7)
    bh, lq, d, tiles = 6, 70, 64, 2   # batch x heads rows of 70 queries: the second tile has 6
    o, do = (rng.standard_normal((bh * lq, d)).astype(ml_dtypes.bfloat16) for _ in range(2))
    lse = rng.standard_normal(bh * lq).astype(np.float32)
    lse[5] = -np.inf
    got = np.full(bh * tiles * 128, np.nan, np.float32)
    flash_fused_backward.fused_backward()[2].simulate[(tiles, 3, 2), 256](o, do, lse, got, lq, D=d)
    log2 = np.where(lse == -np.inf, np.inf, lse.astype(np.float64) * fa.LOG2E)
    delta = (o.astype(np.float64) * do.astype(np.float64)).sum(axis=1)
    want = np.zeros((bh, 2, tiles * 64))
    want[:, 0, :lq], want[:, 1, :lq] = log2.reshape(bh, lq), delta.reshape(bh, lq)
    want = want.reshape(bh, 2, tiles, 64).transpose(0, 2, 1, 3)   # per tile: 64 log-sum-exps, then 64 deltas
    np.testing.assert_allclose(got.reshape(bh, tiles, 2, 64), want, rtol=1e-6, atol=1e-5)


def test_fused_backward_refuses_what_it_does_not_take(monkeypatch):
    rng = np.random.default_rng(3)
    q, k, v, do = inputs(rng, 1, 1, 1, 16, 16, 64, "float16")
    p = fa.Problem(1, 1, 1, 16, 16, 64, False, 0.125, False)
    o, lse = fa.forward_arrays(np, q, k, v, p, None, TINY)
    with pytest.raises(ValueError, match=r"flash_attention: the fused backward takes bfloat16, got float16"):
        fa.backward_arrays(np, q, k, v, o, lse, do, p, variant="fused")
    q, k, v, do = (a.astype(ml_dtypes.bfloat16) for a in (q, k, v, do))
    monkeypatch.setitem(fa.FUSED_BACKWARD_TILES, 64, dict(RS=1, WGS=3))
    with pytest.raises(ValueError, match=r"takes 1 or 2 warpgroups within 232448 bytes of shared memory, got WGS=3"):
        fa.backward_arrays(np, q, k, v, o, lse, do, p, variant="fused")


def test_bulk_forward_tiles_by_length():
    """Head dim 128: two warpgroups taking turns over 128-key tiles, persistent below PERSIST_BELOW queries; head dim
    64: persistent three warpgroups over 128-key tiles, the turns when causal; two warpgroups over 64-key tiles with
    dropout at any length, never persistent; a new dict each time."""
    short = fa.PERSIST_BELOW - 1
    turns = dict(WGS=2, BC=128, STAGES=2, PINGPONG=1, RS=1)
    for causal in (False, True):
        assert fa.bulk_tiles(128, False, causal) == dict(turns, PERSIST=0)
        assert fa.bulk_tiles(128, False, causal, short) == dict(turns, PERSIST=1)
        assert fa.bulk_tiles(128, False, causal, fa.PERSIST_BELOW) == dict(turns, PERSIST=0)
        for d in fa.HEAD_DIMS:
            for lq in (None, short):
                assert fa.bulk_tiles(d, True, causal, lq) == dict(WGS=2, BC=64, STAGES=2, PINGPONG=0, RS=1, PERSIST=0)
    for lq in (None, short):
        assert fa.bulk_tiles(64, False, False, lq) == dict(WGS=3, BC=128, STAGES=2, PINGPONG=0, RS=1, PERSIST=1)
        assert fa.bulk_tiles(64, False, True, lq) == dict(turns, PERSIST=1)
    fa.bulk_tiles(128, False, False, short)["WGS"] = 1   # a copy: the tables themselves are not changed
    assert fa.BULK_TILES[128]["WGS"] == 2 and fa.BULK_TILES[128]["PERSIST"] == 0


@pytest.mark.parametrize("tiles, length", [(None, 300), (None, 5000), (dict(STAGES=3), 300)])
def test_the_bulk_forward_asks_for_its_tiles_by_length_only_when_none_are_given(monkeypatch, tiles, length):
    """forward_bulk takes the short sequences' default below PERSIST_BELOW queries; a partial setting fills its gaps
    from the long-sequence defaults at any length (so its names mean what they say)."""
    asked = []

    def spy(d, dropout, causal=False, lq=None):
        asked.append(lq)
        raise RuntimeError("stop")
    monkeypatch.setattr(fa, "bulk_tiles", spy)
    q = np.zeros((1, 1, length, 64), ml_dtypes.bfloat16)
    p = fa.Problem(1, 1, 1, length, 64, 64, False, 0.125, False)
    with pytest.raises(RuntimeError, match="stop"):
        fa.forward_arrays(np, q, q[:, :, :64], q[:, :, :64], p, tiles=tiles, variant="bulk")
    assert asked == [length if tiles is None else None]


def test_the_attention_backwards_hand_leaves_their_gradients_without_a_copy():
    """The flash and cuDNN attention backwards say fresh_gradients (the autograd then keeps their arrays as .grad)."""
    rng = np.random.default_rng(3)
    q, k, v = (frost.Tensor(rng.standard_normal((1, 1, 16, 64)).astype(ml_dtypes.bfloat16), requires_grad=True)
               for _ in range(3))
    out = fa.flash_attention(q, k, v, tiles=TINY)
    assert out._ctx.backward.fresh_gradients is True
    assert "backward.fresh_gradients = True" in inspect.getsource(cudnn_attention.cudnn_attention)


def test_fused_backward_is_the_default_where_it_was_measured_faster(monkeypatch):
    """After the bulk forward: the fused backward from 1024 queries at head dim 128 and 512 at 64, the two kernels
    for shorter ones; frost.backends.deterministic and FROST_FLASH_FUSED_BACKWARD decide over that, an explicit
    variant over everything."""
    monkeypatch.delenv("FROST_FLASH_FUSED_BACKWARD", raising=False)
    q = np.zeros((1, 1, 4, 64))

    def chosen(d, lq, variant="bulk"):
        return fa.backward_variant(np, q, fa.Problem(1, 1, 1, lq, lq, d, False, 0.1, False), variant)
    assert chosen(128, 4096) == "fused" and chosen(128, 1024) == "fused" and chosen(64, 512) == "fused"
    assert chosen(128, 1023) == "wgmma" and chosen(64, 511) == "wgmma"
    assert chosen(128, 4096, "wgmma") == "wgmma" and chosen(64, 64, "fused") == "fused"
    assert chosen(128, 4096, None) == "mma"   # the simulator runs the Hopper kernels only by name
    monkeypatch.setattr(frost.backends, "deterministic", True)
    assert chosen(128, 4096) == "wgmma"
    monkeypatch.setenv("FROST_FLASH_FUSED_BACKWARD", "1")
    assert chosen(64, 512) == "fused"
    monkeypatch.setenv("FROST_FLASH_FUSED_BACKWARD", "0")
    monkeypatch.setattr(frost.backends, "deterministic", False)
    assert chosen(128, 4096) == "wgmma"


@pytest.mark.parametrize("d", fa.HEAD_DIMS)
def test_fused_backward_compiles_for_sm90a_and_its_default_does_not_spill(d, tmp_path, monkeypatch):
    """The default setting (RS=1, OVERLAP_EXP=1) compiles without spills at both head dims, causal or not, with mask
    and dropout or not (at 128: 243 to 255 registers beside dK's and dV's 128; every thread's cp.async of Q and dO had
    pushed it to 36-140 bytes of spills)."""
    pytest.importorskip("cuda.bindings")
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    setting = fa.FUSED_BACKWARD_TILES[d]
    fused, convert, tile_stats = flash_fused_backward.fused_backward()
    wgs = setting["WGS"]
    flags = {name: setting.get(name, 0) for name in ("RS", "OVERLAP_EXP")}
    for causal, masked, dropout in ((0, 0, 0), (1, 0, 0), (1, 1, 1)):
        info = fused.inspect("sm_90", D=d, WGS=wgs, CAUSAL=causal, MASKED=masked, DROPOUT=dropout, **flags)
        assert info["spill_stores"] == 0, (causal, masked, dropout, info["registers"], info["spill_stores"])
        assert "cp.async.bulk.tensor.3d" in info["ptx"]
        assert "C7515" not in info["log"] and "cp.reduce.async.bulk" in info["ptx"]
    assert convert.inspect("sm_90", D=d, WGS=wgs)["spill_stores"] == 0
    assert tile_stats.inspect("sm_90", D=d)["spill_stores"] == 0


@pytest.mark.cuda
def test_gpu_the_stubs_for_no_mask_and_no_dropout_are_made_once_a_device():
    cp = pytest.importorskip("cupy")
    p = fa.Problem(1, 1, 1, 64, 64, 64, False, 0.125, False)
    mask, state = fa._kmask(cp, None), fa._rng(cp, p, None)
    assert fa._kmask(cp, None) is mask and fa._rng(cp, p, None) is state
    assert cp.asnumpy(state).tolist() == [0, 0, 0, 0] and mask.dtype == np.uint8
    assert fa._kmask(np, None) is not fa._kmask(np, None)   # the simulator's are its own each call
