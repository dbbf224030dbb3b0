"""SophiaG: momentum divided by a diagonal Gauss-Newton-Bartlett Hessian estimate, clipped per coordinate.

Hong Liu, Zhiyuan Li, David Hall, Percy Liang, Tengyu Ma, "Sophia: A Scalable Stochastic Second-order Optimizer for
Language Model Pre-training" (arXiv:2305.14342, ICLR 2024); the formulas follow the authors' reference `SophiaG`.
Hyper-parameters (reference defaults): lr=1e-4, betas=(0.965, 0.99), rho=0.04, weight_decay=1e-1, eps=1e-15,
k=10 (refresh the Hessian every k steps: the training loop's job), bs=5120 (labels per batch: the reference's
`step(bs=5120)`). The reference's `maximize` and `capturable` options are left out.
    every step:   p *= 1 - lr * weight_decay;   m = beta1 * m + (1 - beta1) * g
                  p -= lr * sign(m) * min(|m| / (rho * bs * h + eps), 1)
    every k steps (update_hessian, after a backward of the loss on labels sampled from the model's own softmax):
                  h = beta2 * h + (1 - beta2) * g_hat^2
The paper's estimate is bs * g_hat^2 with the update clip(m / max(rho * h, eps), 1); the reference keeps bs out of
h and multiplies it in at the step (and adds eps instead of max): the same numbers for a fixed bs. The loop:

    opt = SophiaG(model.parameters(), bs=batch_size)   # bs: labels per batch (batch * sequence for a language model)
    k = opt.defaults["k"]
    for step, (x, y) in enumerate(batches):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        if step % k == k - 1:                          # the Gauss-Newton-Bartlett estimate, as the reference does it
            logits = model(x)
            loss = F.cross_entropy(logits, sample_labels(logits))
            opt.zero_grad(); loss.backward(); opt.update_hessian(); opt.zero_grad()

Both updates are elementwise: on the GPU a flat group takes one launch of sophiag_flat_kernel for each (refresh=0
for a step, 1 for the Hessian); elsewhere sophiag_update and sophiag_hessian_update run on the arrays (the twins).
"""
from frost.kernel import Array, bdx, bx, f32, i32, kernel, tx
from frost.ops.random import sample_categorical as sample_labels  # noqa: F401 - part of SophiaG's API
from frost.optim.optimizer import Optimizer, Params, array_module, check_options


def sophiag_update(p, g, m, h, *, step: float, lr: float, betas: tuple[float, float], rho: float, bs: float,
                   eps: float, weight_decay: float) -> None:
    """One SophiaG step on arrays (NumPy or CuPy), in place on p and m (h, the Hessian estimate, and step are only
    read; beta2 is the Hessian update's)."""
    xp, beta1 = array_module(p), betas[0]
    p *= 1 - lr * weight_decay
    m += (1 - beta1) * (g - m)
    p -= lr * xp.sign(m) * xp.minimum(xp.abs(m) / (rho * bs * h + eps), 1)


def sophiag_hessian_update(h, g, *, beta2: float) -> None:
    """h = beta2 * h + (1 - beta2) * g^2, in place, from the gradient of the loss on sampled labels."""
    h *= beta2
    h += (1 - beta2) * (g * g)


# ---------------------------------------------------------------- GPU kernel (twins: the two functions above)
# hyper = [step, lr, beta1, beta2, rho, bs, eps, weight_decay]; refresh=1 updates h, refresh=0 takes a step.
# sign(m) * min(|m| / d, 1) = clamp(m / d, -1, 1) as d > 0.

@kernel
def sophiag_flat_kernel(p: Array[f32], g: Array[f32], m: Array[f32], h: Array[f32], n: i32, hyper: Array[f32],
                        refresh: i32 = 0):
    i = bx * bdx + tx
    if i < n and refresh == 1:
        h[i] = hyper[3] * h[i] + (1 - hyper[3]) * g[i] * g[i]
    elif i < n:
        m[i] = m[i] + (1 - hyper[2]) * (g[i] - m[i])
        ratio = max(min(m[i] / (hyper[4] * hyper[5] * h[i] + hyper[6]), 1.0), -1.0)
        p[i] = p[i] * (1 - hyper[1] * hyper[7]) - hyper[1] * ratio


class SophiaG(Optimizer):
    """Sophia with the Gauss-Newton-Bartlett estimator; call update_hessian() every k steps (module docstring)."""

    state_names = ("exp_avg", "hessian")
    update_rule = staticmethod(sophiag_update)
    flat_kernel = sophiag_flat_kernel
    flat_hyper = ("lr", "betas", "rho", "bs", "eps", "weight_decay")

    def __init__(self, params: Params, lr: float = 1e-4, betas: tuple[float, float] = (0.965, 0.99), rho: float = 0.04,
                 weight_decay: float = 1e-1, eps: float = 1e-15, k: int = 10, bs: int = 5120) -> None:
        check_options("SophiaG", dict(lr=lr, rho=rho, weight_decay=weight_decay, eps=eps), dict(betas=betas),
                      {f"k ({k}) must be >= 1": k >= 1, f"bs ({bs}) must be > 0": bs > 0})
        super().__init__(params, dict(lr=lr, betas=tuple(betas), rho=rho, weight_decay=weight_decay, eps=eps,
                                      k=k, bs=bs))

    def update_hessian(self) -> None:
        """Fold the current gradients (of the loss on sampled labels) into the Hessian estimate h."""
        self._update_groups(self._update_hessian, lambda flat: self._flat_update(flat, 1), "update_hessian")

    def _update_hessian(self, p, state, group):
        sophiag_hessian_update(state["hessian"].data, p.grad.data, beta2=group["betas"][1])
