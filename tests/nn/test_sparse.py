"""Tests of frost/nn/sparse.py: Embedding against PyTorch, padding_idx, init, from_pretrained."""
import numpy as np
import pytest
import torch

import frost
from frost import nn

from .helpers import assert_close


def _compare(f, t, idx):
    t.double()
    f.double()
    f.load_state_dict({"weight": t.weight.detach().numpy()})
    fo, to = f(frost.tensor(idx)), t(torch.tensor(idx))
    assert_close(fo, to, what="forward")
    g = np.random.default_rng(0).standard_normal(tuple(to.shape))
    fo.backward(frost.tensor(g))
    to.backward(torch.tensor(g))
    assert_close(f.weight.grad, t.weight.grad, what="weight grad")


def test_embedding_matches_torch_with_repeated_indices():
    idx = np.array([[1, 2, 1, 0], [4, 4, 4, 3]])
    _compare(nn.Embedding(6, 3), torch.nn.Embedding(6, 3), idx)


@pytest.mark.parametrize("padding_idx", [0, -1])
def test_embedding_padding_row_is_zero_and_gets_no_gradient(padding_idx):
    f = nn.Embedding(5, 4, padding_idx=padding_idx)
    row = padding_idx % 5
    assert f.padding_idx == row
    assert np.all(f.weight.detach().numpy()[row] == 0) and np.any(f.weight.detach().numpy()[(row + 1) % 5] != 0)
    idx = np.array([0, 4, 2, 4, 0])
    _compare(f, torch.nn.Embedding(5, 4, padding_idx=padding_idx), idx)
    assert np.all(f.weight.grad.numpy()[row] == 0)


def test_embedding_init_is_standard_normal_and_repr_matches():
    frost.manual_seed(0)
    w = nn.Embedding(1000, 64).weight.detach().numpy()
    assert abs(w.mean()) < 0.01 and abs(w.std() - 1) < 0.01
    for kwargs in ({}, dict(padding_idx=2)):
        assert repr(nn.Embedding(10, 3, **kwargs)) == repr(torch.nn.Embedding(10, 3, **kwargs))


def test_embedding_from_pretrained_and_unsupported_options():
    weights = frost.tensor([[1.0, 2.0], [3.0, 4.0]])
    e = nn.Embedding.from_pretrained(weights)
    assert not e.weight.requires_grad
    np.testing.assert_array_equal(e(frost.tensor([1, 0])).numpy(), [[3, 4], [1, 2]])
    assert nn.Embedding.from_pretrained(weights, freeze=False).weight.requires_grad
    with pytest.raises(NotImplementedError, match="max_norm"):
        nn.Embedding(3, 2, max_norm=1.0)
    with pytest.raises(ValueError, match="padding_idx=7"):
        nn.Embedding(3, 2, padding_idx=7)
