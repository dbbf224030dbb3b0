"""AdamW: Adam with decoupled weight decay (p *= 1 - lr * weight_decay), the update and its class in one place.

Loshchilov & Hutter, "Decoupled Weight Decay Regularization" (ICLR 2019), on top of Kingma & Ba, "Adam: A
Method for Stochastic Optimization" (ICLR 2015); amsgrad=True keeps AMSGrad's running maximum of v (Reddi et
al., ICLR 2018). The math is PyTorch's single-tensor AdamW, in the same order.
"""
from __future__ import annotations

from typing import Iterable

from frost.optim.optimizer import Optimizer, array_module
from frost.tensor import Tensor, zeros_like


def adamw_update(p, g, m, v, v_max=None, *, lr: float, beta1: float, beta2: float, eps: float,
                 weight_decay: float, step: float, maximize: bool = False) -> None:
    """One AdamW step on arrays (NumPy or CuPy), in place on p, m, v (and v_max with AMSGrad)."""
    xp = array_module(p)
    if maximize:
        g = -g
    p *= 1 - lr * weight_decay
    m += (1 - beta1) * (g - m)                      # m = beta1 * m + (1 - beta1) * g
    v *= beta2
    v += (1 - beta2) * (g * g)                      # v = beta2 * v + (1 - beta2) * g^2
    if v_max is not None:
        xp.maximum(v_max, v, out=v_max)
        v = v_max
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    denom = xp.sqrt(v) / bias_correction2 ** 0.5 + eps
    p -= (lr / bias_correction1) * (m / denom)


# GPU kernel: a fused one-launch version of adamw_update over flat parameter/gradient/state buffers goes here,
# with adamw_update as its NumPy twin in the tests.


class AdamW(Optimizer):
    """Adam whose weight decay shrinks the weights directly instead of being added to the gradient."""

    def __init__(self, params: Iterable[Tensor] | Iterable[dict], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
                 amsgrad: bool = False, maximize: bool = False) -> None:
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError(f"AdamW: lr ({lr}), eps ({eps}) and weight_decay ({weight_decay}) must be >= 0")
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"AdamW: betas must be two numbers in [0, 1), got {betas}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      amsgrad=amsgrad, maximize=maximize))

    def step(self, closure=None):
        loss = self._evaluate(closure)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in self._params_with_grad(group):
                state = self.state.setdefault(p, {})
                if not state:
                    state["step"] = self._new_step()
                    state["exp_avg"], state["exp_avg_sq"] = zeros_like(p), zeros_like(p)
                    if group["amsgrad"]:
                        state["max_exp_avg_sq"] = zeros_like(p)
                v_max = state["max_exp_avg_sq"].data if group["amsgrad"] else None
                adamw_update(p.data, p.grad.data, state["exp_avg"].data, state["exp_avg_sq"].data, v_max,
                             lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                             weight_decay=group["weight_decay"], step=self._increment(state["step"]),
                             maximize=group["maximize"])
        return loss
