"""Adagrad: each coordinate's step divided by the root of the sum of all its squared gradients so far.

Duchi, Hazan & Singer, "Adaptive Subgradient Methods for Online Learning and Stochastic Optimization" (JMLR 12,
2011). PyTorch's single-tensor Adagrad, in the same order:

    g = g + weight_decay * p                       # L2 decay through the gradient
    clr = lr / (1 + (step - 1) * lr_decay)         # step counts from 1
    s = s + g^2                                    # 'sum', starting at initial_accumulator_value
    p = p - clr * g / (sqrt(s) + eps)

Hyper-parameters (PyTorch's defaults): lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0,
eps=1e-10. State: 'step' and 'sum', made for every parameter when the optimizer is built, as PyTorch does (so the
state dict lists them all). A param group's own initial_accumulator_value fills its sums (PyTorch fills every group's
with the constructor's value). The rule runs on the arrays (NumPy or CuPy) parameter by parameter: `adagrad_update`.
"""
from frost.optim.optimizer import Optimizer, Params, array_module, check_options
from frost.tensor import full_like


def adagrad_update(p, g, state_sum, *, step: float, lr: float, lr_decay: float, eps: float, weight_decay: float,
                   maximize: bool = False) -> None:
    """One Adagrad step on arrays, in place on p and state_sum (step: this update's number, from 1)."""
    xp = array_module(p)
    if maximize:
        g = -g
    if weight_decay != 0:
        g = g + weight_decay * p
    clr = lr / (1 + (step - 1) * lr_decay)
    state_sum += g * g
    p -= clr * (g / (xp.sqrt(state_sum) + eps))


class Adagrad(Optimizer):
    """Adagrad with PyTorch's learning-rate decay, initial accumulator and L2 weight decay."""

    state_names = ("sum",)
    update_rule = staticmethod(adagrad_update)
    flat_hyper = ("lr", "lr_decay", "eps", "weight_decay", "maximize")

    def __init__(self, params: Params, lr: float = 1e-2, lr_decay: float = 0.0, weight_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0, eps: float = 1e-10, maximize: bool = False) -> None:
        check_options("Adagrad", dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value, eps=eps))
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value, eps=eps, maximize=maximize))
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p] = self._initial_state(p, group)

    def _initial_state(self, p, group):
        return {"step": self._new_step(), "sum": full_like(p, group["initial_accumulator_value"])}
