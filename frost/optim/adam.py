"""Adam (and AMSGrad) with L2 weight decay folded into the gradient, as PyTorch's Adam does.

Kingma & Ba, "Adam: A Method for Stochastic Optimization" (ICLR 2015); AMSGrad from Reddi et al., "On the
Convergence of Adam and Beyond" (ICLR 2018). For decoupled weight decay use AdamW.
"""
from __future__ import annotations

from typing import Iterable

from frost.optim.adamw import adam_flat_update
from frost.optim.optimizer import Optimizer, array_module
from frost.tensor import Tensor, zeros_like


def adam_update(p, g, m, v, v_max=None, *, lr: float, beta1: float, beta2: float, eps: float,
                weight_decay: float, step: float, maximize: bool = False) -> None:
    """One Adam step on arrays (NumPy or CuPy), in place on p, m, v (and v_max, the AMSGrad maximum)."""
    xp = array_module(p)
    if maximize:
        g = -g
    if weight_decay != 0:
        g = g + weight_decay * p
    m += (1 - beta1) * (g - m)
    v *= beta2
    v += (1 - beta2) * (g * g)
    if v_max is not None:
        xp.maximum(v_max, v, out=v_max)
        v = v_max
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    denom = xp.sqrt(v) / bias_correction2 ** 0.5 + eps
    p -= (lr / bias_correction1) * (m / denom)


# GPU kernel: adamw.adam_flat_kernel with decoupled=0 (one launch over the flat group; twin: adam_update).


class Adam(Optimizer):
    """Adam: per-coordinate steps scaled by running estimates of the gradient's first and second moments."""

    def __init__(self, params: Iterable[Tensor] | Iterable[dict], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 amsgrad: bool = False, maximize: bool = False) -> None:
        _check_options("Adam", lr, betas, eps, weight_decay)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      amsgrad=amsgrad, maximize=maximize))

    flat_state = ("exp_avg", "exp_avg_sq")

    def _flat_supported(self, group: dict) -> bool:
        return not group["amsgrad"]

    def _flat_hyper(self, group: dict) -> list[float]:
        beta1, beta2 = group["betas"]
        return [group["lr"], beta1, beta2, group["eps"], group["weight_decay"],
                -1.0 if group["maximize"] else 1.0, 0.0]

    def _flat_update(self, flat) -> None:
        adam_flat_update(flat)

    def step(self, closure=None):
        loss = self._evaluate(closure)
        self._check_finite_grads()
        flat_groups = self._step_flat_groups()
        for index, group in enumerate(self.param_groups):
            if index in flat_groups:
                continue
            beta1, beta2 = group["betas"]
            for p in self._params_with_grad(group):
                state = self.state.setdefault(p, {})
                if not state:
                    state["step"] = self._new_step()
                    state["exp_avg"], state["exp_avg_sq"] = zeros_like(p), zeros_like(p)
                    if group["amsgrad"]:
                        state["max_exp_avg_sq"] = zeros_like(p)
                v_max = state["max_exp_avg_sq"].data if group["amsgrad"] else None
                adam_update(p.data, p.grad.data, state["exp_avg"].data, state["exp_avg_sq"].data, v_max,
                            lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                            weight_decay=group["weight_decay"], step=self._increment(state["step"]),
                            maximize=group["maximize"])
        return loss


def _check_options(name: str, lr: float, betas, eps: float, weight_decay: float) -> None:
    if lr < 0 or eps < 0 or weight_decay < 0:
        raise ValueError(f"{name}: lr ({lr}), eps ({eps}) and weight_decay ({weight_decay}) must be >= 0")
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"{name}: betas must be two numbers in [0, 1), got {betas}")
