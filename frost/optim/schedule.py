"""Learning-rate schedules: pure functions of the step, and PyTorch-style schedulers that set group['lr'].

Every scheduler here computes its learning rates in closed form from the step number (`lr_at(step)`), so the
sequence matches PyTorch's schedulers (which mostly update recursively) up to rounding, a scheduler restored
from a state dict continues exactly, and the same formula can later run inside a captured training step.
Like PyTorch, a scheduler sets each group's lr for step 0 when it is built; call `scheduler.step()` after
`optimizer.step()`. A learning rate set by hand in `group['lr']` lasts until the next `scheduler.step()`.
"""
from __future__ import annotations

import math
from bisect import bisect_right
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
    """Base class: sets every param group's lr to `lr_at(last_epoch)` at each `step()`.

    `base_lrs` are the groups' 'initial_lr' (recorded on first use, as PyTorch does); `last_epoch` counts
    scheduler steps, 0 after construction.
    """

    _not_saved: tuple[str, ...] = ("optimizer",)

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(self).__name__}: expected a frost Optimizer, got {type(optimizer).__name__}")
        self.optimizer = optimizer
        for i, group in enumerate(optimizer.param_groups):
            if last_epoch == -1:
                group.setdefault("initial_lr", group["lr"])
            elif "initial_lr" not in group:
                raise KeyError(f"{type(self).__name__}: param group {i} has no 'initial_lr' although last_epoch="
                               f"{last_epoch} (resuming); load the optimizer's state dict first")
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self.step()

    def lr_at(self, step: int) -> list[float]:
        """The learning rate of every param group at a given step (closed form)."""
        raise NotImplementedError

    def step(self) -> None:
        self.last_epoch += 1
        self._set_lrs(self.lr_at(self.last_epoch))

    def _set_lrs(self, lrs: Sequence[float]) -> None:
        for group, lr in zip(self.optimizer.param_groups, lrs):
            group["lr"] = lr
        self._last_lr = list(lrs)

    def get_last_lr(self) -> list[float]:
        return list(self._last_lr)

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in self._not_saved}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.__dict__.update({k: v for k, v in state_dict.items() if k not in self._not_saved})


class LambdaLR(LRScheduler):
    """lr = base_lr * lr_lambda(step); one function, or one per param group. The functions are not saved."""

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

    def lr_at(self, step: int) -> list[float]:
        return [base * fn(step) for base, fn in zip(self.base_lrs, self.lr_lambdas)]


class StepLR(LRScheduler):
    """lr = base_lr * gamma ** (step // step_size)."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1) -> None:
        if step_size < 1:
            raise ValueError(f"StepLR: step_size must be >= 1, got {step_size}")
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, step: int) -> list[float]:
        return [base * self.gamma ** (step // self.step_size) for base in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * step / T_max)) / 2 (Loshchilov & Hutter, SGDR, 2017).

    Past T_max the cosine goes on (back up by 2 * T_max), as PyTorch's does.
    """

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1) -> None:
        if T_max < 1:
            raise ValueError(f"CosineAnnealingLR: T_max must be >= 1, got {T_max}")
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def lr_at(self, step: int) -> list[float]:
        return [self.eta_min + (base - self.eta_min) * (1 + math.cos(math.pi * step / self.T_max)) / 2
                for base in self.base_lrs]


class LinearLR(LRScheduler):
    """lr = base_lr * factor, the factor going linearly from start_factor to end_factor over total_iters steps."""

    def __init__(self, optimizer: Optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5, last_epoch: int = -1) -> None:
        if not 0 < start_factor <= 1 or not 0 <= end_factor <= 1:
            raise ValueError(f"LinearLR: need 0 < start_factor <= 1 and 0 <= end_factor <= 1, got "
                             f"start_factor={start_factor}, end_factor={end_factor}")
        if total_iters < 1:
            raise ValueError(f"LinearLR: total_iters must be >= 1, got {total_iters}")
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
        super().__init__(optimizer, last_epoch)

    def lr_at(self, step: int) -> list[float]:
        factor = self.start_factor + (self.end_factor - self.start_factor) * min(self.total_iters, step) \
            / self.total_iters
        return [base * factor for base in self.base_lrs]


class LinearWarmup(LRScheduler):
    """lr = base_lr * min(1, (step + 1) / warmup_steps): `linear_warmup` as a scheduler.

    The same sequence as LinearLR(optimizer, 1 / warmup_steps, 1.0, warmup_steps - 1).
    """

    def __init__(self, optimizer: Optimizer, warmup_steps: int, last_epoch: int = -1) -> None:
        if warmup_steps < 1:
            raise ValueError(f"LinearWarmup: warmup_steps must be >= 1, got {warmup_steps}")
        self.warmup_steps = warmup_steps
        super().__init__(optimizer, last_epoch)

    def lr_at(self, step: int) -> list[float]:
        return [linear_warmup(step, self.warmup_steps, base) for base in self.base_lrs]


class SequentialLR(LRScheduler):
    """Run `schedulers[i]` from milestone i-1 on (its own step counted from that milestone): e.g. warm-up, then
    cosine: SequentialLR(opt, [LinearWarmup(opt, 100), CosineAnnealingLR(opt, 900)], milestones=[100])."""

    _not_saved = ("optimizer", "schedulers")

    def __init__(self, optimizer: Optimizer, schedulers: Sequence[LRScheduler], milestones: Sequence[int],
                 last_epoch: int = -1) -> None:
        if not schedulers:
            raise ValueError("SequentialLR: expects at least one scheduler")
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(f"SequentialLR: {len(schedulers)} schedulers need {len(schedulers) - 1} milestones, "
                             f"got {len(milestones)}")
        for i, s in enumerate(schedulers):
            if s.optimizer is not optimizer:
                raise ValueError(f"SequentialLR: scheduler {i} ({type(s).__name__}) belongs to another optimizer")
        self.schedulers, self.milestones = list(schedulers), list(milestones)
        super().__init__(optimizer, last_epoch)

    def _active(self, step: int) -> tuple[LRScheduler, int]:
        i = bisect_right(self.milestones, step)
        return self.schedulers[i], step - (self.milestones[i - 1] if i else 0)

    def lr_at(self, step: int) -> list[float]:
        scheduler, local_step = self._active(step)
        return scheduler.lr_at(local_step)

    def step(self) -> None:
        self.last_epoch += 1
        scheduler, local_step = self._active(self.last_epoch)
        scheduler.last_epoch = local_step - 1
        scheduler.step()  # the active scheduler sets lr (and e.g. momentum) itself
        self._last_lr = scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "schedulers": [s.state_dict() for s in self.schedulers]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        for s, sd in zip(self.schedulers, state_dict["schedulers"]):
            s.load_state_dict(sd)


class OneCycleLR(LRScheduler):
    """The 1cycle policy (Smith & Topin, "Super-Convergence", 2018), as PyTorch's OneCycleLR.

    lr rises from max_lr / div_factor to max_lr over the first pct_start of total_steps, then anneals to
    max_lr / div_factor / final_div_factor (three_phase: back down to the initial lr first, then to the minimum).
    With cycle_momentum, momentum (SGD) or beta1 (Adam) moves the other way between max_momentum and
    base_momentum.
    """

    def __init__(self, optimizer: Optimizer, max_lr: float | Sequence[float], total_steps: int | None = None,
                 epochs: int | None = None, steps_per_epoch: int | None = None, pct_start: float = 0.3,
                 anneal_strategy: str = "cos", cycle_momentum: bool = True,
                 base_momentum: float | Sequence[float] = 0.85, max_momentum: float | Sequence[float] = 0.95,
                 div_factor: float = 25.0, final_div_factor: float = 1e4, three_phase: bool = False,
                 last_epoch: int = -1) -> None:
        if total_steps is None:
            if epochs is None or steps_per_epoch is None:
                raise ValueError("OneCycleLR: give total_steps, or epochs and steps_per_epoch")
            total_steps = epochs * steps_per_epoch
        if not isinstance(total_steps, int) or total_steps < 1:
            raise ValueError(f"OneCycleLR: total_steps must be a positive integer, got {total_steps}")
        if not 0 <= pct_start <= 1:
            raise ValueError(f"OneCycleLR: pct_start must be in [0, 1], got {pct_start}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"OneCycleLR: anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        self.total_steps, self.anneal_strategy, self.cycle_momentum = total_steps, anneal_strategy, cycle_momentum
        up = float(pct_start * total_steps) - 1
        # (end step, lr from, lr to, momentum from, momentum to), keys of the param group
        if three_phase:
            self.phases = [(up, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                           (float(2 * pct_start * total_steps) - 2, "max_lr", "initial_lr", "base_momentum",
                            "max_momentum"),
                           (total_steps - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum")]
        else:
            self.phases = [(up, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                           (total_steps - 1, "max_lr", "min_lr", "base_momentum", "max_momentum")]

        groups = optimizer.param_groups
        max_lrs = _per_group("max_lr", max_lr, len(groups))
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
            if last_epoch == -1:
                tops = _per_group("max_momentum", max_momentum, len(groups))
                bottoms = _per_group("base_momentum", base_momentum, len(groups))
                for group, top, bottom in zip(groups, tops, bottoms):
                    group["max_momentum"], group["base_momentum"] = top, bottom
                    self._set_momentum(group, top)
        super().__init__(optimizer, last_epoch)

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def _phase(self, step: int):
        if step > self.total_steps:
            raise ValueError(f"OneCycleLR: stepped {step} times but total_steps is {self.total_steps}")
        start = 0.0
        for i, phase in enumerate(self.phases):
            if step <= phase[0] or i == len(self.phases) - 1:
                return phase, (step - start) / (phase[0] - start)
            start = phase[0]

    def lr_at(self, step: int) -> list[float]:
        (_, lo, hi, _, _), pct = self._phase(step)
        return [self._anneal(g[lo], g[hi], pct) for g in self.optimizer.param_groups]

    def momentum_at(self, step: int) -> list[float]:
        (_, _, _, lo, hi), pct = self._phase(step)
        return [self._anneal(g[lo], g[hi], pct) for g in self.optimizer.param_groups]

    def step(self) -> None:
        super().step()
        if self.cycle_momentum:
            for group, momentum in zip(self.optimizer.param_groups, self.momentum_at(self.last_epoch)):
                self._set_momentum(group, momentum)

    def _set_momentum(self, group: dict, momentum: float) -> None:
        if self.use_beta1:
            group["betas"] = (momentum, *group["betas"][1:])
        else:
            group["momentum"] = momentum


def _per_group(name: str, value, n: int) -> list:
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"OneCycleLR: got {len(value)} values of {name} for {n} param groups")
        return list(value)
    return [value] * n
