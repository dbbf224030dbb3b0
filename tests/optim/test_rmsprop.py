"""RMSprop against torch.optim.RMSprop: centered, momentum, weight decay and maximize, 20 steps in float64."""
import itertools

import numpy as np
import pytest

import frost
from frost.optim import RMSprop, rmsprop_update

torch = pytest.importorskip("torch")
from optim_oracle import (assert_params_close, assert_resumes_exactly_through_a_file, assert_state_close,  # noqa: E402
                          frost_params, initial_arrays, run_on_fixed_gradients, torch_params, train)

COMBOS = [dict(centered=c, momentum=m, weight_decay=wd, maximize=mx)
          for c, m, wd, mx in itertools.product([False, True], [0.0, 0.9], [0.0, 0.1], [False, True])]


@pytest.mark.parametrize("options", COMBOS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_rmsprop_matches_torch(options):
    arrays = initial_arrays()
    fp, tp = frost_params(arrays), torch_params(arrays)
    fopt = RMSprop(fp, lr=0.01, alpha=0.9, eps=1e-6, **options)
    topt = torch.optim.RMSprop(tp, lr=0.01, alpha=0.9, eps=1e-6, foreach=False, **options)
    train(fopt, topt, fp, tp, range(20))
    assert_params_close(fp, tp)
    assert_state_close(fopt, topt)  # the same state names too: grad_avg only centered, momentum_buffer only momentum


def test_rmsprop_defaults_match_torch():
    arrays = initial_arrays(2)
    fp, tp = frost_params(arrays), torch_params(arrays)
    fopt, topt = RMSprop(fp), torch.optim.RMSprop(tp, foreach=False)
    assert {k: fopt.defaults[k] for k in fopt.defaults} == {k: topt.defaults[k] for k in fopt.defaults}
    train(fopt, topt, fp, tp, range(20))
    assert_params_close(fp, tp)
    assert_state_close(fopt, topt)


def test_param_groups_with_their_own_options_match_torch():
    arrays = initial_arrays(3)
    fp, tp = frost_params(arrays), torch_params(arrays)
    groups = [dict(centered=True, momentum=0.5), dict(lr=0.003, weight_decay=0.2)]
    fopt = RMSprop([{"params": fp[:2], **groups[0]}, {"params": fp[2:], **groups[1]}], lr=0.02)
    topt = torch.optim.RMSprop([{"params": tp[:2], **groups[0]}, {"params": tp[2:], **groups[1]}], lr=0.02,
                               foreach=False)
    train(fopt, topt, fp, tp, range(20))
    assert_params_close(fp, tp)
    assert_state_close(fopt, topt)


def test_rmsprop_update_by_hand():
    """The first centered step with momentum from zero state, written out."""
    p, g = np.array([1.0, -2.0, 0.5]), np.array([0.3, 0.0, -4.0])
    v, m, b = np.zeros(3), np.zeros(3), np.zeros(3)
    lr, alpha, eps = 0.1, 0.9, 1e-8
    avg = np.sqrt(0.1 * g * g - (0.1 * g) ** 2) + eps  # v = (1-alpha) g^2, m = (1-alpha) g
    expected = p - lr * (g / avg)  # the buffer starts at 0: b = g / avg
    rmsprop_update(p, g, v, m, b, step=1, lr=lr, alpha=alpha, eps=eps, weight_decay=0.0, momentum=0.9,
                   centered=True)
    np.testing.assert_allclose(v, 0.1 * g * g, rtol=1e-15)
    np.testing.assert_allclose(m, 0.1 * g, rtol=1e-15)
    np.testing.assert_allclose(p, expected, rtol=1e-12)


def test_momentum_turned_on_after_the_first_step_gets_a_buffer():
    p = frost.Tensor(np.array([1.0, 2.0]), requires_grad=True)
    opt = RMSprop([p], lr=0.1)
    p.grad = frost.Tensor(np.array([0.5, -0.5]))
    opt.step()
    assert sorted(opt.state[p]) == ["square_avg", "step"]
    opt.param_groups[0]["momentum"] = 0.9
    opt.step()
    assert sorted(opt.state[p]) == ["momentum_buffer", "square_avg", "step"]


def test_state_dict_round_trip_through_a_file(tmp_path):
    make = lambda ps: RMSprop(ps, lr=0.02, alpha=0.95, momentum=0.8, centered=True)  # noqa: E731
    opt2 = assert_resumes_exactly_through_a_file(tmp_path, make, RMSprop)
    assert opt2.param_groups[0]["momentum"] == 0.8 and opt2.param_groups[0]["centered"] is True
    assert sorted(opt2.state_dict()["state"][0]) == ["grad_avg", "momentum_buffer", "square_avg", "step"]


@pytest.mark.parametrize("kwargs,match", [(dict(lr=-1.0), r"RMSprop: lr \(-1.0\)"),
                                          (dict(alpha=-0.1), r"RMSprop: alpha \(-0.1\)"),
                                          (dict(alpha=1.5), r"RMSprop: alpha must be <= 1, got 1.5"),
                                          (dict(momentum=-0.9), r"RMSprop: momentum \(-0.9\)"),
                                          (dict(eps=float("nan")), r"RMSprop: eps \(nan\)")])
def test_invalid_hyperparameters_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RMSprop([frost.zeros(3, requires_grad=True)], **kwargs)


def test_float32_params_keep_their_dtype():
    p = frost.ones(4, 3, dtype="float32", requires_grad=True)
    opt = RMSprop([p], lr=0.1, centered=True, momentum=0.5)
    for _ in range(3):
        p.grad = frost.full((4, 3), 0.5, dtype="float32")
        opt.step()
    assert p.dtype == "float32" and all(opt.state[p][k].dtype == "float32" for k in ("square_avg", "grad_avg"))
    assert np.all(p.detach().numpy() < 1.0)


@pytest.mark.cuda
def test_gpu_update_equals_cpu_rule():
    make = lambda ps: RMSprop(ps, lr=1e-2, centered=True, momentum=0.9, weight_decay=0.01)  # noqa: E731
    _, cpu = run_on_fixed_gradients("cpu", make, step_lr=True)
    _, gpu = run_on_fixed_gradients("cuda", make, step_lr=True)
    for a, b in zip(gpu, cpu):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
