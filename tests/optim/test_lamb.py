"""LAMB against a fresh NumPy transcription of the paper's Algorithm 2; trust-ratio edge cases, its one-launch flat
kernel (simulator here, GPU with -m cuda), state dicts, errors."""
import numpy as np
import pytest

import frost
from frost.autograd import AnomalyError, detect_anomaly
from frost.optim import LAMB, flat, lamb, lamb_update
from optim_oracle import (SHAPES, assert_gpu_flat_group_resumes_through_a_file, assert_resumes_exactly_through_a_file,
                          gradient, initial_arrays, run_frost,
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
        np.testing.assert_allclose(p.detach().numpy(), want_x[i], rtol=1e-12, atol=1e-14,
                                   err_msg=f"param {i} {SHAPES[i]}")
        np.testing.assert_allclose(opt.state[p]["exp_avg"].numpy(), want_m[i], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(opt.state[p]["exp_avg_sq"].numpy(), want_v[i], rtol=1e-12, atol=1e-14)
    assert float(opt.state[params[3]]["step"].item()) == 15  # no gradient on 5 of the 20 steps


def test_defaults_and_the_trust_ratio_by_hand():
    assert LAMB([frost.zeros(2, requires_grad=True)]).defaults == dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-6,
                                                                       weight_decay=0.01)
    # step 1: m_hat = g, sqrt(v_hat) = |g|, so r = g / (|g| + eps); with wd = 0 the step has length lr * ||w||
    p, g = np.array([3.0, 4.0]), np.array([0.5, -2.0])
    m, v = np.zeros(2), np.zeros(2)
    lamb_update(p, g, m, v, lr=0.1, betas=(0.9, 0.999), eps=0.0, weight_decay=0.0, step=1)
    np.testing.assert_allclose(p, np.array([3.0, 4.0]) - 0.1 * 5.0 * np.array([1.0, -1.0]) / np.sqrt(2), rtol=1e-14)


def test_trust_ratio_is_one_when_a_norm_is_zero():
    p, m, v = np.zeros(3), np.zeros(3), np.zeros(3)  # ||w|| = 0: a plain (Adam-like) step of length lr * ||r||
    lamb_update(p, np.array([1.0, -1.0, 0.0]), m, v, lr=0.1, betas=(0.9, 0.999), eps=1e-12, weight_decay=0.5,
                step=1)
    np.testing.assert_allclose(p, [-0.1, 0.1, 0.0], rtol=1e-11)
    q = np.array([1.0, 2.0])  # ||update|| = 0 (zero gradient, no decay): no step and no NaN
    with np.errstate(all="raise"):
        lamb_update(q, np.zeros(2), np.zeros(2), np.ones(2), lr=0.1, betas=(0.9, 0.999), eps=1e-6,
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
        np.testing.assert_allclose(p.detach().numpy().astype(np.float32), 0.9 * 0.9, rtol=1e-2)


def test_state_dict_round_trip_through_a_file(tmp_path):
    make = lambda ps: LAMB(ps, lr=0.02, betas=(0.8, 0.95), weight_decay=0.1)  # noqa: E731
    opt2 = assert_resumes_exactly_through_a_file(tmp_path, make, LAMB)
    assert opt2.param_groups[0]["betas"] == (0.8, 0.95)
    assert sorted(opt2.state_dict()["state"][0]) == ["exp_avg", "exp_avg_sq", "step"]


def test_flat_kernel_compiles_for_sm90():
    assert len(lamb.lamb_flat_kernel.compile(arch="sm_90")) > 1000


# sizes not multiples of the simulated block (64 threads), a 0-d one, one starting at zero (||w|| = 0 on step 1)
# and, in the second group (no decay), one whose gradient is always zero (||u|| = 0: trust 1, no step)
FLAT_SHAPES = [(7, 11), (70,), (), (3, 2, 5), (130,), (4,)]
ZERO_PARAM, ZERO_GRAD_PARAM = 1, 5


def train_flat_and_per_tensor(monkeypatch, steps=20):
    """The same float32 parameters and gradients through a flat group whose launches run in the kernel simulator
    (NumPy buffers) and through lamb_update, tensor by tensor. Returns (optimizer, params, references)."""
    monkeypatch.setattr(flat, "eligible", lambda params: True)
    monkeypatch.setattr(LAMB, "flat_kernel", lamb.lamb_flat_kernel.simulate)
    monkeypatch.setattr(flat, "advance_step", flat.advance_step.simulate)
    rng = np.random.default_rng(4)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in FLAT_SHAPES]
    arrays[ZERO_PARAM][...] = 0
    params = [frost.Tensor(a.copy(), requires_grad=True) for a in arrays]
    for p in params:
        p.grad = frost.Tensor(np.zeros(p.shape, np.float32))
    options = dict(lr=0.05, betas=(0.8, 0.99), eps=1e-6)
    opt = LAMB([{"params": params[:5], "weight_decay": 0.1}, {"params": params[5:], "weight_decay": 0.0}], **options)
    opt.flat_threads = 64  # two warps: block_sum across warps, and the simulator stays fast
    ref = [(a.copy(), np.zeros_like(a), np.zeros_like(a)) for a in arrays]
    for step in range(1, steps + 1):
        grads = [rng.standard_normal(s).astype(np.float32) for s in FLAT_SHAPES]
        grads[ZERO_GRAD_PARAM][...] = 0
        for p, g, (x, m, v) in zip(params, grads, ref):
            p.grad.data[...] = g
            lamb_update(x, g, m, v, lr=0.05, betas=(0.8, 0.99), eps=1e-6, step=float(step),
                        weight_decay=0.0 if p is params[ZERO_GRAD_PARAM] else 0.1)
        opt.step()
    return opt, params, ref


def test_simulated_flat_kernel_equals_the_cpu_rule_over_20_steps(monkeypatch):
    opt, params, ref = train_flat_and_per_tensor(monkeypatch)
    assert sorted(opt._flat) == [0, 1], "both groups should have gone flat"
    for i, (p, (x, m, v)) in enumerate(zip(params, ref)):
        np.testing.assert_allclose(p.detach().numpy(), x, rtol=1e-5, atol=1e-6, err_msg=f"param {i} {FLAT_SHAPES[i]}")
        np.testing.assert_allclose(opt.state[p]["exp_avg"].numpy(), m, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(opt.state[p]["exp_avg_sq"].numpy(), v, rtol=1e-5, atol=1e-7)
        assert float(opt.state[p]["step"].item()) == 20
    np.testing.assert_array_equal(params[ZERO_GRAD_PARAM].detach().numpy(), ref[ZERO_GRAD_PARAM][0])  # never moved
    assert np.abs(params[ZERO_PARAM].detach().numpy()).max() > 0.01  # moved off zero by a plain step at trust 1


def test_flat_segments_locate_each_parameter(monkeypatch):
    opt, params, _ = train_flat_and_per_tensor(monkeypatch, steps=1)
    group = opt._flat[0]
    segments = group.segments.reshape(-1, 2)
    assert segments.dtype == np.int32 and segments[:, 1].tolist() == [77, 70, 1, 30, 130]
    for p, (offset, n) in zip(params, segments):
        assert offset % flat.FlatGroup.ALIGN == 0
        np.testing.assert_array_equal(group.params[offset:offset + n], p.detach().numpy().reshape(-1))


@pytest.mark.cuda
def test_gpu_update_equals_cpu_rule():
    make = lambda ps: LAMB(ps, lr=1e-2, weight_decay=0.1)  # noqa: E731
    opt, gpu = run_on_fixed_gradients("cuda", make, step_lr=True)
    _, cpu = run_on_fixed_gradients("cpu", make, step_lr=True)
    assert opt._flat, "the CUDA parameters should have been packed into a flat group"
    for a, b in zip(gpu, cpu):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert float(opt.state_dict()["state"][0]["step"].item()) == 20


@pytest.mark.cuda
def test_flat_group_state_dict_round_trip(tmp_path):
    """10 flat steps, frost.save / frost.load of parameters and state, 10 more in a fresh flat group: as 20 straight."""
    assert_gpu_flat_group_resumes_through_a_file(tmp_path, lambda ps: LAMB(ps, lr=0.02, weight_decay=0.1), LAMB,
                                                 [(16, 8), (16,), (3, 16)])


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
    np.testing.assert_array_equal(b.detach().numpy(), np.zeros(3))
