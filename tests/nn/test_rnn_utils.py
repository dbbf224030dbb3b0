"""Tests of frost.nn.utils.rnn.pad_sequence against torch.nn.utils.rnn.pad_sequence (float64): values and
gradients for both layouts and padding sides, and the errors."""
import numpy as np
import pytest
import torch

import frost
from frost.nn.utils.rnn import pad_sequence


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_pad_sequence_matches_torch(batch_first, padding_side):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((n, 2, 3)) for n in (4, 1, 6)]
    ours = [frost.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    f = pad_sequence(ours, batch_first=batch_first, padding_value=-1.5, padding_side=padding_side)
    t = torch.nn.utils.rnn.pad_sequence(theirs, batch_first=batch_first, padding_value=-1.5,
                                        padding_side=padding_side)
    np.testing.assert_array_equal(f.detach().numpy(), t.detach().numpy())
    g = rng.standard_normal(t.shape)
    f.backward(frost.tensor(g))
    t.backward(torch.tensor(g))
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a.grad.numpy(), b.grad.numpy())


def test_pad_sequence_is_reachable_as_torch_spells_it():
    assert frost.nn.utils.rnn.pad_sequence is pad_sequence


def test_bad_sequences_are_refused():
    with pytest.raises(RuntimeError, match="pad_sequence: received an empty list"):
        pad_sequence([])
    with pytest.raises(RuntimeError, match=r"pad_sequence: .*sequences\[1\] is \(2, 4\)"):
        pad_sequence([frost.ones(3, 2), frost.ones(2, 4)])
    with pytest.raises(ValueError, match="padding_side must be 'left' or 'right'"):
        pad_sequence([frost.ones(3)], padding_side="middle")
