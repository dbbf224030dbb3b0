"""The Optimizer base: param groups, lr changes, zero_grad, closures, and PyTorch-format state dicts."""
import warnings
from collections import defaultdict

import numpy as np
import pytest
import torch

import frost
from frost.optim import SGD, Adafactor, Adam, AdamW
from optim_oracle import (assert_params_close, assert_state_close, frost_params, initial_arrays, set_frost_grads,
                          set_torch_grads, torch_params, train)

OPTIMIZERS = [
    (SGD, torch.optim.SGD, dict(lr=0.05, momentum=0.9, weight_decay=0.01, nesterov=True)),
    (Adam, torch.optim.Adam, dict(lr=0.02, weight_decay=0.01, amsgrad=True)),
    (AdamW, torch.optim.AdamW, dict(lr=0.02, weight_decay=0.1)),
]
IDS = [f.__name__ for f, _, _ in OPTIMIZERS]


def groups(params, second: dict):
    return [{"params": params[:2]}, {"params": params[2:], **second}]


@pytest.mark.parametrize("fcls, tcls, options", OPTIMIZERS, ids=IDS)
def test_param_groups_with_their_own_options_and_lr_changes_match_torch(fcls, tcls, options):
    arrays = initial_arrays()
    fp, tp = frost_params(arrays), torch_params(arrays)
    second = dict(lr=0.2, weight_decay=0.0)
    fopt = fcls(groups(fp, second), **options)
    topt = tcls(groups(tp, second), foreach=False, **options)
    assert [g["lr"] for g in fopt.param_groups] == [options["lr"], 0.2]
    train(fopt, topt, fp, tp, range(10))
    for opt in (fopt, topt):  # a schedule would do this between steps
        opt.param_groups[0]["lr"] *= 0.5
        opt.param_groups[1]["lr"] = 0.01
    train(fopt, topt, fp, tp, range(10, 20))
    assert_params_close(fp, tp)
    assert_state_close(fopt, topt)


@pytest.mark.parametrize("fcls, tcls, options", OPTIMIZERS, ids=IDS)
def test_add_param_group_matches_torch(fcls, tcls, options):
    arrays = initial_arrays()
    fp, tp = frost_params(arrays), torch_params(arrays)
    fopt, topt = fcls(fp[:3], **options), tcls(tp[:3], foreach=False, **options)
    train(fopt, topt, fp, tp, range(3))
    fopt.add_param_group({"params": fp[3:], "lr": 0.3})
    topt.add_param_group({"params": tp[3:], "lr": 0.3})
    assert fopt.param_groups[1]["lr"] == 0.3 and fopt.param_groups[1]["weight_decay"] == options["weight_decay"]
    train(fopt, topt, fp, tp, range(3, 12))
    assert_params_close(fp, tp)


@pytest.mark.parametrize("fcls, tcls, options", OPTIMIZERS, ids=IDS)
def test_state_dict_round_trip_mid_training_continues_exactly(fcls, tcls, options, tmp_path):
    arrays = initial_arrays()
    fp, tp = frost_params(arrays), torch_params(arrays)
    fopt = fcls(groups(fp, dict(lr=0.1)), **options)
    topt = tcls(groups(tp, dict(lr=0.1)), foreach=False, **options)
    train(fopt, topt, fp, tp, range(10))

    frost.save({"params": fp, "optimizer": fopt.state_dict(), "step": 10}, tmp_path / "ckpt.safetensors")
    ckpt = frost.load(tmp_path / "ckpt.safetensors")
    assert ckpt["step"] == 10
    resumed = [frost.Tensor(t.detach().numpy(), requires_grad=True) for t in ckpt["params"]]
    ropt = fcls(groups(resumed, dict(lr=0.1)), **options)
    ropt.load_state_dict(ckpt["optimizer"])

    train(fopt, topt, fp, tp, range(10, 20))
    for step in range(10, 20):
        set_frost_grads(step, resumed)
        ropt.step()
    for a, b in zip(resumed, fp):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())  # bit-identical to the uninterrupted run
    assert_params_close(fp, tp)


@pytest.mark.parametrize("fcls, tcls, options", OPTIMIZERS, ids=IDS)
def test_loads_a_torch_state_dict(fcls, tcls, options):
    """The formats agree: torch's state dict (tensors converted) resumes a frost optimizer where torch was."""
    arrays = initial_arrays()
    tp = torch_params(arrays)
    topt = tcls(groups(tp, dict(lr=0.1)), foreach=False, **options)
    for step in range(10):
        set_torch_grads(step, tp)
        topt.step()
    tsd = topt.state_dict()
    converted = {"state": {i: {k: frost.Tensor(v.numpy().copy()) for k, v in s.items()}
                           for i, s in tsd["state"].items()},
                 "param_groups": tsd["param_groups"]}
    fp = frost_params([t.detach().numpy() for t in tp])
    fopt = fcls(groups(fp, dict(lr=0.1)), **options)
    fopt.load_state_dict(converted)
    train(fopt, topt, fp, tp, range(10, 20))
    assert_params_close(fp, tp)
    assert_state_close(fopt, topt)


def test_state_dict_format():
    arrays = initial_arrays()
    fp = frost_params(arrays)
    opt = Adam([{"params": fp[:2]}, {"params": fp[2:], "lr": 0.5}], lr=0.1)
    for p in fp:
        p.grad = frost.ones_like(p)
    fp[4].grad = None
    opt.step()
    sd = opt.state_dict()
    assert sorted(sd["state"]) == [0, 1, 2, 3]  # parameter 4 never had a gradient
    assert set(sd["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
    assert isinstance(sd["state"][0]["exp_avg"], frost.Tensor)
    assert sd["param_groups"][0]["params"] == [0, 1] and sd["param_groups"][1]["params"] == [2, 3, 4]
    assert sd["param_groups"][1]["lr"] == 0.5 and sd["param_groups"][1]["betas"] == (0.9, 0.999)


def test_loaded_state_is_a_private_copy():
    fp = frost_params(initial_arrays())
    opt = AdamW(fp, lr=0.1)
    for p in fp:
        p.grad = frost.ones_like(p)
    opt.step()
    sd = opt.state_dict()
    before = sd["state"][0]["exp_avg"].numpy().copy()
    other = AdamW(fp, lr=0.1)
    other.load_state_dict(sd)
    other.step()
    np.testing.assert_array_equal(sd["state"][0]["exp_avg"].numpy(), opt.state[fp[0]]["exp_avg"].numpy())
    assert not np.array_equal(other.state[fp[0]]["exp_avg"].numpy(), before)
    np.testing.assert_array_equal(opt.state[fp[0]]["exp_avg"].numpy(), before)


def test_load_state_dict_errors_name_the_mismatch():
    fp = frost_params(initial_arrays())
    opt = SGD([{"params": fp[:2]}, {"params": fp[2:]}], lr=0.1, momentum=0.9)
    for p in fp:
        p.grad = frost.ones_like(p)
    opt.step()
    sd = opt.state_dict()
    with pytest.raises(ValueError, match="the state dict has 2 parameter groups but the optimizer has 1"):
        SGD(fp, lr=0.1).load_state_dict(sd)
    with pytest.raises(ValueError, match="parameter group 1 has 3 parameters in the state dict but 2 in the optimizer"):
        SGD([{"params": fp[:2]}, {"params": fp[2:4]}], lr=0.1).load_state_dict(sd)
    swapped = SGD([{"params": [fp[1], fp[0]]}, {"params": fp[2:]}], lr=0.1)
    with pytest.raises(ValueError, match=r"parameter group 0, parameter 0 \(param 0.0, index 0 in the state dict\): "
                                         r"state 'momentum_buffer' has shape \(4, 3\), expected \(3,\)"):
        swapped.load_state_dict(sd)
    with pytest.raises(ValueError, match="expected a dict with 'state' and 'param_groups'"):
        opt.load_state_dict({"state": {}})


def test_constructor_errors():
    p = frost.zeros(3, requires_grad=True)
    with pytest.raises(ValueError, match="SGD got an empty parameter list"):
        SGD([], lr=0.1)
    with pytest.raises(TypeError, match="ordered iterable"):
        SGD({p}, lr=0.1)
    with pytest.raises(TypeError, match="param 1 of group 0 is a ndarray"):
        SGD([p, np.zeros(3)], lr=0.1)
    with pytest.raises(ValueError, match="non-leaf"):
        SGD([p * 2], lr=0.1)
    with pytest.raises(ValueError, match="more than once"):
        SGD([{"params": [p]}, {"params": [p]}], lr=0.1)


def test_a_parameter_twice_in_one_group_is_refused_where_torch_would_update_it_twice():
    """PyTorch only warns, then applies both entries' updates: docs/differences-from-pytorch.md says why not."""
    q = torch.zeros(2, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        topt = torch.optim.SGD([q, q], lr=0.1)
    q.grad = torch.ones(2)
    topt.step()
    assert q.tolist() == pytest.approx([-0.2, -0.2])  # two updates of 0.1
    with pytest.raises(ValueError, match="more than once.*PyTorch only warns within a group, then updates them twice"):
        SGD([frost.zeros(2, requires_grad=True)] * 2, lr=0.1)


@pytest.mark.parametrize("fcls, tcls, options", OPTIMIZERS, ids=IDS)
def test_state_is_a_defaultdict_as_in_torch_and_looking_up_changes_no_update(fcls, tcls, options):
    arrays = initial_arrays()
    fp, tp = frost_params(arrays), torch_params(arrays)
    fopt, topt = fcls(fp, **options), tcls(tp, foreach=False, **options)
    assert isinstance(fopt.state, defaultdict)
    assert fopt.state[fp[0]] == topt.state[tp[0]] == {}  # before any step; both now hold {} for parameter 0
    assert fopt.state_dict()["state"] == {0: {}} and topt.state_dict()["state"] == {0: {}}
    train(fopt, topt, fp, tp, range(10))
    assert_params_close(fp, tp)
    assert_state_close(fopt, topt)
    loaded = fcls(frost_params(arrays), **options)
    loaded.load_state_dict(fopt.state_dict())
    assert isinstance(loaded.state, defaultdict) and loaded.state[frost.zeros(1)] == {}


def test_sgd_without_momentum_keeps_no_state_even_after_a_look_up():
    arrays = initial_arrays()
    fp, tp = frost_params(arrays), torch_params(arrays)
    fopt, topt = SGD(fp, lr=0.1), torch.optim.SGD(tp, lr=0.1, foreach=False)
    fopt.state[fp[1]], topt.state[tp[1]]
    train(fopt, topt, fp, tp, range(5))
    assert_params_close(fp, tp)
    assert fopt.state_dict()["state"] == topt.state_dict()["state"] == {1: {}}


def test_flat_groups_see_a_looked_up_empty_state_as_no_state():
    from frost.optim.flat import common_step
    a, b = frost.zeros(2, requires_grad=True), frost.zeros(3, requires_grad=True)
    state = defaultdict(dict)
    state[a]
    assert common_step([a, b], state) == 0.0 and b not in state


@pytest.mark.parametrize("fcls, tcls, options", OPTIMIZERS, ids=IDS)
def test_load_state_dict_fills_options_missing_from_a_saved_group_as_torch(fcls, tcls, options):
    """An older checkpoint without e.g. 'maximize' or 'amsgrad' loads with the class's defaults for them (what it
    ran with: PyTorch's __setstate__ sets them so, whatever the new optimizer was built with)."""
    arrays = initial_arrays()
    fp, tp = frost_params(arrays), torch_params(arrays)
    fopt, topt = fcls(fp, **options), tcls(tp, foreach=False, **options)
    train(fopt, topt, fp, tp, range(5))
    fsd, tsd = fopt.state_dict(), topt.state_dict()
    for sd in (fsd, tsd):
        for option in ("maximize", "amsgrad", "nesterov"):
            sd["param_groups"][0].pop(option, None)
    fopt2, topt2 = fcls(fp, **options), tcls(tp, foreach=False, **options)
    fopt2.load_state_dict(fsd)
    topt2.load_state_dict(tsd)
    for option in ("maximize", "amsgrad", "nesterov"):
        assert fopt2.param_groups[0].get(option) == topt2.param_groups[0].get(option)
    train(fopt2, topt2, fp, tp, range(5, 15))
    assert_params_close(fp, tp)


@pytest.mark.parametrize("make,match", [
    (lambda p: SGD(p, lr=None), r"^SGD: lr must be a number, got None$"),
    (lambda p: AdamW(p, betas=0.9), r"^AdamW: betas must be two numbers in \[0, 1\), got 0.9$"),
    (lambda p: AdamW(p, betas=(0.9, "0.99")), r"^AdamW: betas must be two numbers in \[0, 1\), got \(0.9, '0.99'\)$"),
    (lambda p: frost.optim.Adafactor(p, eps=(None, 1e-3)), r"^Adafactor: eps must be numbers, got \(None, 0.001\)$"),
    (lambda p: AdamW(p, lr="1e-3", eps=-1.0), r"^AdamW: lr must be a number, got '1e-3'; eps \(-1.0\) must be >= 0$")])
def test_options_of_the_wrong_type_are_named(make, match):
    with pytest.raises(ValueError, match=match):
        make([frost.zeros(3, requires_grad=True)])


def test_zero_grad():
    a, b = frost.ones(2, requires_grad=True), frost.ones(3, requires_grad=True)
    opt = SGD([a, b], lr=0.1)
    a.grad = frost.ones(2)
    opt.zero_grad(set_to_none=False)
    assert b.grad is None
    np.testing.assert_array_equal(a.grad.numpy(), [0.0, 0.0])
    opt.zero_grad()
    assert a.grad is None


def test_step_with_closure_on_a_real_model_matches_torch():
    """A tiny two-layer model whose gradients come from frost's autograd, stepped through a closure."""
    rng = np.random.default_rng(3)
    w1, w2, x = rng.standard_normal((4, 8)), rng.standard_normal((8, 1)), rng.standard_normal((16, 4))
    fw = [frost.Tensor(w1.copy(), requires_grad=True), frost.Tensor(w2.copy(), requires_grad=True)]
    tw = [torch.tensor(w1, requires_grad=True), torch.tensor(w2, requires_grad=True)]
    fx, tx = frost.Tensor(x), torch.tensor(x)
    fopt = AdamW(fw, lr=0.05, weight_decay=0.1)
    topt = torch.optim.AdamW(tw, lr=0.05, weight_decay=0.1, foreach=False)

    def floss():
        fopt.zero_grad()
        loss = ((fx @ fw[0]).tanh() @ fw[1]).square().mean()
        loss.backward()
        return loss

    def tloss():
        topt.zero_grad()
        loss = ((tx @ tw[0]).tanh() @ tw[1]).square().mean()
        loss.backward()
        return loss

    losses = []
    for _ in range(15):
        fl, tl = fopt.step(floss), topt.step(tloss)
        np.testing.assert_allclose(fl.item(), tl.item(), rtol=1e-10)
        losses.append(fl.item())
    assert losses[-1] < 0.5 * losses[0]
    for a, b in zip(fw, tw):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_a_plain_number_step_is_loaded_as_a_float32_counter():
    fp = frost_params(initial_arrays())
    opt = Adam(fp[:1], lr=0.1)
    state = {"step": 4, "exp_avg": frost.zeros(4, 3, dtype="float64"), "exp_avg_sq": frost.zeros(4, 3, dtype="float64")}
    opt.load_state_dict({"state": {0: state}, "param_groups": [{**opt.defaults, "params": [0]}]})
    fp[0].grad = frost.ones_like(fp[0])
    opt.step()
    assert opt.state[fp[0]]["step"].dtype == frost.float32 and opt.state[fp[0]]["step"].item() == 5.0


@pytest.mark.cuda
@pytest.mark.parametrize("fcls, tcls, options", OPTIMIZERS, ids=IDS)
def test_cuda_parameters_follow_the_cpu_run(fcls, tcls, options):
    arrays = initial_arrays()
    cpu = frost_params(arrays)
    gpu = [frost.Tensor(a.copy()).cuda().requires_grad_() for a in arrays]
    copt, gopt = fcls(cpu, **options), fcls(gpu, **options)
    for step in range(20):
        set_frost_grads(step, cpu)
        for p, c in zip(gpu, cpu):
            p.grad = None if c.grad is None else frost.Tensor(c.grad.numpy()).cuda()
        copt.step()
        gopt.step()
    for c, g in zip(cpu, gpu):
        assert g.device.type == "cuda"
        np.testing.assert_allclose(g.detach().numpy(), c.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_update_rule_gets_the_state_in_order_the_step_and_the_kernel_options_by_name():
    calls = []

    def rule(p, g, first, second, *, step, lr, betas):
        calls.append((first.shape, None if second is None else second.shape, step, lr, betas))
        p -= lr * g

    class Recorded(frost.optim.Optimizer):
        state_names = ("first", "second")
        update_rule = staticmethod(rule)
        flat_hyper = ("lr", "betas")
        state_layout = staticmethod(lambda p: [("first", p.shape), ("second", (1,)) if p.ndim else None])

    w, b = frost.Tensor(np.ones((2, 3)), requires_grad=True), frost.Tensor(np.array(2.0), requires_grad=True)
    opt = Recorded([w, b], dict(lr=0.5, betas=(0.9, 0.99), unused=1))
    for _ in range(2):
        w.grad, b.grad = frost.Tensor(np.ones((2, 3))), frost.Tensor(np.array(1.0))
        opt.step()
    assert calls == [((2, 3), (1,), 1.0, 0.5, (0.9, 0.99)), ((), None, 1.0, 0.5, (0.9, 0.99)),
                     ((2, 3), (1,), 2.0, 0.5, (0.9, 0.99)), ((), None, 2.0, 0.5, (0.9, 0.99))]
    np.testing.assert_array_equal(w.detach().numpy(), np.zeros((2, 3)))
    assert sorted(opt.state[b]) == ["first", "step"] and float(opt.state[b]["step"].item()) == 2


def test_an_optimizer_without_a_rule_says_so():
    class Ruleless(frost.optim.Optimizer):
        pass

    w = frost.Tensor(np.ones(2), requires_grad=True)
    w.grad = frost.Tensor(np.ones(2))
    with pytest.raises(NotImplementedError, match="Ruleless has neither an update_rule nor an _update"):
        Ruleless([w], dict(lr=0.1)).step()


# ---------------------------------------------------------------- load_state_dict checks all before it changes anything
def _trained(make, steps: int = 3):
    params = frost_params(initial_arrays())
    opt = make(params)
    for step in range(1, steps + 1):  # from step 1: every parameter gets a gradient, so every one has state
        set_frost_grads(step, params)
        opt.step()
    return opt, params


def _snapshot(opt) -> tuple:
    state = {id(p): {k: (v.numpy().copy() if isinstance(v, frost.Tensor) else v) for k, v in s.items()}
             for p, s in opt.state.items()}
    return state, [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]


def _assert_unchanged(opt, before) -> None:
    state, groups = _snapshot(opt)
    assert groups == before[1] and state.keys() == before[0].keys()
    for key, values in state.items():
        assert values.keys() == before[0][key].keys()
        for name, value in values.items():
            np.testing.assert_array_equal(value, before[0][key][name])


def _edited(sd: dict, index: int, key: str, value) -> dict:
    """A copy of a state dict whose parameter `index` has state `key` = value (None: removed)."""
    state = {i: dict(s) for i, s in sd["state"].items()}
    if value is None:
        del state[index][key]
    else:
        state[index][key] = value
    return {"state": state, "param_groups": [dict(g) for g in sd["param_groups"]]}


# (optimizer, the parameter index (in SHAPES), the state name, a bad tensor, what the error says): each was loaded
# without a word before, and the next step() failed (or computed nonsense) far from the cause
BROKEN_STATE = [
    (lambda p: AdamW(p, lr=0.1), 0, "exp_avg", frost.zeros(1, 3, dtype="float64"),
     r"parameter 0 \(param 0.0, index 0 in the state dict\): state 'exp_avg' has shape \(1, 3\), expected \(4, 3\)"),
    (lambda p: AdamW(p, lr=0.1), 4, "exp_avg_sq", frost.zeros((), dtype="float64"),
     r"state 'exp_avg_sq' has shape \(\), expected \(5,\)"),
    (lambda p: AdamW(p, lr=0.1), 1, "exp_avg", frost.zeros(3, dtype="int64"),
     r"state 'exp_avg' has dtype int64, expected a floating-point dtype \(the parameter is float64\)"),
    (lambda p: SGD(p, lr=0.1, momentum=0.9), 0, "momentum_buffer", frost.zeros((), dtype="float64"),
     r"state 'momentum_buffer' has shape \(\), expected \(4, 3\)"),
    (lambda p: SGD(p, lr=0.1, momentum=0.9), 3, "momentum_buffer", frost.zeros(2, 1, 3, dtype="float64"),
     r"state 'momentum_buffer' has shape \(2, 1, 3\), expected \(2, 2, 3\)"),
    (lambda p: Adafactor(p), 0, "row_var", frost.zeros(4, 3, dtype="float64"),
     r"state 'row_var' has shape \(4, 3\), expected \(4, 1\)"),
    (lambda p: Adafactor(p), 3, "col_var", frost.zeros(2, 2, 1, dtype="float64"),
     r"state 'col_var' has shape \(2, 2, 1\), expected \(2, 1, 3\)"),
    (lambda p: Adafactor(p), 1, "variance", frost.zeros(1, 3, dtype="float64"),
     r"state 'variance' has shape \(1, 3\), expected \(3,\)"),
    (lambda p: AdamW(p, lr=0.1), 2, "step", frost.zeros(3),
     r"state 'step' must be one number >= 0"),
    (lambda p: Adafactor(p), 4, "variance", None,
     r"parameter 2 \(param 1.2, index 4 in the state dict\): its state lacks 'variance' \(Adafactor keeps "
     r"\['step', 'variance'\] for it\)"),
]


@pytest.mark.parametrize("make, index, key, bad, match", BROKEN_STATE,
                         ids=[f"{i}-{key}" for i, (_, _, key, _, _) in enumerate(BROKEN_STATE)])
def test_load_state_dict_refuses_broken_state_and_changes_nothing(make, index, key, bad, match):
    two_groups = lambda p: make([{"params": p[:2]}, {"params": p[2:]}])  # noqa: E731
    opt, params = _trained(two_groups)
    sd = opt.state_dict()
    group = 0 if index < 2 else 1
    target, _ = _trained(two_groups, steps=1)
    before = _snapshot(target)
    with pytest.raises(ValueError, match=rf"load_state_dict: parameter group {group}, .*" + match):
        target.load_state_dict(_edited(sd, index, key, bad))
    _assert_unchanged(target, before)
    target.load_state_dict(sd)  # the unbroken state dict loads, and the step after it runs
    set_frost_grads(4, params)
    target.step()


@pytest.mark.parametrize("edit, match", [
    (lambda g: g.pop("params"), r"parameter group 1 of the state dict needs a 'params' list of parameter indices"),
    (lambda g: g.update(params="2, 3, 4"), r"parameter group 1: 'params' must be a list of parameter indices"),
    (lambda g: g.update(params=[2, 3, 0]), r"parameter index 0 is listed twice \(parameter group 0 and group 1\)"),
    (lambda g: g.update(lr="0.1"), r"parameter group 1: option 'lr' must be a number, got '0.1'"),
    (lambda g: g.update(betas=(0.9,)), r"parameter group 1: option 'betas' must be 2 numbers, got \(0.9,\)"),
    (lambda g: g.update(amsgrad=1.0), r"parameter group 1: option 'amsgrad' must be True or False, got 1.0"),
], ids=["no-params", "params-not-a-list", "index-twice", "lr-a-string", "betas-one-number", "amsgrad-a-number"])
def test_load_state_dict_checks_every_group_before_changing_anything(edit, match):
    opt, _ = _trained(lambda p: AdamW([{"params": p[:2]}, {"params": p[2:]}], lr=0.1))
    sd = opt.state_dict()
    sd = {"state": sd["state"], "param_groups": [dict(g) for g in sd["param_groups"]]}
    edit(sd["param_groups"][1])
    target, _ = _trained(lambda p: AdamW([{"params": p[:2]}, {"params": p[2:]}], lr=0.3), steps=1)
    before = _snapshot(target)
    with pytest.raises(ValueError, match=match):
        target.load_state_dict(sd)
    _assert_unchanged(target, before)


def test_load_state_dict_keeps_accepting_what_torch_and_older_checkpoints_hold():
    """Unknown options (torch's foreach, fused, ...) pass, a plain-number step too, and factored state loads."""
    opt, params = _trained(lambda p: Adafactor(p))
    sd = opt.state_dict()
    sd["param_groups"][0].update(foreach=None, differentiable=False)
    sd["state"][0]["step"] = 3
    other = Adafactor(params)
    other.load_state_dict(sd)
    assert other.state[params[0]]["row_var"].shape == (4, 1) and other.state[params[0]]["step"].item() == 3.0
