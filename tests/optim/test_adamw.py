"""AdamW against torch.optim.AdamW: every option combination, 20 steps, float64; its update function alone."""
import itertools

import numpy as np
import pytest
import torch

import frost
from frost.optim import AdamW, adamw_update
from optim_oracle import assert_params_close, assert_state_close, frost_params, initial_arrays, torch_params, train

COMBOS = [dict(weight_decay=wd, amsgrad=a, maximize=m, betas=b)
          for wd, a, m, b in itertools.product([0.0, 0.01, 0.3], [False, True], [False, True],
                                               [(0.9, 0.999), (0.8, 0.9)])]


@pytest.mark.parametrize("options", COMBOS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_adamw_matches_torch(options):
    arrays = initial_arrays()
    fp, tp = frost_params(arrays), torch_params(arrays)
    fopt = AdamW(fp, lr=0.02, eps=1e-6, **options)
    topt = torch.optim.AdamW(tp, lr=0.02, eps=1e-6, foreach=False, **options)
    train(fopt, topt, fp, tp, range(20))
    assert_params_close(fp, tp)
    assert_state_close(fopt, topt)


def test_adamw_defaults_match_torch():
    arrays = initial_arrays(2)
    fp, tp = frost_params(arrays), torch_params(arrays)
    fopt, topt = AdamW(fp), torch.optim.AdamW(tp, foreach=False)
    assert fopt.defaults["weight_decay"] == 1e-2
    assert {k: fopt.defaults[k] for k in fopt.defaults} == {k: topt.defaults[k] for k in fopt.defaults}
    train(fopt, topt, fp, tp, range(5))
    assert_params_close(fp, tp)


def test_adamw_update_by_hand():
    """The first step of AdamW from zero state, written out: m = (1-b1) g, v = (1-b2) g^2, bias-corrected."""
    p, g = np.array([1.0, -2.0, 0.5]), np.array([0.3, 0.0, -4.0])
    m, v = np.zeros(3), np.zeros(3)
    lr, b1, b2, eps, wd = 0.1, 0.9, 0.99, 1e-8, 0.05
    expected_p = p * (1 - lr * wd) - lr * g / (np.abs(g) + eps)  # m_hat = g and sqrt(v_hat) = |g| on step 1
    adamw_update(p, g, m, v, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, step=1)
    np.testing.assert_allclose(m, 0.1 * g, rtol=1e-15)
    np.testing.assert_allclose(v, 0.01 * g * g, rtol=1e-15)
    np.testing.assert_allclose(p, expected_p, rtol=1e-12)


def test_adamw_float32_and_bfloat16_params_keep_their_dtype():
    for dtype in ("float32", "bfloat16"):
        p = frost.ones(4, dtype=dtype, requires_grad=True)
        opt = AdamW([p], lr=0.1)
        for _ in range(2):
            p.grad = frost.full((4,), 0.5, dtype=dtype)
            opt.step()
        assert p.dtype == dtype and opt.state[p]["exp_avg"].dtype == dtype and opt.state[p]["exp_avg_sq"].dtype == dtype
        assert np.all(p.detach().numpy().astype(np.float32) < 1.0)
