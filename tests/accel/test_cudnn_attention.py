"""Attention through cuDNN's SDPA graphs (frost/accel/cudnn_attention.py): on the CPU, the rules of `supported` and
the layout and generator plumbing; on a GPU, O and dQ, dK, dV behind scaled_dot_product_attention against PyTorch's
float64 attention and Frost's composed path (causal top-left with Lq != Lk, ragged lengths, grouped-query heads,
f16), heads read where they lie in one projection with their gradients in one block, and dropout against float64
with cuDNN's own mask (recovered by attending to an identity matrix)."""
from types import SimpleNamespace

import numpy as np
import pytest

import frost
from frost.accel import cudnn_attention as ca
from frost.accel import flash_attention as fa
from frost.backend import cudnn
from frost.ops.attention import scaled_dot_product_attention as sdpa

from attention_reference import UNIT, assert_close, inputs, reference, reference_with_dropout


def _tensors(*shapes, dtype="bfloat16"):
    return [frost.zeros(*shape, dtype=dtype) for shape in shapes]


def test_supported_is_false_on_the_cpu_with_a_mask_and_when_switched_off(monkeypatch):
    q, k, v = _tensors((1, 2, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64))
    assert fa.applies(q, k, v) and not ca.supported(q, k, v)   # CPU tensors take the composed path
    mask = frost.ones(1, 1, 1, 8, dtype="bool")
    monkeypatch.setattr(ca, "has_mma", lambda a: True)
    monkeypatch.setattr(cudnn, "available", lambda: True)
    builds = {"answer": True}
    monkeypatch.setattr(ca, "_cudnn_builds", lambda tensors, p: builds["answer"])
    monkeypatch.setattr(frost.Tensor, "device", property(lambda t: SimpleNamespace(type="cuda")))
    assert ca.supported(q, k, v) and ca.supported(q, k, v, dropout_p=0.5, is_causal=True)
    assert not ca.supported(q, k, v, attn_mask=mask)           # masks stay the flash kernels'
    assert not ca.supported(q, k, v, dropout_p=1.0)            # nothing kept: the flash kernels write zeros
    assert not ca.supported(*_tensors((1, 2, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64), dtype="float32"))
    assert not ca.supported(*_tensors((1, 2, 8, 96), (1, 2, 8, 96), (1, 2, 8, 96)))   # head dim 96
    assert not ca.supported(*_tensors((1, 4, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64)))   # GQA without enable_gqa
    assert ca.supported(*_tensors((1, 4, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64)), enable_gqa=True)
    monkeypatch.setattr(cudnn, "available", lambda: False)
    assert not ca.supported(q, k, v)
    monkeypatch.setattr(cudnn, "available", lambda: True)
    builds["answer"] = False                                   # cuDNN cannot build the graphs: the flash kernels'
    assert not ca.supported(q, k, v)
    builds["answer"] = True
    monkeypatch.setenv("FROST_CUDNN_ATTENTION", "0")
    assert not ca.supported(q, k, v)


def test_cudnn_is_asked_once_per_signature_with_the_layouts_the_call_will_have(monkeypatch):
    asked = []
    monkeypatch.setattr(ca, "_checked", {})
    monkeypatch.setattr(cudnn, "attention_supported", lambda *arrays_and_params: asked.append(arrays_and_params)
                        or True)
    b, t, h, d = 2, 10, 4, 64
    x = frost.zeros(b, t, 3 * h * d, dtype="bfloat16")
    q, k, v = (part.view(b, t, h, d).transpose(1, 2) for part in x.split(h * d, dim=2))
    p = fa.problem(q, k, v, True, None, False, False, 0.1)
    assert ca._cudnn_builds((q, k, v), p) and ca._cudnn_builds((q, k, v), p)
    (call,) = asked
    arrays, params = call[:9], call[9:]
    assert [a.strides for a in arrays[:3]] == [t.data.strides for t in (q, k, v)]     # read where they lie
    o, lse, do, dq, dk, dv = arrays[3:]
    assert do is o and o.transpose(0, 2, 1, 3).flags.c_contiguous and lse.shape == (b, h, t, 1)
    assert dq.strides == q.data.strides and dk.ctypes.data - dq.ctypes.data == h * d * 2   # one block, as x's
    assert params == (1 / 8, True, 0.1)
    ca._cudnn_builds(tuple(frost.zeros(b, h, t, d, dtype="bfloat16") for _ in range(3)), p)
    assert len(asked) == 2                                      # another layout: asked again


def test_a_graph_cudnn_cannot_build_is_refused_once_and_remembered(monkeypatch):
    for table in ("_refused", "_untuned", "_graphs"):
        monkeypatch.setattr(cudnn, table, {})
    built = []

    def refuse(*args):
        built.append("backward")
        raise RuntimeError("no engine")
    monkeypatch.setattr(cudnn, "_ATTENTION_GRAPHS", {"attention": lambda *args: built.append("forward"),
                                                     "attention_backward": refuse})
    arrays = [np.zeros((1, 2, 8, 64), np.float16) for _ in range(3)]
    o, lse = np.zeros((1, 8, 2, 64), np.float16).transpose(0, 2, 1, 3), np.zeros((1, 2, 8, 1), np.float32)
    for _ in range(2):
        assert not cudnn.attention_supported(*arrays, o, lse, o, *arrays, 0.125, False)
    assert built == ["forward", "backward"]                     # built once; the refusal is remembered
    (why,) = cudnn.refusals().values()
    assert why == "RuntimeError: no engine"


def test_the_generator_snapshot_is_read_as_one_int64_seed_and_one_int64_offset():
    snapshot = np.array([0x89ABCDEF, 0x01234567, 0x00000005, 0x00000001], np.uint32)
    seed, offset = cudnn._rng_words(snapshot)
    assert (seed.tolist(), offset.tolist()) == ([0x0123456789ABCDEF], [(1 << 32) + 5])
    assert seed.base is not None and offset.base is not None      # views of the snapshot: its device memory
    assert cudnn._rng_words(None) == ()
    assert ca.STREAM != fa.STREAM


def test_rows_cudnn_reads_are_kept_where_they_lie_and_others_are_copied():
    proj = np.zeros((2, 10, 3, 4, 64), np.float16)                 # (B, T, q/k/v, H, D): one projection
    q = proj[:, :, 0].transpose(0, 2, 1, 3)
    assert ca._dense_rows(np, q) is q
    broadcast = np.broadcast_to(np.zeros((1, 4, 10, 64), np.float16), (2, 4, 10, 64))   # a stride of 0
    odd = np.zeros((2, 4, 10, 65), np.float16)[..., 1:]            # 2-byte aligned rows
    for a in (broadcast, odd, q[..., ::-1]):
        copied = ca._dense_rows(np, a)
        assert copied.flags.c_contiguous and np.array_equal(copied, a)


# ------------------------------------------------------------------ on the GPU
def _through_sdpa(arrays, causal, group, dropout_p=0.0, with_grad=True):
    q, k, v, do = (frost.Tensor(a).to("cuda") for a in arrays)
    for t in (q, k, v):
        t.requires_grad = with_grad
    out = sdpa(q, k, v, is_causal=causal, enable_gqa=group > 1, dropout_p=dropout_p)
    if with_grad:
        out.backward(do)
    grads = (q.grad, k.grad, v.grad) if with_grad else ()
    return out, [t.detach().cpu().numpy().astype(np.float64) for t in (out, *grads)]


GPU_CASES = [
    (2, 4, 4, 300, 300, 64, False, "bfloat16"),
    (2, 4, 4, 257, 300, 64, True, "bfloat16"),    # causal, Lq < Lk (top-left), ragged
    (2, 8, 2, 200, 130, 128, True, "float16"),    # causal, Lq > Lk, GQA 4
    (2, 8, 1, 129, 129, 128, False, "bfloat16"),  # GQA 8
    (1, 2, 2, 1024, 1024, 64, True, "bfloat16"),
]


@pytest.mark.cuda
@pytest.mark.parametrize("b,hq,hkv,lq,lk,d,causal,dtype", GPU_CASES)
def test_gpu_graphs_behind_sdpa_match_float64_and_composed(b, hq, hkv, lq, lk, d, causal, dtype, monkeypatch):
    arrays = inputs(np.random.default_rng(0), b, hq, hkv, lq, lk, d, dtype)
    out, got = _through_sdpa(arrays, causal, hq // hkv)
    assert out.grad_fn.name == "cudnn_attention"
    assert out.data.transpose(0, 2, 1, 3).flags.c_contiguous     # O written (B, L, H, D)
    monkeypatch.setenv("FROST_CUDNN_ATTENTION", "0")
    monkeypatch.setenv("FROST_FLASH_ATTENTION", "0")
    composed_out, composed = _through_sdpa(arrays, causal, hq // hkv)
    assert composed_out.grad_fn.name != "cudnn_attention"
    want = reference(*arrays, causal, hq // hkv, None)
    for name, g, comp, ref in zip(("O", "dQ", "dK", "dV"), got, composed, want[:1] + want[2:]):
        assert_close(name, g, ref, comp, UNIT[dtype])


@pytest.mark.cuda
def test_gpu_heads_of_one_projection_are_read_in_place_and_their_gradients_fill_one_block():
    b, t, h, d = 2, 160, 4, 64
    rng = np.random.default_rng(1)
    proj = rng.standard_normal((b, t, 3 * h * d)).astype(np.float32)
    x = frost.Tensor(proj).to("cuda").to(frost.bfloat16).detach()
    x.requires_grad = True
    q, k, v = (part.view(b, t, h, d).transpose(1, 2) for part in x.split(h * d, dim=2))
    out = sdpa(q, k, v, is_causal=True)
    do = rng.standard_normal((b, h, t, d)).astype(np.float32)
    out.backward(frost.Tensor(do).to("cuda").to(frost.bfloat16))
    assert out.grad_fn.name == "cudnn_attention" and x.grad.shape == (b, t, 3 * h * d)
    heads = x.detach().float().cpu().numpy().reshape(b, t, 3, h, d).transpose(2, 0, 3, 1, 4)
    dob = frost.Tensor(do).to(frost.bfloat16).float().numpy()
    want = reference(heads[0], heads[1], heads[2], dob, True, 1, None)
    grad = x.grad.float().cpu().numpy().reshape(b, t, 3, h, d).transpose(2, 0, 3, 1, 4)
    assert_close("O", out.detach().float().cpu().numpy(), want[0], None, UNIT["bfloat16"])
    for i, name in enumerate(("dQ", "dK", "dV")):
        assert_close(name, grad[i], want[2 + i], None, UNIT["bfloat16"])


def _dropped_weights(arrays, causal, p, seed):
    """cuDNN's dropped attention weights P * keep for these q and k under `seed`: the output of attending to V = I
    (Lk = D), whose mask is the one any V of that layout gets from the same generator state."""
    q, k, v, _ = arrays
    identity = np.broadcast_to(np.eye(k.shape[2], q.shape[3], dtype=v.dtype), v.shape).copy()
    frost.manual_seed(seed)
    _, (weights,) = _through_sdpa((q, k, identity, arrays[3]), causal, q.shape[1] // k.shape[1], p, with_grad=False)
    return weights


@pytest.mark.cuda
@pytest.mark.parametrize("causal, group", [(True, 1), (False, 2)])
def test_gpu_dropout_matches_float64_with_cudnns_own_mask(causal, group):
    p, lq, lk, d = 0.25, 48, 64, 64
    arrays = inputs(np.random.default_rng(2), 2, 4, 4 // group, lq, lk, d, "bfloat16")
    dropped = _dropped_weights(arrays, causal, p, seed=7)
    undropped = reference(*arrays[:3], np.zeros_like(arrays[3]), causal, group, None)
    weights = np.exp(_scores(arrays, causal, group) - undropped[1][..., None])   # float64 softmax from the lse
    visible = weights > 0
    ratio = np.where(visible, dropped / np.where(visible, weights, 1.0), 0.0)
    keep = np.where(ratio > 0.5 / (1 - p), 1 / (1 - p), 0.0)
    # every visible weight is either dropped (0) or kept and scaled by 1 / (1 - p), within bf16 rounding
    assert np.abs(np.where(visible, ratio - keep, 0.0)).max() < 0.05
    assert abs(keep[visible].astype(bool).mean() - (1 - p)) < 0.03                # ~9,000 draws: 5 sigma 0.023
    frost.manual_seed(7)
    _, got = _through_sdpa(arrays, causal, group, p)
    want = reference_with_dropout(*arrays, causal, group, keep)
    for name, g, ref in zip(("O", "dQ", "dK", "dV"), got, want):
        assert_close(name, g, ref, None, 2 * UNIT["bfloat16"])
    again = _dropped_weights(arrays, causal, p, seed=7)
    assert np.array_equal(again, dropped)                                          # manual_seed replays it
    frost.manual_seed(7)
    _through_sdpa(arrays, causal, group, p, with_grad=False)
    _, (following,) = _through_sdpa((arrays[0], arrays[1], np.broadcast_to(
        np.eye(lk, d, dtype=arrays[2].dtype), arrays[2].shape).copy(), arrays[3]), causal, group, p, with_grad=False)
    assert (following != dropped).mean() > 0.1                                     # the next call: a new mask


def _scores(arrays, causal, group):
    """float64 q k^T / sqrt(D), -inf where causal hides a key."""
    q, k = (a.astype(np.float64) for a in arrays[:2])
    s = q @ np.repeat(k, group, axis=1).transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    return np.where(np.tri(q.shape[2], k.shape[2], dtype=bool), s, -np.inf) if causal else s
