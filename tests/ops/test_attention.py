"""Tests for frost/ops/attention.py: scaled dot-product attention against PyTorch (float64), values and gradients."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import frost
from frost.ops.attention import safe_softmax, scaled_dot_product_attention as sdpa


def _pair(a, grad=True):
    return frost.Tensor(np.array(a, copy=True), requires_grad=grad), torch.tensor(a, requires_grad=grad)


def _close(frost_t, torch_t, tol=1e-10):
    np.testing.assert_allclose(frost_t.detach().numpy(), torch_t.detach().numpy(), rtol=tol, atol=tol)


def _qkv(rng, q_shape, k_shape, v_shape):
    return [_pair(rng.standard_normal(s)) for s in (q_shape, k_shape, v_shape)]


def _check_against_torch(rng, q_shape, k_shape, v_shape, mask=None, **kwargs):
    (qf, qt), (kf, kt), (vf, vt) = _qkv(rng, q_shape, k_shape, v_shape)
    mask_f = None if mask is None else frost.Tensor(mask)
    mask_t = None if mask is None else torch.tensor(mask)
    out_f = sdpa(qf, kf, vf, attn_mask=mask_f, **kwargs)
    out_t = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask_t, **kwargs)
    assert out_f.shape == tuple(out_t.shape)
    _close(out_f, out_t)
    g = rng.standard_normal(out_t.shape)
    out_f.backward(frost.Tensor(g))
    out_t.backward(torch.tensor(g))
    for f, t in ((qf, qt), (kf, kt), (vf, vt)):
        _close(f.grad, t.grad)


@pytest.mark.parametrize("q_shape,k_shape,v_shape", [
    ((5, 8), (7, 8), (7, 6)),
    ((2, 5, 8), (2, 7, 8), (2, 7, 6)),
    ((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4)),
    ((2, 3, 5, 8), (1, 3, 7, 8), (1, 3, 7, 8)),  # broadcast batch
])
@pytest.mark.parametrize("is_causal", [False, True])
def test_sdpa_plain_and_causal(q_shape, k_shape, v_shape, is_causal):
    _check_against_torch(np.random.default_rng(len(q_shape) + is_causal), q_shape, k_shape, v_shape,
                         is_causal=is_causal)


def test_sdpa_causal_square_and_tall():
    rng = np.random.default_rng(0)
    _check_against_torch(rng, (2, 2, 6, 4), (2, 2, 6, 4), (2, 2, 6, 4), is_causal=True)
    _check_against_torch(rng, (2, 9, 4), (2, 3, 4), (2, 3, 5), is_causal=True)  # L > S


def test_sdpa_custom_scale():
    _check_against_torch(np.random.default_rng(1), (2, 4, 8), (2, 6, 8), (2, 6, 3), scale=0.7)


@pytest.mark.parametrize("mask_shape", [(5, 7), (2, 1, 5, 7), (2, 3, 5, 7), (1, 7)])
def test_sdpa_boolean_mask(mask_shape):
    rng = np.random.default_rng(2)
    mask = rng.uniform(size=mask_shape) > 0.4
    _check_against_torch(rng, (2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 6), mask=mask)


def test_sdpa_additive_float_mask():
    rng = np.random.default_rng(3)
    mask = rng.standard_normal((5, 7))
    mask[0, :3] = -np.inf
    _check_against_torch(rng, (2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 6), mask=mask)


def test_sdpa_fully_masked_rows_give_zero_not_nan():
    rng = np.random.default_rng(4)
    mask = rng.uniform(size=(5, 7)) > 0.3
    mask[1] = False
    _check_against_torch(rng, (2, 5, 4), (2, 7, 4), (2, 7, 3), mask=mask)
    float_mask = np.zeros((5, 7))
    float_mask[2] = -np.inf
    _check_against_torch(rng, (2, 5, 4), (2, 7, 4), (2, 7, 3), mask=float_mask)


def test_sdpa_float_mask_keeps_query_dtype():
    q = frost.randn(2, 3, 4)
    mask = frost.tensor(np.zeros((3, 3)))  # float64
    mask[0, 1] = float("-inf")
    out = sdpa(q, q, q, attn_mask=mask)
    assert out.dtype == frost.float32
    ref = F.scaled_dot_product_attention(*(torch.tensor(q.numpy()),) * 3, attn_mask=torch.tensor(mask.numpy()).float())
    np.testing.assert_allclose(out.numpy(), ref.numpy(), atol=1e-6)


def test_sdpa_grouped_query_attention():
    rng = np.random.default_rng(5)
    _check_against_torch(rng, (2, 6, 5, 4), (2, 2, 7, 4), (2, 2, 7, 3), enable_gqa=True)


def test_sdpa_float32_close_to_float64():
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((2, 4, 16, 8)) for _ in range(3))
    out32 = sdpa(*(frost.tensor(a, dtype="float32") for a in (q, k, v)), is_causal=True)
    out64 = F.scaled_dot_product_attention(*(torch.tensor(a) for a in (q, k, v)), is_causal=True)
    assert out32.dtype == frost.float32
    np.testing.assert_allclose(out32.numpy(), out64.numpy(), atol=1e-5)


def test_sdpa_dropout_uses_frost_generator_and_scales_weights():
    rng = np.random.default_rng(7)
    q, k, v = rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 6, 4)), rng.standard_normal((2, 6, 3))
    p = 0.4
    frost.manual_seed(123)
    out = sdpa(frost.Tensor(q), frost.Tensor(k), frost.Tensor(v), dropout_p=p)
    frost.manual_seed(123)
    keep = frost.backend.cpu.generator().random((2, 5, 6), dtype=np.float32) >= p
    weights = torch.softmax(torch.tensor(q) @ torch.tensor(k).transpose(-2, -1) / math.sqrt(4), -1).numpy()
    expected = (weights * keep / (1 - p)) @ v
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-12)
    frost.manual_seed(123)
    again = sdpa(frost.Tensor(q), frost.Tensor(k), frost.Tensor(v), dropout_p=p)
    np.testing.assert_array_equal(out.numpy(), again.numpy())


def test_safe_softmax_matches_softmax_on_finite_rows():
    rng = np.random.default_rng(8)
    xf, xt = _pair(rng.standard_normal((3, 4, 5)))
    out_f, out_t = safe_softmax(xf, 1), torch.softmax(xt, 1)
    _close(out_f, out_t)
    g = rng.standard_normal((3, 4, 5))
    out_f.backward(frost.Tensor(g))
    out_t.backward(torch.tensor(g))
    _close(xf.grad, xt.grad)


def test_sdpa_errors():
    q, k, v = frost.randn(2, 5, 8), frost.randn(2, 7, 8), frost.randn(2, 7, 6)
    with pytest.raises(RuntimeError, match=r"scaled_dot_product_attention: an explicit attn_mask must not be given "
                                           r"when is_causal=True"):
        sdpa(q, k, v, attn_mask=frost.ones(5, 7, dtype="bool"), is_causal=True)
    with pytest.raises(RuntimeError, match=r"scaled_dot_product_attention: query of shape \(2, 5, 8\) and key of "
                                           r"shape \(2, 7, 4\) must have the same embedding size"):
        sdpa(q, frost.randn(2, 7, 4), v)
    with pytest.raises(RuntimeError, match=r"scaled_dot_product_attention: key of shape \(2, 7, 8\) and value of "
                                           r"shape \(2, 6, 6\) must have the same sequence length"):
        sdpa(q, k, frost.randn(2, 6, 6))
    with pytest.raises(RuntimeError, match=r"enable_gqa the query heads"):
        sdpa(frost.randn(1, 5, 3, 4), frost.randn(1, 2, 3, 4), frost.randn(1, 2, 3, 4), enable_gqa=True)



@pytest.mark.parametrize("mask_dtype", ["int64", "int32", "uint8"])
def test_sdpa_refuses_integer_mask_like_torch(mask_dtype):
    # an integer 0/1 mask used to be ADDED to the scores; PyTorch refuses it
    q, k, v = frost.randn(1, 2, 4), frost.randn(1, 3, 4), frost.randn(1, 3, 4)
    keep = np.array([[1, 0, 1], [1, 1, 0]], dtype=mask_dtype)
    with pytest.raises(RuntimeError, match="attn_mask"):
        F.scaled_dot_product_attention(*(torch.tensor(t.numpy()) for t in (q, k, v)), attn_mask=torch.tensor(keep))
    with pytest.raises(RuntimeError, match=rf"scaled_dot_product_attention: attn_mask must be bool .* or floating "
                                           rf"point .*got attn_mask of dtype frost\.{mask_dtype} and shape \(2, 3\)"):
        sdpa(q, k, v, attn_mask=frost.tensor(keep))


@pytest.mark.parametrize("kwargs", [dict(), dict(is_causal=True), dict(mask=np.zeros((3, 0)))])
@pytest.mark.parametrize("k_shape,v_shape", [((2, 0, 4), (2, 0, 5)), ((2, 0, 4), (2, 0, 4))])
def test_sdpa_zero_keys_gives_zeros_like_torch(k_shape, v_shape, kwargs):
    # softmax over zero keys used to fail in max(); PyTorch answers zeros, and zero / empty gradients
    kwargs = dict(kwargs)
    _check_against_torch(np.random.default_rng(3), (2, 3, 4), k_shape, v_shape, mask=kwargs.pop("mask", None),
                         **kwargs)


@pytest.mark.cuda
@pytest.mark.parametrize("kwargs", [dict(), dict(is_causal=True), dict(mask="bool"), dict(mask="float")])
def test_sdpa_cuda_matches_cpu(kwargs):
    rng = np.random.default_rng(11)
    q, k, v = (rng.standard_normal((2, 3, 6, 8)).astype(np.float32) for _ in range(3))
    kwargs = dict(kwargs)
    mask_kind = kwargs.pop("mask", None)
    mask = (rng.uniform(size=(6, 6)) > 0.3) if mask_kind == "bool" else rng.standard_normal((6, 6)).astype(
        np.float32) if mask_kind == "float" else None
    results = []
    for device in ("cpu", "cuda"):
        fq, fk, fv = (frost.tensor(a, device=device, requires_grad=True) for a in (q, k, v))
        fm = None if mask is None else frost.tensor(mask, device=device)
        out = sdpa(fq, fk, fv, attn_mask=fm, **kwargs)
        (out * out).sum().backward()
        results.append([t.detach().cpu().numpy() for t in (out, fq.grad, fk.grad, fv.grad)])
    for cpu_r, gpu_r in zip(*results):
        np.testing.assert_allclose(gpu_r, cpu_r, rtol=2e-3, atol=2e-3)  # TF32 matmuls on the GPU
