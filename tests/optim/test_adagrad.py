"""Adagrad against torch.optim.Adagrad: lr decay, weight decay, initial accumulator, maximize, 20 steps in float64."""
import itertools

import numpy as np
import pytest

import frost
from frost.optim import Adagrad, adagrad_update

torch = pytest.importorskip("torch")
from optim_oracle import (assert_params_close, assert_resumes_exactly_through_a_file, assert_state_close,  # noqa: E402
                          frost_params, initial_arrays, run_on_fixed_gradients, torch_params, train)

COMBOS = [dict(lr_decay=d, weight_decay=wd, initial_accumulator_value=a, maximize=m)
          for d, wd, a, m in itertools.product([0.0, 0.05], [0.0, 0.1], [0.0, 0.5], [False, True])]


@pytest.mark.parametrize("options", COMBOS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_adagrad_matches_torch(options):
    arrays = initial_arrays()
    fp, tp = frost_params(arrays), torch_params(arrays)
    fopt = Adagrad(fp, lr=0.05, eps=1e-8, **options)
    topt = torch.optim.Adagrad(tp, lr=0.05, eps=1e-8, foreach=False, **options)
    assert_state_close(fopt, topt)  # state made at construction, as torch's
    train(fopt, topt, fp, tp, range(20))
    assert_params_close(fp, tp)
    assert_state_close(fopt, topt)


def test_adagrad_defaults_match_torch():
    arrays = initial_arrays(2)
    fp, tp = frost_params(arrays), torch_params(arrays)
    fopt, topt = Adagrad(fp), torch.optim.Adagrad(tp, foreach=False)
    assert {k: fopt.defaults[k] for k in fopt.defaults} == {k: topt.defaults[k] for k in fopt.defaults}
    train(fopt, topt, fp, tp, range(20))
    assert_params_close(fp, tp)


def test_param_groups_with_their_own_options_match_torch():
    arrays = initial_arrays(3)
    fp, tp = frost_params(arrays), torch_params(arrays)
    # torch fills every group's sum with the constructor's initial_accumulator_value (frost: the group's), so
    # the groups differ in the other options here
    groups = [dict(lr_decay=0.1, eps=1e-3), dict(lr=0.003, weight_decay=0.2)]
    fopt = Adagrad([{"params": fp[:2], **groups[0]}, {"params": fp[2:], **groups[1]}], lr=0.02,
                   initial_accumulator_value=0.3)
    topt = torch.optim.Adagrad([{"params": tp[:2], **groups[0]}, {"params": tp[2:], **groups[1]}], lr=0.02,
                               initial_accumulator_value=0.3, foreach=False)
    train(fopt, topt, fp, tp, range(20))
    assert_params_close(fp, tp)
    assert_state_close(fopt, topt)


def test_adagrad_update_by_hand():
    """Two steps written out: the sum of squares grows, lr decays as lr / (1 + (step - 1) lr_decay)."""
    p, s = np.array([1.0, -2.0]), np.array([0.1, 0.1])
    g1, g2 = np.array([0.3, -4.0]), np.array([1.0, 2.0])
    adagrad_update(p, g1, s, step=1, lr=0.1, lr_decay=0.5, eps=0.0, weight_decay=0.0)
    adagrad_update(p, g2, s, step=2, lr=0.1, lr_decay=0.5, eps=0.0, weight_decay=0.0)
    s1 = 0.1 + g1 ** 2
    expected = np.array([1.0, -2.0]) - 0.1 * g1 / np.sqrt(s1) - 0.1 / 1.5 * g2 / np.sqrt(s1 + g2 ** 2)
    np.testing.assert_allclose(s, s1 + g2 ** 2, rtol=1e-15)
    np.testing.assert_allclose(p, expected, rtol=1e-13)


def test_each_group_starts_from_its_own_initial_accumulator():
    a, b, c = (frost.ones(2, requires_grad=True) for _ in range(3))
    opt = Adagrad([{"params": [a]}, {"params": [c], "initial_accumulator_value": 2.0}], lr=0.1)
    opt.add_param_group({"params": [b], "initial_accumulator_value": 3.0})
    a.grad, b.grad, c.grad = frost.ones(2), frost.ones(2), frost.ones(2)
    opt.step()
    np.testing.assert_allclose(opt.state[a]["sum"].numpy(), [1.0, 1.0])
    np.testing.assert_allclose(opt.state[c]["sum"].numpy(), [3.0, 3.0])
    np.testing.assert_allclose(opt.state[b]["sum"].numpy(), [4.0, 4.0])
    np.testing.assert_allclose(b.detach().numpy(), 1.0 - 0.1 / (2.0 + 1e-10))


def test_state_dict_round_trip_through_a_file(tmp_path):
    make = lambda ps: Adagrad(ps, lr=0.05, lr_decay=0.01, initial_accumulator_value=0.2)  # noqa: E731
    opt2 = assert_resumes_exactly_through_a_file(tmp_path, make, Adagrad)
    assert opt2.param_groups[0]["lr_decay"] == 0.01
    assert sorted(opt2.state_dict()["state"][0]) == ["step", "sum"]


@pytest.mark.parametrize("kwargs,match", [(dict(lr=-1.0), r"Adagrad: lr \(-1.0\)"),
                                          (dict(lr_decay=-0.1), r"Adagrad: lr_decay \(-0.1\)"),
                                          (dict(initial_accumulator_value=-1), r"Adagrad: initial_accumulator_value"),
                                          (dict(eps=float("nan")), r"Adagrad: eps \(nan\)")])
def test_invalid_hyperparameters_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Adagrad([frost.zeros(3, requires_grad=True)], **kwargs)


@pytest.mark.cuda
def test_gpu_update_equals_cpu_rule():
    make = lambda ps: Adagrad(ps, lr=1e-2, lr_decay=0.01, weight_decay=0.01, initial_accumulator_value=0.1)  # noqa
    _, cpu = run_on_fixed_gradients("cpu", make, step_lr=True)
    _, gpu = run_on_fixed_gradients("cuda", make, step_lr=True)
    for a, b in zip(gpu, cpu):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
