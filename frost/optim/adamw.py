"""AdamW: Adam with decoupled weight decay (p *= 1 - lr * weight_decay), the update and its class in one place.

Loshchilov & Hutter, "Decoupled Weight Decay Regularization" (ICLR 2019), on top of Kingma & Ba, "Adam: A
Method for Stochastic Optimization" (ICLR 2015); amsgrad=True keeps AMSGrad's running maximum of v (Reddi et
al., ICLR 2018). The math is PyTorch's single-tensor AdamW, in the same order.
"""
from frost.kernel import Array, bdx, bx, f32, i32, kernel, sqrt, tx
from frost.optim.optimizer import Optimizer, Params, array_module, check_options
from frost.tensor import zeros_like


def adamw_update(p, g, m, v, v_max=None, *, step: float, lr: float, betas: tuple[float, float], eps: float,
                 weight_decay: float, maximize: bool = False) -> None:
    """One AdamW step on arrays (NumPy or CuPy), in place on p, m, v (and v_max with AMSGrad)."""
    xp, (beta1, beta2) = array_module(p), betas
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


# ---------------------------------------------------------------- GPU kernel (twin: adamw_update)
# hyper = [step, lr, beta1, beta2, eps, weight_decay, maximize, decoupled]: on the device, so a captured step
# keeps counting and follows the lr schedule. decoupled=0 gives Adam's L2 decay (g += wd * p) instead.

@kernel.warm
@kernel
def adam_flat_kernel(p: Array[f32], g: Array[f32], m: Array[f32], v: Array[f32], n: i32, hyper: Array[f32]):
    i = bx * bdx + tx
    if i < n:
        step = hyper[0]
        lr = hyper[1]
        beta1 = hyper[2]
        beta2 = hyper[3]
        wd = hyper[5]
        decoupled = hyper[7]
        gi = (1 - 2 * hyper[6]) * g[i]
        pi = p[i]
        gi += (1 - decoupled) * wd * pi
        pi *= 1 - decoupled * lr * wd
        mi = m[i] + (1 - beta1) * (gi - m[i])
        vi = beta2 * v[i] + (1 - beta2) * gi * gi
        m[i] = mi
        v[i] = vi
        denom = sqrt(vi) / sqrt(1 - pow(beta2, step)) + hyper[4]
        p[i] = pi - lr / (1 - pow(beta1, step)) * (mi / denom)


class AdamW(Optimizer):
    """Adam whose weight decay shrinks the weights directly instead of being added to the gradient."""

    update_rule = staticmethod(adamw_update)  # Adam (adam.py) is this class with adam_update and decoupled = 0
    decoupled = 1.0
    state_names = ("exp_avg", "exp_avg_sq")  # and "max_exp_avg_sq" with amsgrad
    flat_kernel = adam_flat_kernel
    flat_hyper = ("lr", "betas", "eps", "weight_decay", "maximize")

    def __init__(self, params: Params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, maximize: bool = False) -> None:
        check_options(type(self).__name__, dict(lr=lr, eps=eps, weight_decay=weight_decay), dict(betas=betas))
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      amsgrad=amsgrad, maximize=maximize))

    def _flat_supported(self, group: dict, packed: bool = False) -> bool:
        return not group["amsgrad"]

    def _flat_hyper(self, group: dict) -> list[float]:
        return [*super()._flat_hyper(group), self.decoupled]

    def _update(self, p, state, group):
        if group["amsgrad"] and "max_exp_avg_sq" not in state:
            state["max_exp_avg_sq"] = zeros_like(p)
        v_max = state["max_exp_avg_sq"].data if group["amsgrad"] else None
        self.update_rule(p.data, p.grad.data, state["exp_avg"].data, state["exp_avg_sq"].data, v_max,
                         step=self._increment(state["step"]), **self._options(group))
