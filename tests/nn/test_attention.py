"""Tests of frost/nn/attention.py: MultiheadAttention against PyTorch (weights loaded across by state dict)."""
import numpy as np
import pytest
import torch

import frost
from frost import nn

from .helpers import assert_close, compare_layer, copy_weights

rng = np.random.default_rng(0)
E, H = 8, 2


def _pair(**kwargs):
    f, t = nn.MultiheadAttention(E, H, **kwargs), torch.nn.MultiheadAttention(E, H, **kwargs)
    with torch.no_grad():  # non-zero biases, so that a bias mix-up would show
        for p in t.parameters():
            if p.ndim == 1:
                p.uniform_(-0.5, 0.5)
    return f, t


def test_state_dict_keys_shapes_and_repr_match_torch():
    for kwargs in ({}, dict(bias=False), dict(kdim=5, vdim=3)):
        f, t = _pair(**kwargs)
        assert list(f.state_dict()) == list(t.state_dict())
        assert [v.shape for v in f.state_dict().values()] == [tuple(v.shape) for v in t.state_dict().values()]
        assert repr(f) == repr(t)
        copy_weights(t, f)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("need_weights", [True, False])
def test_self_attention_matches_torch(batch_first, need_weights):
    f, t = _pair(batch_first=batch_first)
    x = rng.standard_normal((3, 5, E))
    compare_layer(_Wrap(f, need_weights), _Wrap(t, need_weights), x)
    if need_weights:
        fo, to = f(*[frost.tensor(x)] * 3), t(*[torch.tensor(x)] * 3)
        assert_close(fo[1], to[1], what="averaged attention weights")
    else:
        assert f(*[frost.tensor(x)] * 3, need_weights=False)[1] is None


def test_cross_attention_with_masks_matches_torch():
    f, t = _pair(kdim=5, vdim=3, batch_first=True)
    q, k, v = rng.standard_normal((2, 4, E)), rng.standard_normal((2, 6, 5)), rng.standard_normal((2, 6, 3))
    bool_mask = np.triu(np.ones((4, 6), dtype=bool), k=3)
    padding = np.zeros((2, 6), dtype=bool)
    padding[1, -2:] = True
    float_mask = rng.standard_normal((2 * H, 4, 6))
    for need_weights in (True, False):
        for mask, kpm in ((bool_mask, padding), (float_mask, np.where(padding, -np.inf, 0.0))):
            compare_layer(_Wrap(f, need_weights, mask, kpm), _Wrap(t, need_weights, mask, kpm), q, k, v)
    fw = f(frost.tensor(q), frost.tensor(k), frost.tensor(v), attn_mask=frost.tensor(bool_mask),
           average_attn_weights=False)[1]
    tw = t(torch.tensor(q), torch.tensor(k), torch.tensor(v), attn_mask=torch.tensor(bool_mask),
           average_attn_weights=False)[1]
    assert_close(fw, tw.double(), what="per-head weights")


def test_is_causal_matches_an_explicit_causal_mask():
    f, t = _pair(batch_first=True)
    x = rng.standard_normal((2, 5, E))
    causal = np.triu(np.ones((5, 5), dtype=bool), k=1)
    for need_weights in (True, False):
        compare_layer(_Wrap(f, need_weights, is_causal=True), _Wrap(t, need_weights, causal), x)


def test_unbatched_input_and_bad_shapes():
    f, t = _pair()
    x = rng.standard_normal((5, E))
    compare_layer(_Wrap(f, True), _Wrap(t, True), x)
    with pytest.raises(ValueError, match="divisible"):
        nn.MultiheadAttention(10, 3)
    with pytest.raises(RuntimeError, match="embed_dim=8"):
        f(frost.randn(2, 3, 5), frost.randn(2, 3, 5), frost.randn(2, 3, 5))


def test_init_xavier_in_proj_and_zero_biases():
    frost.manual_seed(0)
    m = nn.MultiheadAttention(64, 4)
    bound = np.sqrt(6 / (64 + 3 * 64))
    w = m.in_proj_weight.detach().numpy()
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.98 * bound
    assert np.all(m.in_proj_bias.detach().numpy() == 0) and np.all(m.out_proj.bias.detach().numpy() == 0)


def test_dropout_on_weights_only_in_training():
    f = nn.MultiheadAttention(E, H, dropout=0.5, batch_first=True)
    x = frost.randn(2, 4, E)
    f.eval()
    a, b = f(x, x, x)[0].detach().numpy(), f(x, x, x)[0].detach().numpy()
    np.testing.assert_array_equal(a, b)
    f.train()
    assert not np.allclose(f(x, x, x)[0].detach().numpy(), a)


class _Wrap:
    """Calls an attention module with fixed options; returns only the output (for compare_layer)."""

    def __init__(self, module, need_weights, attn_mask=None, key_padding_mask=None, is_causal=False):
        self.module, self.need_weights, self.is_causal = module, need_weights, is_causal
        self.attn_mask, self.kpm = attn_mask, key_padding_mask

    def _mask(self, m):
        if m is None:
            return None
        return torch.tensor(m) if isinstance(self.module, torch.nn.Module) else frost.tensor(m)

    def __call__(self, q, k=None, v=None):
        k = q if k is None else k
        v = q if v is None else v
        kwargs = dict(need_weights=self.need_weights, attn_mask=self._mask(self.attn_mask),
                      key_padding_mask=self._mask(self.kpm))
        if self.is_causal:
            kwargs["is_causal"] = True
        return self.module(q, k, v, **kwargs)[0]

    def double(self):
        self.module.double()
        return self

    def to(self, dtype):
        self.module.to(dtype)
        return self

    def state_dict(self):
        return self.module.state_dict()

    def load_state_dict(self, sd):
        return self.module.load_state_dict(sd)

    def named_parameters(self):
        return self.module.named_parameters()
