"""Adam (and AMSGrad) with L2 weight decay folded into the gradient, as PyTorch's Adam does.

Kingma & Ba, "Adam: A Method for Stochastic Optimization" (ICLR 2015); AMSGrad from Reddi et al., "On the
Convergence of Adam and Beyond" (ICLR 2018). For decoupled weight decay use AdamW.
"""
from frost.optim.adamw import AdamW, adamw_update
from frost.optim.optimizer import Params


def adam_update(p, g, m, v, v_max=None, *, step: float, lr: float, betas: tuple[float, float], eps: float,
                weight_decay: float, maximize: bool = False) -> None:
    """One Adam step on arrays (NumPy or CuPy), in place on p, m, v (and v_max, the AMSGrad maximum)."""
    if maximize:
        g = -g
    if weight_decay != 0:
        g = g + weight_decay * p  # L2 decay through the gradient; the rest is AdamW's step without its decay
    adamw_update(p, g, m, v, v_max, step=step, lr=lr, betas=betas, eps=eps, weight_decay=0.0)


# GPU kernel: adamw.adam_flat_kernel with decoupled=0 (one launch over the flat group; twin: adam_update).


class Adam(AdamW):
    """Adam: per-coordinate steps scaled by running estimates of the gradient's first and second moments.

    The same class as AdamW but for its rule (adam_update: L2 decay added to the gradient) and default decay.
    """

    update_rule = staticmethod(adam_update)
    decoupled = 0.0

    def __init__(self, params: Params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False, maximize: bool = False) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize)
