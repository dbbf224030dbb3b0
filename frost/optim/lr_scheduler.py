"""Learning-rate schedules (frost.optim.lr_scheduler, as torch.optim.lr_scheduler; frost.optim.schedule is the same
module under its old name): pure functions of the step, and PyTorch-style schedulers that set group['lr'].

The schedulers follow torch.optim.lr_scheduler's rules, scheduler by scheduler, with the same formulas (so float64
sequences agree with PyTorch's to rounding, whichever way they are stepped):

- StepLR, LinearLR (and LinearWarmup, a LinearLR) and CosineAnnealingLR are chainable: each `step()` computes the
  new lr from the group's current `group['lr']` (a ratio, PyTorch's `get_lr`), so two of them stepped together
  (or a ChainedScheduler) compose, an lr set by hand is scaled on from there, and a param group added after the
  scheduler was built is scheduled too (CosineAnnealingLR refuses it at the steps that read its base lrs, as
  PyTorch does).
- ExponentialLR, MultiStepLR, ConstantLR and PolynomialLR are chainable too (PyTorch's ratios).
- LambdaLR (base_lr * lr_lambda(step)), OneCycleLR (from the groups' 'initial_lr' / 'max_lr' / 'min_lr'), CyclicLR
  (from its base_lr / max_lr) and CosineAnnealingWarmRestarts (from the base lrs) compute each lr from scratch: they
  overwrite whatever else changed the lr.
- ReduceLROnPlateau is stepped with a metric, `step(val_loss)`, and takes no construction step.
- `step(epoch)` (deprecated in PyTorch) jumps to `epoch` with the closed form from the base lrs.

Like PyTorch, a scheduler takes one step when it is built (LinearLR multiplies the lr by start_factor, StepLR and
CosineAnnealingLR keep it, LambdaLR and OneCycleLR set their lr of step 0); call `scheduler.step()` after
`optimizer.step()`. To resume, load the
optimizer's state dict (which holds the current lrs) and the scheduler's; or build the scheduler with
`last_epoch=n` on an optimizer whose groups hold 'initial_lr'. SequentialLR resets the lrs to 'initial_lr' when
built and starts each later scheduler from its closed form at its milestone. A scheduler keeps one base lr per
param group it was built with: where it needs them (LambdaLR, `step(epoch)`, a SequentialLR milestone) a group
added later makes it raise ValueError naming itself (OneCycleLR: KeyError, as the group has no 'max_lr').
"""
from __future__ import annotations

import math
import numbers
import types
import warnings
from bisect import bisect_right
from collections import Counter
from typing import Any, Callable, Sequence

from frost.optim.optimizer import Optimizer, array_module

# ---------------------------------------------------------------- pure functions (numbers or 0-d arrays)


def _cos(x):
    return math.cos(x) if isinstance(x, (int, float)) else array_module(x).cos(x)


def _minimum(x, y):
    if isinstance(x, (int, float)) and isinstance(y, (int, float)):
        return min(x, y)
    return array_module(x if not isinstance(x, (int, float)) else y).minimum(x, y)


def cosine(step, total: int, base: float, min: float = 0.0):
    """Cosine decay from `base` at step 0 to `min` at step `total` (and `min` after it; always, for total 0)."""
    if total < 0:
        raise ValueError(f"cosine: total ({total}) must be >= 0")
    t = _minimum(step, total)
    return min + (base - min) * (1 + _cos(math.pi * t / total if total > 0 else math.pi + 0 * t)) / 2


def linear_warmup(step, warmup: int, base: float):
    """base * (step + 1) / warmup for the first `warmup` steps, then base (nanoGPT's warm-up)."""
    return base * _minimum((step + 1) / warmup, 1.0)


def warmup_cosine(step, warmup: int, total: int, base: float, min: float = 0.0):
    """Linear warm-up for `warmup` steps, then cosine decay to `min` at step `total`."""
    if not 0 <= warmup <= total:
        raise ValueError(f"warmup_cosine: needs 0 <= warmup <= total, got warmup={warmup}, total={total}")
    if warmup == 0:
        return cosine(step, total, base, min)
    if isinstance(step, (int, float)):
        return linear_warmup(step, warmup, base) if step < warmup else cosine(step - warmup, total - warmup,
                                                                              base, min)
    xp = array_module(step)
    return xp.where(step < warmup, linear_warmup(step, warmup, base),
                    cosine(xp.maximum(step - warmup, 0), total - warmup, base, min))


# ---------------------------------------------------------------- schedulers


class LRScheduler:
    """Base class: `step()` advances `last_epoch` and sets every param group's lr to `get_lr()`.

    `base_lrs` are the groups' 'initial_lr' (recorded on first use, as PyTorch does); `last_epoch` counts scheduler
    steps, 0 after construction. Subclasses write `get_lr()` (the lrs at the advanced `last_epoch`, from the
    groups' current lrs where the scheduler is chainable) and, where it differs, `_get_closed_form_lr()` (from
    `base_lrs`, for `step(epoch)`).
    """

    _not_saved: tuple[str, ...] = ("optimizer",)
    _is_initial = False  # True only during the step taken at construction

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        _check_optimizer(self, optimizer)
        self.optimizer = optimizer
        for i, group in enumerate(optimizer.param_groups):
            if last_epoch == -1:
                group.setdefault("initial_lr", group["lr"])
            elif "initial_lr" not in group:
                raise KeyError(f"{type(self).__name__}: param group {i} has no 'initial_lr' although last_epoch="
                               f"{last_epoch} (resuming); load the optimizer's state dict first")
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._initial_step()

    def _initial_step(self) -> None:
        """The step taken at construction (and by SequentialLR when it restarts its first scheduler)."""
        self._step_count = 0
        self._is_initial = True
        try:
            self.step()
        finally:
            del self._is_initial  # back to the class's False; never saved in a state dict

    def get_lr(self) -> list[float]:
        """The learning rate of every param group at the (just advanced) `last_epoch`."""
        raise NotImplementedError

    def _get_closed_form_lr(self) -> list[float]:
        """The lrs at `last_epoch` from `base_lrs` alone (what `step(epoch)` sets); `get_lr` where they agree."""
        return self.get_lr()

    def step(self, epoch: int | None = None) -> None:
        """Advance one step (call it after optimizer.step()); `epoch` jumps there (closed form; deprecated)."""
        self._step_count += 1
        if epoch is not None:
            warnings.warn(f"{type(self).__name__}.step(epoch) is deprecated in PyTorch: call step() once per "
                          f"step", UserWarning, stacklevel=2)
        self._update_lr(epoch)

    def _update_lr(self, epoch: int | None = None) -> None:
        if epoch is None:
            self.last_epoch += 1
            lrs = self.get_lr()
        else:
            self.last_epoch = epoch
            lrs = self._get_closed_form_lr()
        self._set_lrs(lrs)

    def _set_lrs(self, lrs: Sequence[float]) -> None:
        groups = self.optimizer.param_groups
        if len(lrs) != len(groups):
            raise _added_group_error(self, len(lrs))
        for group, lr in zip(groups, lrs):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in groups]

    def _base_lrs_per_group(self) -> list[tuple[float, dict]]:
        """(base lr, group) pairs; ValueError for a group added after the scheduler was built (PyTorch's strict zip)."""
        groups = self.optimizer.param_groups
        if len(self.base_lrs) != len(groups):
            raise _added_group_error(self, len(self.base_lrs))
        return list(zip(self.base_lrs, groups))

    def _current_lrs(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def get_last_lr(self) -> list[float]:
        """The lr of every param group as the last step set it."""
        return list(self._last_lr)

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in self._not_saved}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.__dict__.update({k: v for k, v in state_dict.items() if k not in self._not_saved})


def _check_optimizer(scheduler, optimizer) -> None:
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"{type(scheduler).__name__}: expected a frost Optimizer, got {type(optimizer).__name__}")


def _added_group_error(scheduler: LRScheduler, known: int) -> ValueError:
    n = len(scheduler.optimizer.param_groups)
    return ValueError(f"{type(scheduler).__name__}: the optimizer has {n} param groups but the scheduler was built "
                      f"for {known} (a group added by add_param_group later has no base lr here); build the "
                      f"scheduler after adding every group")


class LambdaLR(LRScheduler):
    """lr = base_lr * lr_lambda(step); one function, or one per param group. Not chainable (as in PyTorch).

    The state dict holds `fn.__dict__` of each lr_lambda that is a callable object (a plain function is not saved).
    """

    _not_saved = ("optimizer", "lr_lambdas")

    def __init__(self, optimizer: Optimizer, lr_lambda: Callable[[int], float] | Sequence[Callable[[int], float]],
                 last_epoch: int = -1) -> None:
        n = len(optimizer.param_groups)
        if isinstance(lr_lambda, (list, tuple)):
            if len(lr_lambda) != n:
                raise ValueError(f"LambdaLR: got {len(lr_lambda)} lr_lambdas for {n} param groups")
            self.lr_lambdas = list(lr_lambda)
        else:
            self.lr_lambdas = [lr_lambda] * n
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [base * fn(self.last_epoch) for base, fn in zip(self.base_lrs, self.lr_lambdas)]

    def state_dict(self) -> dict[str, Any]:
        saved = [None if isinstance(fn, types.FunctionType) else fn.__dict__.copy() for fn in self.lr_lambdas]
        return {**super().state_dict(), "lr_lambdas": saved}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        for fn, saved in zip(self.lr_lambdas, state_dict.get("lr_lambdas", ())):
            if saved is not None:
                fn.__dict__.update(saved)


class StepLR(LRScheduler):
    """Multiplies the lr by gamma every step_size steps (chainable): base_lr * gamma ** (step // step_size)."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1) -> None:
        if step_size < 1:
            raise ValueError(f"StepLR: step_size must be >= 1, got {step_size}")
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return self._current_lrs()
        return [lr * self.gamma for lr in self._current_lrs()]

    def _get_closed_form_lr(self) -> list[float]:
        return [base * self.gamma ** (self.last_epoch // self.step_size) for base in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """eta_min + (base_lr - eta_min) * (1 + cos(pi * step / T_max)) / 2 (Loshchilov & Hutter, SGDR, 2017).

    Chainable: each step scales the distance of the current lr to eta_min by the ratio of consecutive cosine
    terms (PyTorch's recursion, with its special cases). Past T_max the cosine goes on (back up by 2 * T_max).
    """

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1) -> None:
        if T_max < 1:
            raise ValueError(f"CosineAnnealingLR: T_max must be >= 1, got {T_max}")
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        epoch, t_max, eta_min = self.last_epoch, self.T_max, self.eta_min
        if self._is_initial:
            return self._current_lrs()
        if self._step_count == 1 and epoch > 0:
            return [eta_min + (base - eta_min) * (1 + math.cos(epoch * math.pi / t_max)) / 2
                    for base, _ in self._base_lrs_per_group()]
        if (epoch - 1 - t_max) % (2 * t_max) == 0:  # the cosine's minimum: the ratio below would be 0 / 0
            return [group["lr"] + (base - eta_min) * (1 - math.cos(math.pi / t_max)) / 2
                    for base, group in self._base_lrs_per_group()]
        ratio = (1 + math.cos(math.pi * epoch / t_max)) / (1 + math.cos(math.pi * (epoch - 1) / t_max))
        return [ratio * (lr - eta_min) + eta_min for lr in self._current_lrs()]

    def _get_closed_form_lr(self) -> list[float]:
        return [self.eta_min + (base - self.eta_min) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
                for base in self.base_lrs]


class LinearLR(LRScheduler):
    """Multiplies base_lr by a factor going linearly from start_factor to end_factor over total_iters steps.

    Chainable: each step multiplies the current lr by the ratio of consecutive factors (PyTorch's form).
    """

    def __init__(self, optimizer: Optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5, last_epoch: int = -1) -> None:
        if not 0 < start_factor <= 1 or not 0 <= end_factor <= 1:
            raise ValueError(f"LinearLR: need 0 < start_factor <= 1 and 0 <= end_factor <= 1, got "
                             f"start_factor={start_factor}, end_factor={end_factor}")
        if total_iters < 0:
            raise ValueError(f"LinearLR: total_iters must be >= 0, got {total_iters}")
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch == 0:
            return [lr * self.start_factor for lr in self._current_lrs()]
        if self._is_initial or self.last_epoch > self.total_iters:
            return self._current_lrs()
        change = self.end_factor - self.start_factor
        ratio = 1.0 + change / (self.total_iters * self.start_factor + (self.last_epoch - 1) * change)
        return [lr * ratio for lr in self._current_lrs()]

    def _get_closed_form_lr(self) -> list[float]:
        done = min(self.total_iters, self.last_epoch) / self.total_iters if self.total_iters else 1.0
        factor = self.start_factor + (self.end_factor - self.start_factor) * done
        return [base * factor for base in self.base_lrs]


class LinearWarmup(LinearLR):
    """lr = base_lr * min(1, (step + 1) / warmup_steps): `linear_warmup` as a (chainable) scheduler.

    It is LinearLR(optimizer, 1 / warmup_steps, 1.0, warmup_steps - 1), the same sequence as PyTorch's.
    """

    def __init__(self, optimizer: Optimizer, warmup_steps: int, last_epoch: int = -1) -> None:
        if warmup_steps < 1:
            raise ValueError(f"LinearWarmup: warmup_steps must be >= 1, got {warmup_steps}")
        self.warmup_steps = warmup_steps
        super().__init__(optimizer, 1.0 / warmup_steps, 1.0, warmup_steps - 1, last_epoch)


class _SchedulerList(LRScheduler):
    """What SequentialLR and ChainedScheduler share: checks of their schedulers and nested state dicts."""

    _not_saved = ("optimizer", "schedulers")

    def _take(self, optimizer: Optimizer, schedulers: Sequence[LRScheduler]) -> None:
        name = type(self).__name__
        if not schedulers:
            raise ValueError(f"{name}: expects at least one scheduler")
        _check_optimizer(self, optimizer)
        for i, s in enumerate(schedulers):
            if s.optimizer is not optimizer:
                raise ValueError(f"{name}: scheduler {i} ({type(s).__name__}) belongs to another optimizer")
        self.optimizer, self.schedulers = optimizer, list(schedulers)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "schedulers": [s.state_dict() for s in self.schedulers]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        for s, saved in zip(self.schedulers, state_dict["schedulers"]):
            s.load_state_dict(saved)


class SequentialLR(_SchedulerList):
    """Run `schedulers[i]` from milestone i-1 on, as PyTorch's SequentialLR: e.g. warm-up, then cosine:
    SequentialLR(opt, [LinearWarmup(opt, 100), CosineAnnealingLR(opt, 900)], milestones=[100]).

    Built, it resets every group's lr to 'initial_lr', undoes its schedulers' construction steps and takes the
    first one's again; at a milestone the next scheduler starts from its closed form at step 0 (its base lrs).
    """

    def __init__(self, optimizer: Optimizer, schedulers: Sequence[LRScheduler], milestones: Sequence[int],
                 last_epoch: int = -1) -> None:
        self._take(optimizer, schedulers)
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(f"SequentialLR: {len(schedulers)} schedulers need {len(schedulers) - 1} milestones, "
                             f"got {len(milestones)}")
        self.milestones = list(milestones)
        self.last_epoch = last_epoch + 1
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"]
        for s in self.schedulers:
            _undo_construction_step(s)
        first = self.schedulers[bisect_right(self.milestones, 0)]
        first._initial_step()
        self._last_lr = first.get_last_lr()

    def step(self) -> None:
        self.last_epoch += 1
        i = bisect_right(self.milestones, self.last_epoch)
        scheduler = self.schedulers[i]
        if i > 0 and self.milestones[i - 1] == self.last_epoch:
            scheduler._update_lr(0)  # a new phase: its closed form at step 0, whatever the lr was
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()


def _undo_construction_step(scheduler: LRScheduler) -> None:
    if isinstance(scheduler, _SchedulerList):
        for s in scheduler.schedulers:
            _undo_construction_step(s)
    else:
        scheduler.last_epoch -= 1


class ChainedScheduler(_SchedulerList):
    """Steps several chainable schedulers at once (their effects multiply), as PyTorch's ChainedScheduler: e.g.
    ChainedScheduler([LinearLR(opt, 0.1, 1.0, 10), StepLR(opt, 30, 0.5)])."""

    def __init__(self, schedulers: Sequence[LRScheduler], optimizer: Optimizer | None = None) -> None:
        self._take(optimizer or (schedulers[0].optimizer if schedulers else None), schedulers)
        self._last_lr = self._current_lrs()

    def step(self) -> None:
        for s in self.schedulers:
            s.step()
        self._last_lr = self._current_lrs()


class OneCycleLR(LRScheduler):
    """The 1cycle policy (Smith & Topin, "Super-Convergence", 2018), as PyTorch's OneCycleLR.

    lr rises from max_lr / div_factor to max_lr over the first pct_start of total_steps, then anneals to
    max_lr / div_factor / final_div_factor (three_phase: back down to the initial lr first, then to the minimum).
    With cycle_momentum, momentum (SGD) or beta1 (Adam) moves the other way between max_momentum and
    base_momentum. Each step computes the lrs from the groups' 'initial_lr', 'max_lr' and 'min_lr' (not chainable).
    """

    def __init__(self, optimizer: Optimizer, max_lr: float | Sequence[float], total_steps: int | None = None,
                 epochs: int | None = None, steps_per_epoch: int | None = None, pct_start: float = 0.3,
                 anneal_strategy: str = "cos", cycle_momentum: bool = True,
                 base_momentum: float | Sequence[float] = 0.85, max_momentum: float | Sequence[float] = 0.95,
                 div_factor: float = 25.0, final_div_factor: float = 1e4, three_phase: bool = False,
                 last_epoch: int = -1) -> None:
        self.total_steps = _total_steps(total_steps, epochs, steps_per_epoch)
        if not isinstance(pct_start, float) or not 0 <= pct_start <= 1:
            raise ValueError(f"OneCycleLR: pct_start must be a float in [0, 1], got {pct_start!r}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"OneCycleLR: anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        self.anneal_strategy, self.cycle_momentum = anneal_strategy, cycle_momentum
        self.phases = _one_cycle_phases(self.total_steps, pct_start, three_phase)

        groups = optimizer.param_groups
        max_lrs = _per_group(self, "max_lr", max_lr, len(groups))
        if last_epoch == -1:
            for group, top in zip(groups, max_lrs):
                group["initial_lr"] = top / div_factor
                group["max_lr"] = top
                group["min_lr"] = group["initial_lr"] / final_div_factor
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ValueError(f"OneCycleLR: cycle_momentum needs an optimizer with 'momentum' or 'betas'; "
                                 f"{type(optimizer).__name__} has neither (pass cycle_momentum=False)")
            self.use_beta1 = "betas" in optimizer.defaults
            tops = _per_group(self, "max_momentum", max_momentum, len(groups))
            bottoms = _per_group(self, "base_momentum", base_momentum, len(groups))
            if last_epoch == -1:
                for group, top, bottom in zip(groups, tops, bottoms):
                    group["max_momentum"], group["base_momentum"] = top, bottom
                    self._set_momentum(group, top)
        super().__init__(optimizer, last_epoch)

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def _phase(self, step: int):
        """The phase (end step, lr keys, momentum keys) that `step` falls in, and how far into it (0 to 1)."""
        if step > self.total_steps:
            raise ValueError(f"OneCycleLR: stepped {step} times but total_steps is {self.total_steps}")
        start = 0.0
        for i, phase in enumerate(self.phases):
            if step <= phase[0] or i == len(self.phases) - 1:
                return phase, (step - start) / (phase[0] - start)
            start = phase[0]

    def _groups(self) -> list[dict]:
        for i, group in enumerate(self.optimizer.param_groups):
            if "max_lr" not in group:  # PyTorch's KeyError, with the reason
                raise KeyError(f"OneCycleLR: param group {i} has no 'max_lr': it was added after the scheduler "
                               f"was built; build the scheduler after adding every group")
        return self.optimizer.param_groups

    def get_lr(self) -> list[float]:
        (_, lo, hi, _, _), pct = self._phase(self.last_epoch)
        return [self._anneal(g[lo], g[hi], pct) for g in self._groups()]

    def _update_lr(self, epoch: int | None = None) -> None:
        super()._update_lr(epoch)
        if self.cycle_momentum:  # PyTorch sets it in get_lr, at the same step
            (_, _, _, lo, hi), pct = self._phase(self.last_epoch)
            for group in self.optimizer.param_groups:
                self._set_momentum(group, self._anneal(group[lo], group[hi], pct))

    def _set_momentum(self, group: dict, momentum: float) -> None:
        if self.use_beta1:
            group["betas"] = (momentum, *group["betas"][1:])
        else:
            group["momentum"] = momentum


def _total_steps(total_steps: int | None, epochs: int | None, steps_per_epoch: int | None) -> int:
    """OneCycleLR's length: total_steps, or epochs * steps_per_epoch, each checked as PyTorch does."""
    if total_steps is not None:
        if not isinstance(total_steps, int) or total_steps < 1:
            raise ValueError(f"OneCycleLR: total_steps must be a positive integer, got {total_steps!r}")
        return total_steps
    if epochs is None or steps_per_epoch is None:
        raise ValueError("OneCycleLR: give total_steps, or epochs and steps_per_epoch")
    for name, value in (("epochs", epochs), ("steps_per_epoch", steps_per_epoch)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"OneCycleLR: {name} must be a positive integer, got {value!r}")
    return epochs * steps_per_epoch


def _one_cycle_phases(total_steps: int, pct_start: float, three_phase: bool) -> list[tuple]:
    """(end step, lr from, lr to, momentum from, momentum to) per phase; the names are keys of the param group."""
    up = float(pct_start * total_steps) - 1
    if three_phase:
        return [(up, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                (float(2 * pct_start * total_steps) - 2, "max_lr", "initial_lr", "base_momentum", "max_momentum"),
                (total_steps - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum")]
    return [(up, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
            (total_steps - 1, "max_lr", "min_lr", "base_momentum", "max_momentum")]


def _per_group(scheduler: LRScheduler, name: str, value, n: int) -> list:
    """One value per param group: `value` itself when it is a list or tuple (of n), else n copies of it."""
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{type(scheduler).__name__}: got {len(value)} values of {name} for {n} param groups")
        return list(value)
    return [value] * n


# ---------------------------------------------------------------- more of torch.optim.lr_scheduler's schedulers


class ExponentialLR(LRScheduler):
    """Multiplies the lr by gamma at every step (chainable): base_lr * gamma ** step."""

    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1) -> None:
        if not isinstance(gamma, numbers.Real) or not gamma > 0:
            raise ValueError(f"ExponentialLR: gamma must be a number > 0, got {gamma!r}")
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self._is_initial:  # resuming with last_epoch=n: the lr loaded is already that step's
            return self._current_lrs()
        return [lr * self.gamma for lr in self._current_lrs()]

    def _get_closed_form_lr(self) -> list[float]:
        return [base * self.gamma ** self.last_epoch for base in self.base_lrs]


class MultiStepLR(LRScheduler):
    """Multiplies the lr by gamma at each milestone (chainable; a milestone listed k times multiplies by gamma ** k):
    base_lr * gamma ** (number of milestones <= step)."""

    def __init__(self, optimizer: Optimizer, milestones: Sequence[int], gamma: float = 0.1,
                 last_epoch: int = -1) -> None:
        milestones = list(milestones)
        if not all(isinstance(m, numbers.Integral) and not isinstance(m, bool) for m in milestones):
            raise ValueError(f"MultiStepLR: milestones must be step numbers (ints), got {milestones}")
        self.milestones, self.gamma = Counter(milestones), gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch not in self.milestones:
            return self._current_lrs()
        return [lr * self.gamma ** self.milestones[self.last_epoch] for lr in self._current_lrs()]

    def _get_closed_form_lr(self) -> list[float]:
        passed = bisect_right(sorted(self.milestones.elements()), self.last_epoch)
        return [base * self.gamma ** passed for base in self.base_lrs]


class ConstantLR(LRScheduler):
    """base_lr * factor for the first total_iters steps, then base_lr (chainable: multiplies the lr by factor at
    step 0 and by 1 / factor at step total_iters)."""

    def __init__(self, optimizer: Optimizer, factor: float = 1.0 / 3, total_iters: int = 5,
                 last_epoch: int = -1) -> None:
        if not isinstance(factor, numbers.Real) or not 0 < factor <= 1:
            raise ValueError(f"ConstantLR: factor must be in (0, 1], got {factor!r}")
        if not isinstance(total_iters, numbers.Integral) or total_iters < 0:
            raise ValueError(f"ConstantLR: total_iters must be an int >= 0, got {total_iters!r}")
        self.factor, self.total_iters = factor, total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch == 0:
            return [lr * self.factor for lr in self._current_lrs()]
        if self.last_epoch != self.total_iters:
            return self._current_lrs()
        return [lr * (1.0 / self.factor) for lr in self._current_lrs()]

    def _get_closed_form_lr(self) -> list[float]:
        factor = self.factor + (self.last_epoch >= self.total_iters) * (1 - self.factor)
        return [base * factor for base in self.base_lrs]


class PolynomialLR(LRScheduler):
    """base_lr * (1 - min(step, total_iters) / total_iters) ** power: polynomial decay to 0 at total_iters, then 0.

    Chainable: each step multiplies the lr by the ratio of consecutive decay terms (PyTorch's form)."""

    def __init__(self, optimizer: Optimizer, total_iters: int = 5, power: float = 1.0, last_epoch: int = -1) -> None:
        if not isinstance(total_iters, numbers.Integral) or total_iters < 1:
            raise ValueError(f"PolynomialLR: total_iters must be an int >= 1, got {total_iters!r}")
        self.total_iters, self.power = total_iters, power
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self._is_initial or self.last_epoch > self.total_iters:
            return self._current_lrs()
        decay = ((1.0 - self.last_epoch / self.total_iters) /
                 (1.0 - (self.last_epoch - 1) / self.total_iters)) ** self.power
        return [lr * decay for lr in self._current_lrs()]

    def _get_closed_form_lr(self) -> list[float]:
        decay = (1.0 - min(self.total_iters, self.last_epoch) / self.total_iters) ** self.power
        return [base * decay for base in self.base_lrs]


class CosineAnnealingWarmRestarts(LRScheduler):
    """SGDR (Loshchilov & Hutter, 2017): cosine from base_lr to eta_min over T_i steps, then a restart at base_lr;
    the first period is T_0 and each next one T_mult times longer. Computed from the base lrs (not chainable).

    `step(epoch)` jumps to `epoch`, which may be fractional (step(epoch + i / iters) within an epoch), as PyTorch's.
    """

    def __init__(self, optimizer: Optimizer, T_0: int, T_mult: int = 1, eta_min: float = 0.0,
                 last_epoch: int = -1) -> None:
        if not isinstance(T_0, int) or isinstance(T_0, bool) or T_0 <= 0:
            raise ValueError(f"CosineAnnealingWarmRestarts: T_0 must be a positive int, got {T_0!r}")
        if not isinstance(T_mult, int) or isinstance(T_mult, bool) or T_mult < 1:
            raise ValueError(f"CosineAnnealingWarmRestarts: T_mult must be an int >= 1, got {T_mult!r}")
        if not isinstance(eta_min, (float, int)):
            raise ValueError(f"CosineAnnealingWarmRestarts: eta_min must be a number, got {eta_min!r}")
        self.T_0, self.T_i, self.T_mult, self.eta_min = T_0, T_0, T_mult, eta_min
        self.T_cur = last_epoch
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        cosine_term = (1 + math.cos(math.pi * self.T_cur / self.T_i)) / 2
        return [self.eta_min + (base - self.eta_min) * cosine_term for base, _ in self._base_lrs_per_group()]

    def step(self, epoch: float | None = None) -> None:
        """Advance one step, or go to `epoch` (fractional allowed): the period and the position in it follow."""
        if epoch is None and self.last_epoch < 0:
            epoch = 0
        if epoch is None:
            epoch = self.last_epoch + 1
            self.T_cur += 1
            if self.T_cur >= self.T_i:
                self.T_cur, self.T_i = self.T_cur % self.T_i, self.T_i * self.T_mult
        else:
            self._jump(epoch)
        self.last_epoch = math.floor(epoch)
        self._set_lrs(self.get_lr())

    def _jump(self, epoch: float) -> None:
        """T_cur and T_i at `epoch` (PyTorch's closed form; with T_mult > 1 the periods are T_0 * T_mult ** n)."""
        if epoch < 0:
            raise ValueError(f"CosineAnnealingWarmRestarts: epoch must be >= 0, got {epoch}")
        if epoch < self.T_0:
            self.T_i, self.T_cur = self.T_0, epoch
        elif self.T_mult == 1:
            self.T_cur = epoch % self.T_0
        else:
            n = int(math.log(epoch / self.T_0 * (self.T_mult - 1) + 1, self.T_mult))
            self.T_cur = epoch - self.T_0 * (self.T_mult ** n - 1) / (self.T_mult - 1)
            self.T_i = self.T_0 * self.T_mult ** n


class CyclicLR(LRScheduler):
    """Cyclical learning rates (Smith, "Cyclical Learning Rates for Training Neural Networks", 2017), as PyTorch's
    CyclicLR: the lr goes from base_lr up to max_lr over step_size_up steps and back over step_size_down, the
    height scaled per cycle ('triangular': 1, 'triangular2': halved each cycle) or per step ('exp_range':
    gamma ** step), or by scale_fn(x) (x the cycle, or the step with scale_mode='iterations'). With cycle_momentum,
    momentum (SGD) or beta1 (Adam) goes the other way between max_momentum and base_momentum. Built, it sets every
    lr to base_lr. Not chainable. The state dict holds `scale_fn.__dict__` of a callable object (not a function).
    """

    _not_saved = ("optimizer", "_scale_fn_custom")

    def __init__(self, optimizer: Optimizer, base_lr: float | Sequence[float], max_lr: float | Sequence[float],
                 step_size_up: int = 2000, step_size_down: int | None = None, mode: str = "triangular",
                 gamma: float = 1.0, scale_fn: Callable[[float], float] | None = None, scale_mode: str = "cycle",
                 cycle_momentum: bool = True, base_momentum: float | Sequence[float] = 0.8,
                 max_momentum: float | Sequence[float] = 0.9, last_epoch: int = -1) -> None:
        _check_optimizer(self, optimizer)
        n = len(optimizer.param_groups)
        base_lrs = _per_group(self, "base_lr", base_lr, n)
        if last_epoch == -1:
            for lr, group in zip(base_lrs, optimizer.param_groups):
                group["lr"] = lr
        self.max_lrs = _per_group(self, "max_lr", max_lr, n)
        self.total_size, self.step_ratio = _cycle_shape(step_size_up, step_size_down)
        if mode not in ("triangular", "triangular2", "exp_range") and scale_fn is None:
            raise ValueError(f"CyclicLR: mode must be 'triangular', 'triangular2' or 'exp_range' (or give "
                             f"scale_fn), got {mode!r}")
        if scale_mode not in ("cycle", "iterations"):
            raise ValueError(f"CyclicLR: scale_mode must be 'cycle' or 'iterations', got {scale_mode!r}")
        self.mode, self.gamma, self._scale_fn_custom = mode, gamma, scale_fn
        self.scale_mode = scale_mode if scale_fn is not None else ("iterations" if mode == "exp_range" else "cycle")
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            self._init_momentum(optimizer, base_momentum, max_momentum, last_epoch)
        super().__init__(optimizer, last_epoch)
        self.base_lrs = base_lrs

    def _init_momentum(self, optimizer: Optimizer, base_momentum, max_momentum, last_epoch: int) -> None:
        if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
            raise ValueError(f"CyclicLR: cycle_momentum needs an optimizer with 'momentum' or 'betas'; "
                             f"{type(optimizer).__name__} has neither (pass cycle_momentum=False)")
        self.use_beta1 = "betas" in optimizer.defaults
        n = len(optimizer.param_groups)
        self.base_momentums = _per_group(self, "base_momentum", base_momentum, n)
        self.max_momentums = _per_group(self, "max_momentum", max_momentum, n)
        if last_epoch == -1:
            for top, bottom, group in zip(self.max_momentums, self.base_momentums, optimizer.param_groups):
                self._set_momentum(group, top)
                group["max_momentum"], group["base_momentum"] = top, bottom

    def scale_fn(self, x: float) -> float:
        """The cycle's height factor at x (the cycle number, or the step with scale_mode 'iterations')."""
        if self._scale_fn_custom is not None:
            return self._scale_fn_custom(x)
        if self.mode == "triangular":
            return 1.0
        if self.mode == "triangular2":
            return 1 / (2.0 ** (x - 1))
        return self.gamma ** x

    def get_lr(self) -> list[float]:
        cycle = math.floor(1 + self.last_epoch / self.total_size)
        x = 1.0 + self.last_epoch / self.total_size - cycle
        fraction = x / self.step_ratio if x <= self.step_ratio else (x - 1) / (self.step_ratio - 1)
        scale = self.scale_fn(cycle if self.scale_mode == "cycle" else self.last_epoch)
        groups = self.optimizer.param_groups
        if len(self.base_lrs) != len(groups):
            raise _added_group_error(self, len(self.base_lrs))
        if self.cycle_momentum:
            for group, bottom, top in zip(groups, self.base_momentums, self.max_momentums):
                self._set_momentum(group, top - (top - bottom) * fraction * scale)
        return [base + (top - base) * fraction * scale for base, top in zip(self.base_lrs, self.max_lrs)]

    def _set_momentum(self, group: dict, momentum: float) -> None:
        if self.use_beta1:
            group["betas"] = (momentum, *group["betas"][1:])
        else:
            group["momentum"] = momentum

    def state_dict(self) -> dict[str, Any]:
        fn = self._scale_fn_custom
        saved = None if fn is None or isinstance(fn, types.FunctionType) else fn.__dict__.copy()
        return {**super().state_dict(), "_scale_fn_custom": saved}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        saved = state_dict.get("_scale_fn_custom")
        if saved is not None and self._scale_fn_custom is not None:
            self._scale_fn_custom.__dict__.update(saved)


def _cycle_shape(step_size_up: int, step_size_down: int | None) -> tuple[float, float]:
    """CyclicLR's cycle length and the fraction of it spent going up."""
    down = step_size_up if step_size_down is None else step_size_down
    for name, value in (("step_size_up", step_size_up), ("step_size_down", down)):
        if not isinstance(value, numbers.Real) or not value > 0:
            raise ValueError(f"CyclicLR: {name} must be a number of steps > 0, got {value!r}")
    total = float(step_size_up) + float(down)
    return total, float(step_size_up) / total


class ReduceLROnPlateau(LRScheduler):
    """Multiplies the lr by `factor` when a metric has stopped improving for `patience` steps, as PyTorch's:
    call `step(metric)` (e.g. the validation loss) once per epoch. 'min' mode wants the metric lower ('max':
    higher) than the best so far by more than `threshold` (relative: best * (1 -+ threshold); 'abs': best -+
    threshold); after a reduction, `cooldown` steps pass before bad steps count again. An lr never goes below
    min_lr (one, or one per group), and a change smaller than eps is skipped."""

    def __init__(self, optimizer: Optimizer, mode: str = "min", factor: float = 0.1, patience: int = 10,
                 threshold: float = 1e-4, threshold_mode: str = "rel", cooldown: int = 0,
                 min_lr: float | Sequence[float] = 0, eps: float = 1e-8) -> None:
        _check_optimizer(self, optimizer)
        if not isinstance(factor, numbers.Real) or not factor < 1.0:
            raise ValueError(f"ReduceLROnPlateau: factor must be < 1.0 (the lr is multiplied by it), got {factor!r}")
        if mode not in ("min", "max"):
            raise ValueError(f"ReduceLROnPlateau: mode must be 'min' or 'max', got {mode!r}")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError(f"ReduceLROnPlateau: threshold_mode must be 'rel' or 'abs', got {threshold_mode!r}")
        self.optimizer, self.factor, self.patience, self.cooldown, self.eps = optimizer, factor, patience, cooldown, eps
        self.mode, self.threshold, self.threshold_mode = mode, threshold, threshold_mode
        self.default_min_lr = None if isinstance(min_lr, (list, tuple)) else min_lr
        self.min_lrs = _per_group(self, "min_lr", min_lr, len(optimizer.param_groups))
        self.mode_worse = math.inf if mode == "min" else -math.inf
        self.last_epoch = 0
        self._last_lr = self._current_lrs()
        self._reset()

    def _reset(self) -> None:
        self.best, self.cooldown_counter, self.num_bad_epochs = self.mode_worse, 0, 0

    @property
    def in_cooldown(self) -> bool:
        return self.cooldown_counter > 0

    def step(self, metrics: Any, epoch: int | None = None) -> None:  # type: ignore[override]
        """Record one value of the metric (a number or a 0-d tensor); reduce the lrs once patience runs out."""
        current = float(metrics)
        if epoch is not None:
            warnings.warn("ReduceLROnPlateau.step(metrics, epoch) is deprecated in PyTorch: call step(metrics)",
                          UserWarning, stacklevel=2)
        self.last_epoch = self.last_epoch + 1 if epoch is None else epoch
        if self._is_better(current, self.best):
            self.best, self.num_bad_epochs = current, 0
        else:
            self.num_bad_epochs += 1
        if self.in_cooldown:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0  # bad steps in the cooldown do not count
        if self.num_bad_epochs > self.patience:
            self._reduce_lr()
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
        self._last_lr = self._current_lrs()

    def _reduce_lr(self) -> None:
        groups = self.optimizer.param_groups
        if len(groups) != len(self.min_lrs):
            if self.default_min_lr is None:
                raise ValueError(f"ReduceLROnPlateau: the optimizer has {len(groups)} param groups but min_lr was "
                                 f"given for {len(self.min_lrs)}; set scheduler.min_lrs for the added groups")
            self.min_lrs = [self.default_min_lr] * len(groups)
        for group, min_lr in zip(groups, self.min_lrs):
            old = float(group["lr"])
            new = max(old * self.factor, min_lr)
            if old - new > self.eps:
                group["lr"] = new

    def _is_better(self, value: float, best: float) -> bool:
        if self.mode == "min":
            return value < (best * (1.0 - self.threshold) if self.threshold_mode == "rel" else best - self.threshold)
        return value > (best * (1.0 + self.threshold) if self.threshold_mode == "rel" else best + self.threshold)
