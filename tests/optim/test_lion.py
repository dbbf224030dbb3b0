"""Lion against a fresh NumPy transcription of the paper's Algorithm 2; its flat kernel, state dicts and errors."""
import numpy as np
import pytest

import frost
from frost.autograd import AnomalyError, detect_anomaly
from frost.optim import Lion, lion_update
from frost.optim.flat import advance_step
from frost.optim.lion import lion_flat_kernel
from optim_oracle import (SHAPES, assert_resumes_exactly_through_a_file, gradient, initial_arrays, run_frost,
                          run_on_fixed_gradients)


def paper_lion(arrays, steps, lr, betas, weight_decay):
    """Chen et al. 2023, Algorithm 2, written out in float64 (gradients from optim_oracle, skipped when None)."""
    beta1, beta2 = betas
    x = [a.copy() for a in arrays]
    m = [np.zeros_like(a) for a in arrays]
    for t in steps:
        for i in range(len(x)):
            g = gradient(t, i, x[i])
            if g is None:
                continue
            c = beta1 * m[i] + (1 - beta1) * g
            x[i] = x[i] - lr * (np.sign(c) + weight_decay * x[i])
            m[i] = beta2 * m[i] + (1 - beta2) * g
    return x, m


@pytest.mark.parametrize("lr,betas,wd", [(1e-4, (0.9, 0.99), 0.0), (3e-2, (0.9, 0.99), 0.5),
                                         (1e-2, (0.5, 0.8), 1.0)])
def test_lion_matches_the_paper_over_20_steps(lr, betas, wd):
    arrays = initial_arrays()
    params = [frost.Tensor(a.copy(), requires_grad=True) for a in arrays]
    opt = Lion(params, lr=lr, betas=betas, weight_decay=wd)
    run_frost(opt, params, range(20))
    want_x, want_m = paper_lion(arrays, range(20), lr, betas, wd)
    for i, (p, x, m) in enumerate(zip(params, want_x, want_m)):
        np.testing.assert_allclose(p.detach().numpy(), x, rtol=1e-12, atol=1e-14, err_msg=f"param {i} {SHAPES[i]}")
        np.testing.assert_allclose(opt.state[p]["exp_avg"].numpy(), m, rtol=1e-12, atol=1e-14)
        assert opt.state[p]["exp_avg"].shape == p.shape
    assert float(opt.state[params[0]]["step"].item()) == 20
    assert float(opt.state[params[3]]["step"].item()) == 15  # no gradient on 5 of the 20 steps


def test_lion_defaults_and_first_step_by_hand():
    p = frost.Tensor(np.array([1.0, -2.0, 0.5]), requires_grad=True)
    opt = Lion([p], weight_decay=0.1)
    assert opt.defaults == dict(lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1)
    p.grad = frost.Tensor(np.array([0.3, 0.0, -4.0]))
    opt.step()  # m = 0, so c = 0.1 g and the step is -lr * sign(g) after the decay
    np.testing.assert_allclose(p.detach().numpy(),
                               np.array([1.0, -2.0, 0.5]) * (1 - 1e-5) - 1e-4 * np.array([1, 0, -1]), rtol=1e-15)
    np.testing.assert_allclose(opt.state[p]["exp_avg"].numpy(), 0.01 * np.array([0.3, 0.0, -4.0]), rtol=1e-15)


def test_param_groups_use_their_own_lr():
    arrays = initial_arrays(3)
    params = [frost.Tensor(a.copy(), requires_grad=True) for a in arrays]
    opt = Lion([{"params": params[:2], "lr": 0.05}, {"params": params[2:]}], lr=0.01, weight_decay=0.2)
    run_frost(opt, params, range(20))
    fast, _ = paper_lion(arrays, range(20), 0.05, (0.9, 0.99), 0.2)
    slow, _ = paper_lion(arrays, range(20), 0.01, (0.9, 0.99), 0.2)
    for i, p in enumerate(params):
        np.testing.assert_allclose(p.detach().numpy(), (fast if i < 2 else slow)[i], rtol=1e-12, atol=1e-14)


def test_state_dict_round_trip_through_a_file(tmp_path):
    make = lambda ps: Lion(ps, lr=0.02, betas=(0.8, 0.95), weight_decay=0.3)  # noqa: E731
    opt2 = assert_resumes_exactly_through_a_file(tmp_path, make, Lion)  # other options: the load restores them
    assert opt2.param_groups[0]["lr"] == 0.02 and opt2.param_groups[0]["betas"] == (0.8, 0.95)
    assert sorted(opt2.state_dict()["state"][0]) == ["exp_avg", "step"]


def test_kernel_compiles_for_sm90():
    assert len(lion_flat_kernel.compile(arch="sm_90")) > 1000


def test_simulated_kernel_equals_the_cpu_rule_over_steps():
    rng = np.random.default_rng(0)
    n = 300  # two blocks of 256, the second partly idle
    p, m = rng.standard_normal(n).astype(np.float32), np.zeros(n, np.float32)
    p_ref, m_ref = p.copy(), m.copy()
    hyper = np.array([0, 1e-2, 0.9, 0.99, 0.1], np.float32)
    for step in range(1, 6):
        g = rng.standard_normal(n).astype(np.float32)
        g[:4] = 0  # sign(0) = 0 in both
        advance_step.simulate[1, 32](hyper)
        lion_flat_kernel.simulate[2, 256](p, g, m, n, hyper)
        lion_update(p_ref, g, m_ref, step=step, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)
    assert hyper[0] == 5
    np.testing.assert_allclose(p, p_ref, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(m, m_ref, rtol=1e-5, atol=1e-7)


@pytest.mark.cuda
def test_gpu_flat_update_equals_cpu_rule():
    make = lambda ps: Lion(ps, lr=1e-2, weight_decay=0.1)  # noqa: E731
    _, cpu = run_on_fixed_gradients("cpu", make, step_lr=True)
    opt, gpu = run_on_fixed_gradients("cuda", make, step_lr=True)
    assert opt._flat, "the CUDA parameters should have been packed into a flat group"
    for a, b in zip(gpu, cpu):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert float(opt.state_dict()["state"][0]["step"].item()) == 20


@pytest.mark.parametrize("kwargs,match", [(dict(lr=-1.0), r"Lion: lr \(-1.0\)"),
                                          (dict(weight_decay=-0.1), r"Lion: .*weight_decay \(-0.1\)"),
                                          (dict(lr=float("nan")), r"Lion: lr \(nan\)"),
                                          (dict(betas=(0.9, 1.0)), r"Lion: betas .*\(0.9, 1.0\)"),
                                          (dict(betas=(0.9,)), r"Lion: betas")])
def test_invalid_hyperparameters_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Lion([frost.zeros(3, requires_grad=True)], **kwargs)


def test_anomaly_mode_names_the_parameter_with_a_nan_gradient():
    w, b = frost.ones(2, 3, requires_grad=True), frost.zeros(3, requires_grad=True)
    opt = Lion([("fc.weight", w), ("fc.bias", b)], lr=0.1)
    w.grad, b.grad = frost.ones(2, 3), frost.Tensor(np.array([0.0, np.nan, 1.0], np.float32))
    with detect_anomaly(), pytest.raises(AnomalyError, match="fc.bias"):
        opt.step()
    np.testing.assert_array_equal(w.detach().numpy(), np.ones((2, 3)))  # nothing was updated
    opt.step()  # outside anomaly mode the step runs (and NaN spreads, as in PyTorch)
    assert not np.isfinite(b.detach().numpy()[1])


def test_float32_and_bfloat16_params_keep_their_dtype():
    for dtype in ("float32", "bfloat16"):
        p = frost.ones(4, 3, dtype=dtype, requires_grad=True)
        opt = Lion([p], lr=0.1)
        for _ in range(3):
            p.grad = frost.full((4, 3), 0.5, dtype=dtype)
            opt.step()
        assert p.dtype == dtype and opt.state[p]["exp_avg"].dtype == dtype
        np.testing.assert_allclose(p.detach().numpy().astype(np.float32), 0.7, rtol=1e-2)  # three steps of exactly lr
