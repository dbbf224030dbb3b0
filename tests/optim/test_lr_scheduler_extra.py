"""ExponentialLR, MultiStepLR, ConstantLR, PolynomialLR, CosineAnnealingWarmRestarts, CyclicLR and ReduceLROnPlateau
against torch.optim.lr_scheduler: the lr (and momentum) after every step, state dict round trips, bad options."""
import copy
import warnings

import numpy as np
import pytest

import frost
from frost.optim import SGD, Adam, lr_scheduler

torch = pytest.importorskip("torch")

LRS = (0.1, 0.03)  # two param groups with different base lrs
STEPS = 60


def optimizers(fcls=SGD, tcls=None, **options):
    """The same two-group optimizer in frost and torch (torch.optim.SGD unless tcls is given)."""
    tcls = tcls or torch.optim.SGD
    fparams = [frost.zeros(2, requires_grad=True), frost.zeros(3, requires_grad=True)]
    tparams = [torch.zeros(2, requires_grad=True), torch.zeros(3, requires_grad=True)]
    fopt = fcls([{"params": [fparams[0]], "lr": LRS[0]}, {"params": [fparams[1]], "lr": LRS[1]}], **options)
    topt = tcls([{"params": [tparams[0]], "lr": LRS[0]}, {"params": [tparams[1]], "lr": LRS[1]}], **options)
    return fopt, topt


def momentum_of(group: dict, key: str) -> float:
    return group["betas"][0] if key == "betas" else group[key]


def assert_same_groups(fopt, topt, where: str, momentum_key: str | None = None) -> None:
    np.testing.assert_allclose([g["lr"] for g in fopt.param_groups], [g["lr"] for g in topt.param_groups],
                               rtol=1e-13, atol=0, err_msg=where)
    if momentum_key:
        np.testing.assert_allclose([momentum_of(g, momentum_key) for g in fopt.param_groups],
                                   [momentum_of(g, momentum_key) for g in topt.param_groups], rtol=1e-13,
                                   err_msg=where)


def run(fopt, topt, fsched, tsched, steps: range, momentum_key: str | None = None, metric=None) -> None:
    """optimizer.step() then scheduler.step() (with metric(step) for ReduceLROnPlateau), comparing get_last_lr and
    every group's lr (and momentum) after each step; torch's warnings (step order) are silenced."""
    for step in steps:
        fopt.step(), topt.step()
        args = () if metric is None else (metric(step),)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fsched.step(*args), tsched.step(*args)
        np.testing.assert_allclose(fsched.get_last_lr(), tsched.get_last_lr(), rtol=1e-13, atol=0,
                                   err_msg=f"step {step}")
        assert_same_groups(fopt, topt, f"step {step}", momentum_key)


def check_sequence_and_resume(make_f, make_t, fcls=SGD, tcls=None, momentum_key=None, metric=None, **options):
    """STEPS steps against torch; then a fresh frost optimizer and scheduler resumed at step 25 from the state
    dicts (deep-copied, as if saved) must follow torch's straight run to the end."""
    fopt, topt = optimizers(fcls, tcls, **options)
    fsched, tsched = make_f(fopt), make_t(topt)
    assert_same_groups(fopt, topt, "built", momentum_key)
    np.testing.assert_allclose(fsched.get_last_lr(), tsched.get_last_lr(), rtol=1e-13, atol=0)
    run(fopt, topt, fsched, tsched, range(1, 26), momentum_key, metric)
    saved_opt, saved_sched = copy.deepcopy(fopt.state_dict()), copy.deepcopy(fsched.state_dict())
    resumed_opt, _ = optimizers(fcls, tcls, **options)
    resumed = make_f(resumed_opt)  # built first, as PyTorch advises: its construction step is then overwritten
    resumed_opt.load_state_dict(saved_opt)
    resumed.load_state_dict(saved_sched)
    run(resumed_opt, topt, resumed, tsched, range(26, STEPS + 1), momentum_key, metric)


def test_exponential_lr():
    check_sequence_and_resume(lambda o: lr_scheduler.ExponentialLR(o, 0.93),
                              lambda o: torch.optim.lr_scheduler.ExponentialLR(o, 0.93))


@pytest.mark.parametrize("milestones", [[5, 12, 30], [30, 12, 12, 5, 44]])
def test_multi_step_lr_with_unsorted_and_repeated_milestones(milestones):
    check_sequence_and_resume(lambda o: lr_scheduler.MultiStepLR(o, milestones, gamma=0.5),
                              lambda o: torch.optim.lr_scheduler.MultiStepLR(o, milestones, gamma=0.5))


@pytest.mark.parametrize("factor,total", [(0.25, 10), (1.0 / 3, 5), (0.5, 0)])
def test_constant_lr(factor, total):
    check_sequence_and_resume(lambda o: lr_scheduler.ConstantLR(o, factor, total),
                              lambda o: torch.optim.lr_scheduler.ConstantLR(o, factor, total))


@pytest.mark.parametrize("total,power", [(40, 2.0), (30, 0.5), (80, 1.0)])
def test_polynomial_lr_including_past_total_iters(total, power):
    check_sequence_and_resume(lambda o: lr_scheduler.PolynomialLR(o, total, power),
                              lambda o: torch.optim.lr_scheduler.PolynomialLR(o, total, power))


@pytest.mark.parametrize("t_0,t_mult,eta_min", [(7, 1, 0.0), (5, 2, 1e-3), (3, 3, 0.0)])
def test_cosine_annealing_warm_restarts(t_0, t_mult, eta_min):
    check_sequence_and_resume(lambda o: lr_scheduler.CosineAnnealingWarmRestarts(o, t_0, t_mult, eta_min),
                              lambda o: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(o, t_0, t_mult, eta_min))


@pytest.mark.parametrize("t_mult", [1, 2])
def test_cosine_annealing_warm_restarts_fractional_epochs(t_mult):
    fopt, topt = optimizers()
    fsched = lr_scheduler.CosineAnnealingWarmRestarts(fopt, 4, t_mult, 1e-3)
    tsched = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(topt, 4, t_mult, 1e-3)
    for epoch in np.arange(0, 30, 0.35):  # step(epoch + i / iters) within epochs, SGDR's usage
        fsched.step(float(epoch)), tsched.step(float(epoch))
        assert_same_groups(fopt, topt, f"epoch {epoch}")
        assert fsched.last_epoch == tsched.last_epoch


@pytest.mark.parametrize("mode,extra", [("triangular", {}), ("triangular2", {}),
                                        ("exp_range", {"gamma": 0.97}), ("triangular", {"step_size_down": 9})])
def test_cyclic_lr_with_sgd_momentum(mode, extra):
    options = dict(base_lr=[0.01, 0.002], max_lr=[0.1, 0.03], step_size_up=5, mode=mode, **extra)
    check_sequence_and_resume(lambda o: lr_scheduler.CyclicLR(o, **options),
                              lambda o: torch.optim.lr_scheduler.CyclicLR(o, **options),
                              momentum_key="momentum", momentum=0.9)


def test_cyclic_lr_with_adam_beta1_and_a_scale_fn_per_iteration():
    def scale(x):
        return 1 / (1 + 0.05 * x)
    options = dict(base_lr=0.001, max_lr=0.01, step_size_up=4, step_size_down=6, scale_fn=scale,
                   scale_mode="iterations", base_momentum=0.8, max_momentum=0.95)
    check_sequence_and_resume(lambda o: lr_scheduler.CyclicLR(o, **options),
                              lambda o: torch.optim.lr_scheduler.CyclicLR(o, **options),
                              fcls=Adam, tcls=torch.optim.Adam, momentum_key="betas")


def test_cyclic_lr_without_momentum_cycling_leaves_momentum():
    options = dict(base_lr=0.01, max_lr=0.1, step_size_up=3, cycle_momentum=False)
    check_sequence_and_resume(lambda o: lr_scheduler.CyclicLR(o, **options),
                              lambda o: torch.optim.lr_scheduler.CyclicLR(o, **options), momentum=0.5,
                              momentum_key="momentum")


def noisy_loss(step: int) -> float:
    """A loss that falls, then plateaus with noise, then falls again: reductions, cooldowns and new bests."""
    rng = np.random.default_rng(step)
    return float(max(1.0 - 0.05 * step, 0.2) + (0.1 if 20 < step < 45 else 0.0) * rng.standard_normal()
                 - (0.01 * (step - 45) if step > 45 else 0.0))


@pytest.mark.parametrize("options", [dict(), dict(patience=3, factor=0.5, cooldown=2),
                                     dict(patience=2, threshold=0.05, threshold_mode="abs", min_lr=[0.01, 0.005]),
                                     dict(mode="max", patience=1, factor=0.3, min_lr=0.004)])
def test_reduce_lr_on_plateau(options):
    sign = -1.0 if options.get("mode") == "max" else 1.0
    check_sequence_and_resume(lambda o: lr_scheduler.ReduceLROnPlateau(o, **options),
                              lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o, **options),
                              metric=lambda step: sign * noisy_loss(step))


def test_reduce_lr_on_plateau_takes_a_0d_tensor_and_counts_bad_steps():
    fopt, _ = optimizers()
    sched = lr_scheduler.ReduceLROnPlateau(fopt, patience=2, factor=0.5)
    for value in (1.0, 1.0, 1.0):
        sched.step(frost.tensor(value))
    assert sched.num_bad_epochs == 2 and sched.get_last_lr() == list(LRS)
    sched.step(frost.tensor(1.0))
    assert sched.get_last_lr() == [LRS[0] * 0.5, LRS[1] * 0.5] and sched.num_bad_epochs == 0


@pytest.mark.parametrize("name,args,epochs", [("ExponentialLR", (0.9,), [3, 17, 4]),
                                              ("MultiStepLR", ([4, 9, 9], 0.5), [3, 9, 12, 2]),
                                              ("ConstantLR", (0.2, 6), [2, 6, 9, 1]),
                                              ("PolynomialLR", (10, 2.0), [4, 10, 15, 2])])
def test_step_with_an_epoch_uses_the_closed_form(name, args, epochs):
    fopt, topt = optimizers()
    fsched, tsched = getattr(lr_scheduler, name)(fopt, *args), getattr(torch.optim.lr_scheduler, name)(topt, *args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for epoch in epochs:
            fsched.step(epoch), tsched.step(epoch)
            assert_same_groups(fopt, topt, f"epoch {epoch}")


def test_chained_with_each_other_as_in_pytorch():
    fopt, topt = optimizers()
    fsched = lr_scheduler.ChainedScheduler([lr_scheduler.ConstantLR(fopt, 0.5, 4),
                                            lr_scheduler.ExponentialLR(fopt, 0.95),
                                            lr_scheduler.MultiStepLR(fopt, [10, 20])])
    tsched = torch.optim.lr_scheduler.ChainedScheduler([torch.optim.lr_scheduler.ConstantLR(topt, 0.5, 4),
                                                        torch.optim.lr_scheduler.ExponentialLR(topt, 0.95),
                                                        torch.optim.lr_scheduler.MultiStepLR(topt, [10, 20])])
    run(fopt, topt, fsched, tsched, range(1, STEPS + 1))


@pytest.mark.parametrize("make,match", [
    (lambda o: lr_scheduler.ExponentialLR(o, 0.0), r"ExponentialLR: gamma must be a number > 0, got 0.0"),
    (lambda o: lr_scheduler.MultiStepLR(o, [2.5]), r"MultiStepLR: milestones must be step numbers"),
    (lambda o: lr_scheduler.ConstantLR(o, 1.5), r"ConstantLR: factor must be in \(0, 1\], got 1.5"),
    (lambda o: lr_scheduler.ConstantLR(o, 0.5, -1), r"ConstantLR: total_iters must be an int >= 0, got -1"),
    (lambda o: lr_scheduler.PolynomialLR(o, 0), r"PolynomialLR: total_iters must be an int >= 1, got 0"),
    (lambda o: lr_scheduler.CosineAnnealingWarmRestarts(o, 0), r"CosineAnnealingWarmRestarts: T_0 must be"),
    (lambda o: lr_scheduler.CosineAnnealingWarmRestarts(o, 5, 0), r"CosineAnnealingWarmRestarts: T_mult must be"),
    (lambda o: lr_scheduler.CyclicLR(o, 0.01, 0.1, mode="sine"), r"CyclicLR: mode must be .*'sine'"),
    (lambda o: lr_scheduler.CyclicLR(o, 0.01, 0.1, step_size_up=0), r"CyclicLR: step_size_up must be .*got 0"),
    (lambda o: lr_scheduler.CyclicLR(o, [0.01], 0.1), r"CyclicLR: got 1 values of base_lr for 2 param groups"),
    (lambda o: lr_scheduler.ReduceLROnPlateau(o, factor=1.0), r"ReduceLROnPlateau: factor must be < 1.0"),
    (lambda o: lr_scheduler.ReduceLROnPlateau(o, mode="lowest"), r"ReduceLROnPlateau: mode must be"),
    (lambda o: lr_scheduler.ReduceLROnPlateau(o, threshold_mode="pct"), r"ReduceLROnPlateau: threshold_mode"),
    (lambda o: lr_scheduler.ReduceLROnPlateau(o, min_lr=[0.1]), r"ReduceLROnPlateau: got 1 values of min_lr"),
])
def test_bad_options_name_the_scheduler(make, match):
    fopt, _ = optimizers()
    with pytest.raises(ValueError, match=match):
        make(fopt)


def test_cyclic_lr_momentum_needs_an_optimizer_with_momentum():
    p = frost.zeros(2, requires_grad=True)
    with pytest.raises(ValueError, match="CyclicLR: cycle_momentum needs an optimizer with 'momentum' or 'betas'"):
        lr_scheduler.CyclicLR(frost.optim.Adafactor([p]), 0.01, 0.1)
    lr_scheduler.CyclicLR(frost.optim.Adafactor([p]), 0.01, 0.1, cycle_momentum=False)


def test_a_group_added_later_is_named_in_the_error():
    fopt, _ = optimizers()
    sched = lr_scheduler.CosineAnnealingWarmRestarts(fopt, 5)
    fopt.add_param_group({"params": [frost.zeros(1, requires_grad=True)], "lr": 0.5})
    with pytest.raises(ValueError, match="CosineAnnealingWarmRestarts: the optimizer has 3 param groups"):
        sched.step()
