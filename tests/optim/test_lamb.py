"""LAMB against a fresh NumPy transcription of the paper's Algorithm 2; trust-ratio edge cases, state dicts, errors."""
import numpy as np
import pytest

import frost
from frost.autograd import AnomalyError, detect_anomaly
from frost.optim import LAMB, lamb_update
from optim_oracle import (SHAPES, assert_resumes_exactly_through_a_file, gradient, initial_arrays, run_frost,
                          run_on_fixed_gradients)


def paper_lamb(arrays, steps, lr, betas, eps, weight_decay):
    """You et al. 2020, Algorithm 2 (phi = identity, ratio 1 when a norm is 0), in float64."""
    beta1, beta2 = betas
    x = [a.copy() for a in arrays]
    m, v = [np.zeros_like(a) for a in arrays], [np.zeros_like(a) for a in arrays]
    t = [0] * len(x)  # per-parameter step, as a parameter without a gradient takes no step
    for step in steps:
        for i in range(len(x)):
            g = gradient(step, i, x[i])
            if g is None:
                continue
            t[i] += 1
            m[i] = beta1 * m[i] + (1 - beta1) * g
            v[i] = beta2 * v[i] + (1 - beta2) * g ** 2
            m_hat, v_hat = m[i] / (1 - beta1 ** t[i]), v[i] / (1 - beta2 ** t[i])
            r = m_hat / (np.sqrt(v_hat) + eps) + weight_decay * x[i]
            w_norm, r_norm = np.sqrt(np.sum(x[i] ** 2)), np.sqrt(np.sum(r ** 2))
            ratio = w_norm / r_norm if w_norm > 0 and r_norm > 0 else 1.0
            x[i] = x[i] - lr * ratio * r
    return x, m, v


@pytest.mark.parametrize("lr,betas,eps,wd", [(1e-3, (0.9, 0.999), 1e-6, 0.01), (0.05, (0.8, 0.9), 1e-8, 0.0),
                                             (0.02, (0.9, 0.99), 1e-3, 0.3)])
def test_lamb_matches_the_paper_over_20_steps(lr, betas, eps, wd):
    arrays = initial_arrays()
    params = [frost.Tensor(a.copy(), requires_grad=True) for a in arrays]
    opt = LAMB(params, lr=lr, betas=betas, eps=eps, weight_decay=wd)
    run_frost(opt, params, range(20))
    want_x, want_m, want_v = paper_lamb(arrays, range(20), lr, betas, eps, wd)
    for i, p in enumerate(params):
        np.testing.assert_allclose(p.numpy(), want_x[i], rtol=1e-12, atol=1e-14, err_msg=f"param {i} {SHAPES[i]}")
        np.testing.assert_allclose(opt.state[p]["exp_avg"].numpy(), want_m[i], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(opt.state[p]["exp_avg_sq"].numpy(), want_v[i], rtol=1e-12, atol=1e-14)
    assert float(opt.state[params[3]]["step"].item()) == 15  # no gradient on 5 of the 20 steps


def test_defaults_and_the_trust_ratio_by_hand():
    assert LAMB([frost.zeros(2, requires_grad=True)]).defaults == dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-6,
                                                                       weight_decay=0.01)
    # step 1: m_hat = g, sqrt(v_hat) = |g|, so r = g / (|g| + eps); with wd = 0 the step has length lr * ||w||
    p, g = np.array([3.0, 4.0]), np.array([0.5, -2.0])
    m, v = np.zeros(2), np.zeros(2)
    lamb_update(p, g, m, v, lr=0.1, beta1=0.9, beta2=0.999, eps=0.0, weight_decay=0.0, step=1)
    np.testing.assert_allclose(p, np.array([3.0, 4.0]) - 0.1 * 5.0 * np.array([1.0, -1.0]) / np.sqrt(2), rtol=1e-14)


def test_trust_ratio_is_one_when_a_norm_is_zero():
    p, m, v = np.zeros(3), np.zeros(3), np.zeros(3)  # ||w|| = 0: a plain (Adam-like) step of length lr * ||r||
    lamb_update(p, np.array([1.0, -1.0, 0.0]), m, v, lr=0.1, beta1=0.9, beta2=0.999, eps=1e-12, weight_decay=0.5,
                step=1)
    np.testing.assert_allclose(p, [-0.1, 0.1, 0.0], rtol=1e-11)
    q = np.array([1.0, 2.0])  # ||update|| = 0 (zero gradient, no decay): no step and no NaN
    with np.errstate(all="raise"):
        lamb_update(q, np.zeros(2), np.zeros(2), np.ones(2), lr=0.1, beta1=0.9, beta2=0.999, eps=1e-6,
                    weight_decay=0.0, step=3)
    np.testing.assert_array_equal(q, [1.0, 2.0])


def test_float32_and_bfloat16_params_keep_their_dtype():
    for dtype in ("float32", "bfloat16"):
        p = frost.ones(4, dtype=dtype, requires_grad=True)
        opt = LAMB([p], lr=0.1)
        for _ in range(2):
            p.grad = frost.full((4,), 0.5, dtype=dtype)
            opt.step()
        assert p.dtype == dtype and opt.state[p]["exp_avg_sq"].dtype == dtype
        # u = (1 + wd * p) * ones is parallel to p, so each step moves p by lr * ||p|| toward 0: p *= 1 - lr
        np.testing.assert_allclose(p.numpy().astype(np.float32), 0.9 * 0.9, rtol=1e-2)


def test_state_dict_round_trip_through_a_file(tmp_path):
    make = lambda ps: LAMB(ps, lr=0.02, betas=(0.8, 0.95), weight_decay=0.1)  # noqa: E731
    opt2 = assert_resumes_exactly_through_a_file(tmp_path, make, LAMB)
    assert opt2.param_groups[0]["betas"] == (0.8, 0.95)
    assert sorted(opt2.state_dict()["state"][0]) == ["exp_avg", "exp_avg_sq", "step"]


@pytest.mark.cuda
def test_gpu_update_equals_cpu_rule():
    make = lambda ps: LAMB(ps, lr=1e-2, weight_decay=0.1)  # noqa: E731
    _, gpu = run_on_fixed_gradients("cuda", make)
    _, cpu = run_on_fixed_gradients("cpu", make)
    for a, b in zip(gpu, cpu):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs,match", [(dict(lr=-1.0), r"LAMB: lr \(-1.0\)"),
                                          (dict(eps=-1e-6), r"LAMB: .*eps \(-1e-06\)"),
                                          (dict(weight_decay=float("nan")), r"LAMB: .*weight_decay \(nan\)"),
                                          (dict(betas=(1.0, 0.999)), r"LAMB: betas .*\(1.0, 0.999\)")])
def test_invalid_hyperparameters_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LAMB([frost.zeros(3, requires_grad=True)], **kwargs)


def test_anomaly_mode_names_the_parameter_with_a_nan_gradient():
    w, b = frost.ones(2, 3, requires_grad=True), frost.zeros(3, requires_grad=True)
    opt = LAMB([{"params": [("fc.weight", w)]}, {"params": [("fc.bias", b)], "weight_decay": 0.0}])
    w.grad, b.grad = frost.Tensor(np.full((2, 3), np.inf, np.float32)), frost.ones(3)
    with detect_anomaly(), pytest.raises(AnomalyError, match="fc.weight"):
        opt.step()
    np.testing.assert_array_equal(b.numpy(), np.zeros(3))
