"""Lion: the sign of an interpolated momentum as the update, with decoupled weight decay.

Chen, Liang, Huang, Real, Wang, Pham, Dong, Luong, Hsieh, Lu, Le, "Symbolic Discovery of Optimization
Algorithms" (NeurIPS 2023, arXiv:2302.06675), Algorithm 2:

    c = beta1 * m + (1 - beta1) * g              # interpolation, used only for the update's sign
    p = p - lr * (sign(c) + weight_decay * p)    # = p * (1 - lr * wd) - lr * sign(c)
    m = beta2 * m + (1 - beta2) * g              # the tracked momentum

Hyper-parameters (paper defaults): lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0. The paper advises an lr 3-10x
smaller than AdamW's and a weight decay 3-10x larger (the product lr * wd sets the decay strength).
State: 'exp_avg' (m) and 'step', as the authors' and common PyTorch ports name them. The update is elementwise:
on the GPU a float32 group is one launch of `lion_flat_kernel` over the flat buffers; elsewhere `lion_update`.
"""
from frost.kernel import Array, bdx, bx, f32, i32, kernel, tx
from frost.optim.optimizer import Optimizer, Params, array_module, check_options


def lion_update(p, g, m, *, step: float, lr: float, betas: tuple[float, float], weight_decay: float) -> None:
    """One Lion step on arrays (NumPy or CuPy), in place on p and m (step is counted, Lion does not use it)."""
    xp, (beta1, beta2) = array_module(p), betas
    c = beta1 * m + (1 - beta1) * g
    p *= 1 - lr * weight_decay
    p -= lr * xp.sign(c)
    m += (1 - beta2) * (g - m)


# ---------------------------------------------------------------- GPU kernel (twin: lion_update)
# hyper = [step, lr, beta1, beta2, weight_decay] on the device (step is only counted, Lion does not use it).

@kernel
def lion_flat_kernel(p: Array[f32], g: Array[f32], m: Array[f32], n: i32, hyper: Array[f32]):
    i = bx * bdx + tx
    if i < n:
        lr = hyper[1]
        gi = g[i]
        mi = m[i]
        c = hyper[2] * mi + (1 - hyper[2]) * gi
        p[i] = p[i] * (1 - lr * hyper[4]) - lr * (f32(c > 0) - f32(c < 0))
        m[i] = mi + (1 - hyper[3]) * (gi - mi)


class Lion(Optimizer):
    """Lion (EvoLved Sign Momentum): every coordinate moves by exactly lr, in the sign of the momentum."""

    state_names = ("exp_avg",)
    update_rule = staticmethod(lion_update)
    flat_kernel = lion_flat_kernel
    flat_hyper = ("lr", "betas", "weight_decay")

    def __init__(self, params: Params, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0) -> None:
        check_options("Lion", dict(lr=lr, weight_decay=weight_decay), dict(betas=betas))
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))
