"""Tests of frost/nn/loss.py: the loss modules against PyTorch's, with their options."""
import numpy as np
import pytest
import torch

import frost
from frost import nn

from .helpers import assert_close

rng = np.random.default_rng(0)


def _compare(f, t, x, target):
    fx, tx = frost.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    fl, tl = f(fx, frost.tensor(target)), t(tx, torch.tensor(target))
    assert_close(fl, tl, what="loss")
    g = rng.standard_normal(tuple(tl.shape))
    fl.backward(frost.tensor(g))
    tl.backward(torch.tensor(g))
    assert_close(fx.grad, tx.grad, what="input grad")


@pytest.mark.parametrize("kwargs", [{}, dict(reduction="sum"), dict(reduction="none"), dict(ignore_index=2),
                                    dict(label_smoothing=0.1), dict(weight="w")])
def test_cross_entropy_loss_matches_torch(kwargs):
    w = rng.uniform(0.5, 2, 5)
    fk = {k: frost.tensor(w) if v == "w" else v for k, v in kwargs.items()}
    tk = {k: torch.tensor(w) if v == "w" else v for k, v in kwargs.items()}
    _compare(nn.CrossEntropyLoss(**fk), torch.nn.CrossEntropyLoss(**tk),
             rng.standard_normal((6, 5)), rng.integers(0, 5, 6))


def test_cross_entropy_loss_with_spatial_dims_and_nll_loss():
    _compare(nn.CrossEntropyLoss(), torch.nn.CrossEntropyLoss(), rng.standard_normal((2, 4, 3, 3)),
             rng.integers(0, 4, (2, 3, 3)))
    logp = np.log(rng.dirichlet(np.ones(4), 5))
    _compare(nn.NLLLoss(), torch.nn.NLLLoss(), logp, rng.integers(0, 4, 5))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_regression_losses_match_torch(reduction):
    x, y = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    _compare(nn.MSELoss(reduction=reduction), torch.nn.MSELoss(reduction=reduction), x, y)
    _compare(nn.L1Loss(reduction=reduction), torch.nn.L1Loss(reduction=reduction), x, y)


def test_bce_with_logits_loss_matches_torch():
    x, y = rng.standard_normal((4, 3)) * 5, rng.uniform(0, 1, (4, 3))
    w, pw = rng.uniform(0.5, 2, 3), rng.uniform(0.5, 2, 3)
    _compare(nn.BCEWithLogitsLoss(), torch.nn.BCEWithLogitsLoss(), x, y)
    _compare(nn.BCEWithLogitsLoss(weight=frost.tensor(w), pos_weight=frost.tensor(pw), reduction="sum"),
             torch.nn.BCEWithLogitsLoss(weight=torch.tensor(w), pos_weight=torch.tensor(pw), reduction="sum"), x, y)


def test_loss_buffers_repr_and_bad_reduction():
    w = np.ones(3)
    f, t = nn.CrossEntropyLoss(weight=frost.tensor(w)), torch.nn.CrossEntropyLoss(weight=torch.tensor(w))
    assert list(f.state_dict()) == list(t.state_dict()) == ["weight"]
    assert list(nn.BCEWithLogitsLoss(pos_weight=frost.tensor(w)).state_dict()) == ["pos_weight"]
    for name in ("CrossEntropyLoss", "MSELoss", "BCEWithLogitsLoss", "NLLLoss", "L1Loss"):
        assert repr(getattr(nn, name)()) == repr(getattr(torch.nn, name)())
    with pytest.raises(ValueError, match="reduction must be"):
        nn.MSELoss(reduction="avg")
    with pytest.warns(UserWarning, match="size_average"):
        assert nn.MSELoss(size_average=False).reduction == "sum"
