"""LAMB: Adam's step rescaled per layer (per parameter tensor) by the trust ratio ||w|| / ||update||.

You, Li, Reddi, Hseu, Kumar, Bhojanapalli, Song, Demmel, Keutzer, Hsieh, "Large Batch Optimization for Deep
Learning: Training BERT in 76 minutes" (ICLR 2020), Algorithm 2 with phi the identity:

    m = beta1 * m + (1 - beta1) * g,   v = beta2 * v + (1 - beta2) * g^2
    r = (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
    u = r + weight_decay * w                                  # decoupled weight decay, inside the update
    w = w - lr * (||w|| / ||u||) * u                          # the ratio is 1 when either norm is 0

Hyper-parameters: lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01 (the paper's betas; eps and weight
decay as in its BERT setup, whose lr follows a warm-up + polynomial-decay schedule tuned per batch size). The
trust ratio is not clipped (the paper's phi(z) = min(max(z, gamma_l), gamma_u) is the identity here, as in the
reference codes).
Exclude biases and norm weights from decay with a second param group, as the paper's BERT setup does.
State: 'step', 'exp_avg', 'exp_avg_sq' (Adam's names). Where it runs: on the GPU a float32 group is one launch
of `lamb_flat_kernel` over the flat buffers, one block per parameter (its two norms are block sums); elsewhere
`lamb_update` runs on the arrays (its twin; on CuPy the trust ratio stays on the device, no host synchronisation).
"""
from frost.kernel import Array, bdx, block_sum, bx, device, f32, i32, kernel, shared, sqrt, tx
from frost.optim.optimizer import Optimizer, Params, array_module, check_options, whole_norm


def lamb_update(p, g, m, v, *, step: float, lr: float, betas: tuple[float, float], eps: float,
                weight_decay: float) -> None:
    """One LAMB step on arrays (NumPy or CuPy), in place on p, m, v."""
    xp, (beta1, beta2) = array_module(p), betas
    m += (1 - beta1) * (g - m)
    v *= beta2
    v += (1 - beta2) * (g * g)
    update = (m / (1 - beta1 ** step)) / (xp.sqrt(v / (1 - beta2 ** step)) + eps) + weight_decay * p
    w_norm, u_norm = whole_norm(p), whole_norm(update)
    trust = xp.where((w_norm > 0) & (u_norm > 0), w_norm / xp.where(u_norm > 0, u_norm, 1), 1)
    p -= (lr * trust).astype(p.dtype) * update


# ---------------------------------------------------------------- GPU kernel (twin: lamb_update)
# hyper = [step, lr, beta1, beta2, eps, weight_decay]; block b updates parameter b, whose elements are
# segments[2b] ... segments[2b] + segments[2b + 1] - 1 of the flat buffers. Pass 1 updates m and v and sums
# p^2 and u^2; pass 2 recomputes u from the new m and v (cheaper than storing it) and takes the step.

@device
def _lamb_direction(p, m, v, hyper):
    return m / (1 - pow(hyper[2], hyper[0])) / (sqrt(v / (1 - pow(hyper[3], hyper[0]))) + hyper[4]) + hyper[5] * p


@kernel
def lamb_flat_kernel(p: Array[f32], g: Array[f32], m: Array[f32], v: Array[f32], segments: Array[i32],
                     hyper: Array[f32]):
    start, end = segments[2 * bx], segments[2 * bx] + segments[2 * bx + 1]
    w2, u2 = 0.0, 0.0
    for i in range(start + tx, end, bdx):
        m[i] += (1 - hyper[2]) * (g[i] - m[i])
        v[i] = hyper[3] * v[i] + (1 - hyper[3]) * g[i] * g[i]
        u = _lamb_direction(p[i], m[i], v[i], hyper)
        w2 += p[i] * p[i]
        u2 += u * u
    scratch = shared(f32, 32)
    w2, u2 = block_sum(w2, scratch), block_sum(u2, scratch)
    trust = sqrt(w2 / u2) if w2 > 0 and u2 > 0 else 1.0
    for i in range(start + tx, end, bdx):
        p[i] -= hyper[1] * trust * _lamb_direction(p[i], m[i], v[i], hyper)


class LAMB(Optimizer):
    """Layer-wise Adaptive Moments for Batch training: Adam whose step per tensor is scaled to that tensor's norm."""

    state_names = ("exp_avg", "exp_avg_sq")
    update_rule = staticmethod(lamb_update)
    flat_kernel = lamb_flat_kernel
    flat_hyper = ("lr", "betas", "eps", "weight_decay")
    flat_per_parameter = True

    def __init__(self, params: Params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.01) -> None:
        check_options("LAMB", dict(lr=lr, eps=eps, weight_decay=weight_decay), dict(betas=betas))
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
