"""Learning-rate schedules against torch.optim.lr_scheduler: the lr (and momentum) sequence, step by step."""
import importlib
import math
import warnings

import numpy as np
import pytest
import torch

import frost
from frost.optim import SGD, Adam, lr_scheduler

LRS = (0.1, 0.03)  # two param groups with different base lrs


def optimizers(fcls=SGD, tcls=torch.optim.SGD, **options):
    fparams = [frost.zeros(2, requires_grad=True), frost.zeros(3, requires_grad=True)]
    tparams = [torch.zeros(2, requires_grad=True), torch.zeros(3, requires_grad=True)]
    fopt = fcls([{"params": [fparams[0]], "lr": LRS[0]}, {"params": [fparams[1]], "lr": LRS[1]}], **options)
    topt = tcls([{"params": [tparams[0]], "lr": LRS[0]}, {"params": [tparams[1]], "lr": LRS[1]}], **options)
    return fopt, topt


def run(fopt, topt, fsched, tsched, steps: int, momentum_key: str | None = None, between=None):
    """Step both schedulers (each a scheduler or a list stepped in order); compare get_last_lr and every group's lr
    (and momentum/beta1) after each step. The formulas are PyTorch's own, so float64 agrees to the last bits.
    `between(step, fopt)` (and then for topt) may change the groups before a step."""
    fscheds, tscheds = (s if isinstance(s, list) else [s] for s in (fsched, tsched))
    for step in range(steps + 1):
        if step:
            fopt.step(), topt.step()
            for opt in (fopt, topt):
                between and between(step, opt)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for f, t in zip(fscheds, tscheds):
                    f.step(), t.step()
        for f, t in zip(fscheds, tscheds):
            np.testing.assert_allclose(f.get_last_lr(), t.get_last_lr(), rtol=1e-15, atol=0, err_msg=f"step {step}")
        np.testing.assert_allclose([g["lr"] for g in fopt.param_groups], [g["lr"] for g in topt.param_groups],
                                   rtol=1e-15, atol=0, err_msg=f"step {step}")
        if momentum_key == "momentum":
            np.testing.assert_allclose([g["momentum"] for g in fopt.param_groups],
                                       [g["momentum"] for g in topt.param_groups], rtol=1e-12, err_msg=f"step {step}")
        if momentum_key == "betas":
            assert [g["betas"][1] for g in fopt.param_groups] == [g["betas"][1] for g in topt.param_groups]
            np.testing.assert_allclose([g["betas"][0] for g in fopt.param_groups],
                                       [g["betas"][0] for g in topt.param_groups], rtol=1e-12, err_msg=f"step {step}")


def test_step_lr():
    fopt, topt = optimizers()
    run(fopt, topt, lr_scheduler.StepLR(fopt, 7, gamma=0.5), torch.optim.lr_scheduler.StepLR(topt, 7, gamma=0.5), 40)


@pytest.mark.parametrize("eta_min", [0.0, 1e-3])
def test_cosine_annealing_lr_including_past_t_max(eta_min):
    fopt, topt = optimizers()
    run(fopt, topt, lr_scheduler.CosineAnnealingLR(fopt, 20, eta_min=eta_min),
        torch.optim.lr_scheduler.CosineAnnealingLR(topt, 20, eta_min=eta_min), 50)


@pytest.mark.parametrize("start, end, total", [(1 / 3, 1.0, 5), (0.1, 1.0, 10), (1.0, 0.05, 8)])
def test_linear_lr(start, end, total):
    fopt, topt = optimizers()
    run(fopt, topt, lr_scheduler.LinearLR(fopt, start, end, total), torch.optim.lr_scheduler.LinearLR(topt, start, end,
                                                                                                  total), 20)


def test_linear_warmup_is_linear_lr_from_one_over_warmup():
    fopt, topt = optimizers()
    fsched = lr_scheduler.LinearWarmup(fopt, 8)
    run(fopt, topt, fsched, torch.optim.lr_scheduler.LinearLR(topt, 1 / 8, 1.0, 7), 15)
    assert fsched.get_last_lr() == list(LRS)


def test_lambda_lr_one_function_and_one_per_group():
    fopt, topt = optimizers()
    run(fopt, topt, lr_scheduler.LambdaLR(fopt, lambda s: 0.95 ** s),
        torch.optim.lr_scheduler.LambdaLR(topt, lambda s: 0.95 ** s), 20)
    fopt, topt = optimizers()
    fns = [lambda s: 1 / (s + 1), lambda s: min(1.0, (s + 1) / 5)]
    run(fopt, topt, lr_scheduler.LambdaLR(fopt, fns), torch.optim.lr_scheduler.LambdaLR(topt, fns), 20)


def test_sequential_lr_warmup_then_cosine():
    fopt, topt = optimizers()
    fsched = lr_scheduler.SequentialLR(fopt, [lr_scheduler.LinearLR(fopt, 0.1, 1.0, 5),
                                          lr_scheduler.CosineAnnealingLR(fopt, 25, eta_min=1e-4)], milestones=[5])
    tsched = torch.optim.lr_scheduler.SequentialLR(topt, [torch.optim.lr_scheduler.LinearLR(topt, 0.1, 1.0, 5),
                                                          torch.optim.lr_scheduler.CosineAnnealingLR(topt, 25, 1e-4)],
                                                   milestones=[5])
    run(fopt, topt, fsched, tsched, 30)


def test_sequential_lr_three_phases():
    fopt, topt = optimizers()
    f = lr_scheduler
    fsched = f.SequentialLR(fopt, [f.LinearLR(fopt, 0.2, 1.0, 4), f.StepLR(fopt, 3, 0.5),
                                   f.CosineAnnealingLR(fopt, 10)], milestones=[4, 12])
    t = torch.optim.lr_scheduler
    tsched = t.SequentialLR(topt, [t.LinearLR(topt, 0.2, 1.0, 4), t.StepLR(topt, 3, 0.5),
                                   t.CosineAnnealingLR(topt, 10)], milestones=[4, 12])
    run(fopt, topt, fsched, tsched, 22)


@pytest.mark.parametrize("options", [dict(), dict(anneal_strategy="linear"), dict(three_phase=True),
                                     dict(pct_start=0.25, div_factor=10.0, final_div_factor=100.0, three_phase=True),
                                     dict(cycle_momentum=False)])
def test_one_cycle_lr_with_sgd_momentum(options):
    fopt, topt = optimizers(momentum=0.9)
    run(fopt, topt, lr_scheduler.OneCycleLR(fopt, [1.0, 0.5], total_steps=40, **options),
        torch.optim.lr_scheduler.OneCycleLR(topt, [1.0, 0.5], total_steps=40, **options), 40,
        momentum_key="momentum")


def test_one_cycle_lr_cycles_adam_beta1():
    fopt, topt = optimizers(Adam, torch.optim.Adam, betas=(0.9, 0.99))
    run(fopt, topt, lr_scheduler.OneCycleLR(fopt, 0.01, epochs=3, steps_per_epoch=10, max_momentum=0.93),
        torch.optim.lr_scheduler.OneCycleLR(topt, 0.01, epochs=3, steps_per_epoch=10, max_momentum=0.93), 30,
        momentum_key="betas")


def test_one_cycle_lr_errors():
    fopt, _ = optimizers()
    sched = lr_scheduler.OneCycleLR(fopt, 0.1, total_steps=3)
    for _ in range(3):
        sched.step()
    with pytest.raises(ValueError, match="stepped 4 times but total_steps is 3"):
        sched.step()
    with pytest.raises(ValueError, match="give total_steps, or epochs and steps_per_epoch"):
        lr_scheduler.OneCycleLR(fopt, 0.1)
    with pytest.raises(ValueError, match="anneal_strategy must be 'cos' or 'linear'"):
        lr_scheduler.OneCycleLR(fopt, 0.1, total_steps=10, anneal_strategy="exp")


def test_scheduler_changes_the_lr_the_optimizer_uses():
    p = frost.ones(1, requires_grad=True)
    opt = SGD([p], lr=1.0)
    sched = lr_scheduler.StepLR(opt, 1, gamma=0.5)
    for _ in range(3):
        p.grad = frost.ones(1)
        opt.step()
        sched.step()
    np.testing.assert_allclose(p.detach().numpy(), [1 - 1.0 - 0.5 - 0.25])


def test_state_dict_round_trip_continues_the_sequence(tmp_path):
    def build(opt):
        return lr_scheduler.SequentialLR(opt, [lr_scheduler.LinearWarmup(opt, 5),
                                               lr_scheduler.CosineAnnealingLR(opt, 20)], milestones=[5])

    fopt, _ = optimizers()
    sched = build(fopt)
    for _ in range(8):
        sched.step()
    frost.save({"optimizer": fopt.state_dict(), "scheduler": sched.state_dict()}, tmp_path / "s.safetensors")
    expected = []
    for _ in range(10):
        sched.step()
        expected.append(sched.get_last_lr())

    ckpt = frost.load(tmp_path / "s.safetensors")
    fopt2, _ = optimizers()
    sched2 = build(fopt2)
    fopt2.load_state_dict(ckpt["optimizer"])
    sched2.load_state_dict(ckpt["scheduler"])
    got = []
    for _ in range(10):
        sched2.step()
        got.append(sched2.get_last_lr())
    assert got == expected
    assert [g["lr"] for g in fopt2.param_groups] == expected[-1]


def test_resuming_with_last_epoch_needs_initial_lr():
    fopt, _ = optimizers()
    with pytest.raises(KeyError, match="param group 0 has no 'initial_lr' although last_epoch=5"):
        lr_scheduler.StepLR(fopt, 3, last_epoch=5)


def test_sequential_lr_checks_its_arguments():
    fopt, _ = optimizers()
    other, _ = optimizers()
    a, b = lr_scheduler.StepLR(fopt, 3), lr_scheduler.StepLR(other, 3)
    with pytest.raises(ValueError, match="2 schedulers need 1 milestones, got 0"):
        lr_scheduler.SequentialLR(fopt, [a, a], milestones=[])
    with pytest.raises(ValueError, match=r"scheduler 1 \(StepLR\) belongs to another optimizer"):
        lr_scheduler.SequentialLR(fopt, [a, b], milestones=[3])


# ---------------------------------------------------------------- PyTorch's rules: chaining, hand-set lrs, added groups

torch_lr_scheduler = torch.optim.lr_scheduler

BUILDERS = {  # the same scheduler on either module (frost.optim.lr_scheduler or torch.optim.lr_scheduler)
    "StepLR": lambda m, opt, **kw: m.StepLR(opt, 3, 0.5, **kw),
    "LinearLR": lambda m, opt, **kw: m.LinearLR(opt, 0.1, 1.0, 6, **kw),
    "CosineAnnealingLR": lambda m, opt, **kw: m.CosineAnnealingLR(opt, 7, eta_min=1e-3, **kw),
    "LambdaLR": lambda m, opt, **kw: m.LambdaLR(opt, lambda s: 0.9 ** s, **kw),
    "OneCycleLR": lambda m, opt, **kw: m.OneCycleLR(opt, [1.0, 0.5], total_steps=40, **kw),
}
CHAINABLE = ["StepLR", "LinearLR", "CosineAnnealingLR"]


@pytest.mark.parametrize("first, second", [("LinearLR", "StepLR"), ("LinearLR", "CosineAnnealingLR"),
                                           ("StepLR", "CosineAnnealingLR"), ("CosineAnnealingLR", "LambdaLR")])
def test_two_schedulers_stepped_together_compose_or_overwrite_as_in_torch(first, second):
    fopt, topt = optimizers()
    fscheds = [BUILDERS[name](lr_scheduler, fopt) for name in (first, second)]
    tscheds = [BUILDERS[name](torch_lr_scheduler, topt) for name in (first, second)]
    run(fopt, topt, fscheds, tscheds, 60)


def test_chained_scheduler_matches_torch_and_resumes_from_its_state_dict():
    def build(m, opt):
        return m.ChainedScheduler([m.LinearLR(opt, 0.1, 1.0, 6), m.StepLR(opt, 4, 0.7)], optimizer=opt)

    fopt, topt = optimizers()
    fsched, tsched = build(lr_scheduler, fopt), build(torch_lr_scheduler, topt)
    run(fopt, topt, fsched, tsched, 10)
    fopt2, _ = optimizers()
    fsched2 = build(lr_scheduler, fopt2)
    fopt2.load_state_dict(fopt.state_dict())
    fsched2.load_state_dict(fsched.state_dict())
    run(fopt2, topt, fsched2, tsched, 30)


def test_chained_scheduler_checks_its_schedulers():
    fopt, _ = optimizers()
    other, _ = optimizers()
    with pytest.raises(ValueError, match="ChainedScheduler: expects at least one scheduler"):
        lr_scheduler.ChainedScheduler([])
    with pytest.raises(ValueError, match=r"ChainedScheduler: scheduler 1 \(StepLR\) belongs to another optimizer"):
        lr_scheduler.ChainedScheduler([lr_scheduler.StepLR(fopt, 2), lr_scheduler.StepLR(other, 2)])


@pytest.mark.parametrize("name", BUILDERS)
def test_an_lr_set_by_hand_is_scaled_on_or_overwritten_as_in_torch(name):
    def set_by_hand(step, opt):
        if step in (5, 11):
            opt.param_groups[1]["lr"] = 0.5 / step

    fopt, topt = optimizers(momentum=0.9)
    run(fopt, topt, BUILDERS[name](lr_scheduler, fopt), BUILDERS[name](torch_lr_scheduler, topt), 30,
        between=set_by_hand)


@pytest.mark.parametrize("name", [*CHAINABLE, "OneCycleLR"])
@pytest.mark.parametrize("how", ["state_dict", "last_epoch"])
def test_resuming_goes_on_as_torch_resumed_the_same_way(name, how):
    """Both sides train 13 steps and resume in fresh objects: scheduler built, then both state dicts loaded; or
    optimizer state loaded, then the scheduler built with last_epoch=12 (PyTorch takes one more step there)."""
    build = BUILDERS[name]
    fopt, topt = optimizers(momentum=0.9)
    fsched, tsched = build(lr_scheduler, fopt), build(torch_lr_scheduler, topt)
    run(fopt, topt, fsched, tsched, 13, momentum_key="momentum")
    (fopt2, topt2), resumed = optimizers(momentum=0.9), []
    for m, opt, opt2, sched in ((lr_scheduler, fopt, fopt2, fsched), (torch_lr_scheduler, topt, topt2, tsched)):
        if how == "state_dict":
            resumed.append(build(m, opt2))
            opt2.load_state_dict(opt.state_dict())
            resumed[-1].load_state_dict(sched.state_dict())
        else:
            opt2.load_state_dict(opt.state_dict())
            resumed.append(build(m, opt2, last_epoch=12))
    run(fopt2, topt2, *resumed, 20, momentum_key="momentum")


def test_step_with_an_epoch_jumps_with_the_closed_form_as_in_torch():
    for name in [*CHAINABLE, "LambdaLR"]:
        fopt, topt = optimizers()
        fsched, tsched = BUILDERS[name](lr_scheduler, fopt), BUILDERS[name](torch_lr_scheduler, topt)
        for epoch in (3, 10, 4, 0, 17):
            with pytest.warns(UserWarning, match=rf"{name}.step\(epoch\) is deprecated"):
                fsched.step(epoch)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tsched.step(epoch)
            np.testing.assert_allclose(fsched.get_last_lr(), tsched.get_last_lr(), rtol=1e-15, atol=0,
                                       err_msg=f"{name} epoch {epoch}")


def one_group_optimizers():
    return (SGD([frost.zeros(2, requires_grad=True)], lr=0.1, momentum=0.9),
            torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1, momentum=0.9))


def add_group(fopt, topt):
    fopt.add_param_group({"params": [frost.zeros(3, requires_grad=True)], "lr": 1.0})
    topt.add_param_group({"params": [torch.zeros(3, requires_grad=True)], "lr": 1.0})


@pytest.mark.parametrize("name", ["StepLR", "LinearLR", "LinearWarmup"])
def test_a_group_added_after_a_chainable_scheduler_is_scheduled_as_in_torch(name):
    build = {**BUILDERS, "LinearWarmup": lambda m, opt: (lr_scheduler.LinearWarmup(opt, 5) if m is lr_scheduler else
                                                         m.LinearLR(opt, 1 / 5, 1.0, 4))}[name]
    fopt, topt = one_group_optimizers()
    fsched, tsched = build(lr_scheduler, fopt), build(torch_lr_scheduler, topt)
    run(fopt, topt, fsched, tsched, 2)
    add_group(fopt, topt)
    run(fopt, topt, fsched, tsched, 20)
    assert len(fsched.get_last_lr()) == 2


@pytest.mark.parametrize("name, error, good_steps", [("LambdaLR", ValueError, 0), ("CosineAnnealingLR", ValueError, 7),
                                                     ("OneCycleLR", KeyError, 0)])
def test_a_group_added_after_a_scheduler_that_needs_its_base_lrs_fails_where_torch_fails(name, error, good_steps):
    """LambdaLR's lrs come from base lrs; CosineAnnealingLR reads them at T_max + 1 (its minimum); OneCycleLR reads
    the group's max_lr: PyTorch raises there (a strict zip, a KeyError), and so does Frost, naming itself."""
    build = {**BUILDERS, "OneCycleLR": lambda m, opt: m.OneCycleLR(opt, 1.0, total_steps=40)}[name]
    fopt, topt = one_group_optimizers()
    fsched, tsched = build(lr_scheduler, fopt), build(torch_lr_scheduler, topt)
    add_group(fopt, topt)
    run(fopt, topt, fsched, tsched, good_steps)
    with pytest.raises(error), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tsched.step()
    with pytest.raises(error, match=f"{name}: .*(added by add_param_group|added after the scheduler)"):
        fsched.step()


class Decay:
    """A stateful lr_lambda: a callable object, whose __dict__ LambdaLR's state dict keeps."""

    def __init__(self):
        self.rate = 0.5

    def __call__(self, step):
        return self.rate ** step


def test_lambda_lr_saves_and_restores_the_state_of_callable_objects_as_torch():
    scheds = []
    for m, opt in zip((lr_scheduler, torch_lr_scheduler), optimizers()):
        scheds.append(m.LambdaLR(opt, [Decay(), lambda s: 1 / (s + 1)]))
        scheds[-1].lr_lambdas[0].rate = 0.9
    fsaved, tsaved = (s.state_dict() for s in scheds)
    assert fsaved["lr_lambdas"] == tsaved["lr_lambdas"] == [{"rate": 0.9}, None]
    fopt, topt = optimizers()
    fsched, tsched = lr_scheduler.LambdaLR(fopt, [Decay(), lambda s: 1 / (s + 1)]), \
        torch_lr_scheduler.LambdaLR(topt, [Decay(), lambda s: 1 / (s + 1)])
    fsched.load_state_dict(fsaved)
    tsched.load_state_dict(tsaved)
    assert fsched.lr_lambdas[0].rate == 0.9 and "lr_lambdas" in fsaved  # restored, and the dict left whole
    run(fopt, topt, fsched, tsched, 10)


def test_sequential_lr_resets_to_initial_lr_which_a_later_one_cycle_rewrote():
    def build(m, opt):
        return m.SequentialLR(opt, [m.LinearLR(opt, 0.1, 1.0, 5), m.OneCycleLR(opt, [1.0, 0.5], total_steps=10)], [5])

    fopt, topt = optimizers(momentum=0.9)
    run(fopt, topt, build(lr_scheduler, fopt), build(torch_lr_scheduler, topt), 15, momentum_key="momentum")


@pytest.mark.parametrize("options, match", [
    (dict(total_steps=10, pct_start=1), r"pct_start must be a float in \[0, 1\], got 1$"),
    (dict(total_steps=10, pct_start=1.5), r"pct_start must be a float in \[0, 1\], got 1.5$"),
    (dict(epochs=-2, steps_per_epoch=-5), "epochs must be a positive integer, got -2$"),
    (dict(epochs=2.0, steps_per_epoch=5), "epochs must be a positive integer, got 2.0$"),
    (dict(epochs=3, steps_per_epoch=0), "steps_per_epoch must be a positive integer, got 0$"),
    (dict(total_steps=0), "total_steps must be a positive integer, got 0$")])
def test_one_cycle_lr_checks_its_lengths_and_pct_start_as_torch(options, match):
    fopt, topt = optimizers()
    with pytest.raises(ValueError):
        torch_lr_scheduler.OneCycleLR(topt, 1.0, **options)
    with pytest.raises(ValueError, match="^OneCycleLR: " + match):
        lr_scheduler.OneCycleLR(fopt, 1.0, **options)


# ---------------------------------------------------------------- pure functions


def test_cosine_function_matches_torch_closed_form_and_stays_at_min():
    fopt, topt = optimizers()
    tsched = torch.optim.lr_scheduler.CosineAnnealingLR(topt, 30, eta_min=0.001)
    for step in range(31):
        assert math.isclose(lr_scheduler.cosine(step, 30, LRS[0], 0.001), tsched.get_last_lr()[0], rel_tol=1e-10)
        topt.step()
        tsched.step()
    assert lr_scheduler.cosine(45, 30, 0.1, 0.001) == pytest.approx(0.001)
    assert lr_scheduler.cosine(0, 30, 0.1) == 0.1 and lr_scheduler.cosine(15, 30, 0.1) == pytest.approx(0.05)


def test_linear_warmup_function():
    assert [lr_scheduler.linear_warmup(s, 4, 1.0) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_warmup_cosine_on_numbers_and_arrays_agree():
    steps = np.arange(0, 60)
    scalars = [lr_scheduler.warmup_cosine(int(s), 10, 50, 0.3, 0.01) for s in steps]
    np.testing.assert_allclose(scalars[:10], [0.3 * (s + 1) / 10 for s in range(10)], rtol=1e-15)
    assert scalars[10] == pytest.approx(0.3)
    assert scalars[50] == pytest.approx(0.01) and scalars[59] == pytest.approx(0.01)
    np.testing.assert_allclose(lr_scheduler.warmup_cosine(steps, 10, 50, 0.3, 0.01), scalars, rtol=1e-14)
    np.testing.assert_allclose(lr_scheduler.cosine(steps.astype(np.float64), 50, 0.3),
                               [lr_scheduler.cosine(int(s), 50, 0.3) for s in steps], rtol=1e-14)


def test_warmup_cosine_without_one_of_its_phases_and_with_bad_lengths():
    assert lr_scheduler.warmup_cosine(4, 5, 5, 1.0, 0.1) == 1.0  # the end of the warm-up
    assert lr_scheduler.warmup_cosine(5, 5, 5, 1.0, 0.1) == lr_scheduler.warmup_cosine(9, 5, 5, 1.0, 0.1) == 0.1
    np.testing.assert_allclose(lr_scheduler.warmup_cosine(np.arange(8.0), 5, 5, 1.0, 0.1),
                               [0.2, 0.4, 0.6, 0.8, 1.0, 0.1, 0.1, 0.1])
    steps = np.arange(12.0)
    np.testing.assert_allclose(lr_scheduler.warmup_cosine(steps, 0, 10, 1.0, 0.1),
                               lr_scheduler.cosine(steps, 10, 1.0, 0.1))
    assert lr_scheduler.warmup_cosine(0, 0, 10, 1.0) == 1.0 and lr_scheduler.cosine(3, 0, 1.0, 0.25) == 0.25
    for warmup, total in ((5, 4), (-1, 10)):
        with pytest.raises(ValueError, match=f"warmup_cosine: needs 0 <= warmup <= total, got warmup={warmup}, "
                                             f"total={total}"):
            lr_scheduler.warmup_cosine(1, warmup, total, 1.0)
    with pytest.raises(ValueError, match=r"cosine: total \(-1\) must be >= 0"):
        lr_scheduler.cosine(0, -1, 1.0)


def test_lr_scheduler_is_a_module_as_torchs_and_the_old_paths_still_work():
    module = importlib.import_module("frost.optim.lr_scheduler")  # what `from frost.optim.lr_scheduler import` runs
    assert module.__name__ == "frost.optim.lr_scheduler" and module.__file__.endswith("lr_scheduler.py")
    assert importlib.import_module("frost.optim.schedule") is module is frost.optim.lr_scheduler is frost.optim.schedule
    for name in ("LRScheduler", "LambdaLR", "StepLR", "CosineAnnealingLR", "LinearLR", "SequentialLR",
                 "ChainedScheduler", "OneCycleLR"):  # every scheduler Frost has, under torch's module and names
        scheduler = getattr(module, name)
        assert scheduler.__module__ == "frost.optim.lr_scheduler" and hasattr(torch.optim.lr_scheduler, name)
    assert callable(module.cosine) and callable(module.warmup_cosine)  # the schedule functions stay there too
