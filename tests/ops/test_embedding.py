"""Tests for frost/ops/embedding.py against PyTorch (float64): lookup, scatter-add gradient, padding_idx, errors."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import frost
from frost.ops.embedding import embedding


def _weights(rng, num, dim):
    w = rng.standard_normal((num, dim))
    return frost.Tensor(w.copy(), requires_grad=True), torch.tensor(w, requires_grad=True)


@pytest.mark.parametrize("index_shape", [(), (5,), (3, 4), (2, 3, 4)])
@pytest.mark.parametrize("padding_idx", [None, 2, -1])
def test_embedding_matches_torch(index_shape, padding_idx):
    rng = np.random.default_rng(len(index_shape))
    wf, wt = _weights(rng, 6, 3)
    idx = rng.integers(0, 6, size=index_shape)
    if idx.ndim:
        idx.reshape(-1)[:3] = [1, 1, 5 if padding_idx is None else padding_idx % 6]  # repeats and the padding row
    out_f = embedding(frost.Tensor(idx), wf, padding_idx=padding_idx)
    out_t = F.embedding(torch.tensor(idx), wt, padding_idx=padding_idx)
    assert out_f.shape == tuple(out_t.shape)
    np.testing.assert_array_equal(out_f.detach().numpy(), out_t.detach().numpy())
    g = rng.standard_normal(out_t.shape)
    out_f.backward(frost.Tensor(g))
    out_t.backward(torch.tensor(g))
    np.testing.assert_allclose(wf.grad.numpy(), wt.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_embedding_repeated_indices_accumulate():
    w = frost.zeros(4, 2, requires_grad=True)
    out = embedding(frost.tensor([3, 3, 3, 0]), w)
    out.sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [[1, 1], [0, 0], [0, 0], [3, 3]])


def test_embedding_padding_row_gets_zero_gradient_but_is_still_looked_up():
    w = frost.randn(4, 2, requires_grad=True)
    out = embedding(frost.tensor([[0, 1], [0, 2]]), w, padding_idx=0)
    np.testing.assert_array_equal(out.detach().numpy()[0, 0], w.detach().numpy()[0])
    out.sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [[0, 0], [1, 1], [1, 1], [0, 0]])


@pytest.mark.parametrize("index_dtype", ["int32", "int64", "uint8"])
@pytest.mark.parametrize("weight_dtype", ["float32", "float16", "bfloat16"])
def test_embedding_dtypes(index_dtype, weight_dtype):
    w = frost.randn(5, 3, dtype=weight_dtype, requires_grad=True)
    idx = frost.tensor([4, 0, 4], dtype=index_dtype)
    out = embedding(idx, w)
    assert out.dtype.name == weight_dtype
    np.testing.assert_array_equal(out.detach().numpy(), w.detach().numpy()[[4, 0, 4]])
    out.backward(frost.ones_like(out))
    assert w.grad.dtype.name == weight_dtype
    np.testing.assert_array_equal(w.grad.numpy().astype(np.float32)[:, 0], [1, 0, 0, 0, 2])


def test_embedding_errors():
    w = frost.randn(10, 3)
    with pytest.raises(IndexError, match=r"embedding: index 10 is out of range for num_embeddings 10 .*"
                                         r"max index in input 10"):
        embedding(frost.tensor([1, 10, 2]), w)
    with pytest.raises(IndexError, match=r"embedding: index -1 is out of range for num_embeddings 10"):
        embedding(frost.tensor([1, -1]), w)
    with pytest.raises(RuntimeError, match=r"embedding: indices must have an integer dtype, got float32 "
                                           r"\(input of shape \(2,\)\)"):
        embedding(frost.tensor([1.0, 2.0]), w)
    with pytest.raises(ValueError, match=r"embedding: padding_idx 10 must be within num_embeddings 10"):
        embedding(frost.tensor([1]), w, padding_idx=10)
    with pytest.raises(RuntimeError, match=r"embedding: weight must be 2-D"):
        embedding(frost.tensor([1]), frost.randn(10))
    with pytest.raises(NotImplementedError, match=r"embedding: max_norm"):
        embedding(frost.tensor([1]), w, max_norm=1.0)


@pytest.mark.cuda
def test_embedding_cuda_matches_cpu():
    rng = np.random.default_rng(12)
    w = rng.standard_normal((50, 8)).astype(np.float32)
    idx = rng.integers(0, 50, (6, 7))
    idx[0, :4] = [3, 3, 3, 0]
    results = []
    for device in ("cpu", "cuda"):
        fw = frost.tensor(w, device=device, requires_grad=True)
        out = embedding(frost.tensor(idx, device=device), fw, padding_idx=0)
        (out * out).sum().backward()
        results.append([t.detach().cpu().numpy() for t in (out, fw.grad)])
    for cpu_r, gpu_r in zip(*results):
        np.testing.assert_allclose(gpu_r, cpu_r, rtol=1e-5, atol=1e-5)
