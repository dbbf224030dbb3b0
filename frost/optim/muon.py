"""Muon: momentum orthogonalized by Newton-Schulz for matrix weights, with an internal AdamW for the other parameters.

Keller Jordan et al., "Muon: An optimizer for hidden layers in neural networks" (blog post, 2024; reference code
in the KellerJordan/Muon repository: `zeropower_via_newtonschulz5`, `muon_update`, `MuonWithAuxAdam`).

Muon parameters (>= 2-D; a conv weight (out, in, kh, kw) is viewed as out x (in*kh*kw)), reference defaults:
    lr=0.02 (in units of spectral norm per update), momentum=0.95, nesterov=True, ns_steps=5, weight_decay=0
    buf = momentum * buf + (1 - momentum) * g;   u = g + momentum * (buf - g) if nesterov else buf
    O = NewtonSchulz5(u) ~ U V^T (coefficients 3.4445, -4.7750, 2.0315, on u / (||u||_F + 1e-7))
    p *= 1 - lr * weight_decay;   p -= lr * max(1, rows / cols) ** 0.5 * O
Everything else (biases, norm gains: < 2-D), and every parameter of a group given with `use_muon=False` (e.g. the
embedding and the output layer, as the reference advises), gets AdamW with the reference's auxiliary defaults:
    adam_lr=3e-4, adam_betas=(0.9, 0.95), adam_eps=1e-10, adam_weight_decay=0
A group mixing both kinds is split in two (the Muon part first), so `param_groups` may outnumber the groups given;
a `use_muon=False` group may set its own lr, weight_decay, betas and eps, as in the reference.

What runs where: the Newton-Schulz iteration is matrix products in array code (NumPy, or cuDNN on the GPU, which a
captured step allows), in float32 (float64 for float64 parameters), per parameter; the reference's bfloat16 is not
used (CuPy has no bfloat16 matmul). The AdamW groups on the GPU go flat: AdamW's one-launch kernel
(adamw.adam_flat_kernel). Differences from the reference: a parameter without a gradient is skipped (the reference
fills zeros, for its all-gather), and the rows/cols scale of a conv weight uses its 2-D view (the reference divides
the kernel's height by its width).
"""
from frost.ops.matmul import matmul_arrays
from frost.optim.adamw import adam_flat_kernel, adamw_update
from frost.optim.optimizer import Optimizer, Params, array_module, check_options
from frost.tensor import zeros_like


def zeropower_via_newtonschulz5(G, steps: int = 5):
    """U S' V^T with S' ~ 1 (roughly U V^T for G = U S V^T): the quintic Newton-Schulz iteration on a matrix."""
    if G.shape[0] > G.shape[1]:  # iterate on the wide side, where X @ X.T is the smaller product
        return zeropower_via_newtonschulz5(G.T, steps).T
    xp = array_module(G)
    a, b, c = 3.4445, -4.7750, 2.0315
    X = G.astype(xp.float64 if G.dtype == xp.float64 else xp.float32)
    X = X / (xp.sqrt(xp.sum(X * X)) + 1e-7)  # the Frobenius norm bounds the spectral norm: now ||X||_2 <= 1
    for _ in range(steps):
        A = matmul_arrays(xp, X, X.T)
        X = a * X + matmul_arrays(xp, b * A + c * matmul_arrays(xp, A, A), X)
    return X


def muon_update(p, g, buf, *, lr: float, momentum: float, nesterov: bool, ns_steps: int,
                weight_decay: float) -> None:
    """One Muon step on arrays (NumPy or CuPy), in place on p and the momentum buffer."""
    buf += (1 - momentum) * (g - buf)
    u = g + momentum * (buf - g) if nesterov else buf
    matrix = u.reshape(u.shape[0], -1)
    scale = max(1.0, matrix.shape[0] / matrix.shape[1]) ** 0.5
    p *= 1 - lr * weight_decay
    p -= (lr * scale * zeropower_via_newtonschulz5(matrix, ns_steps)).reshape(p.shape).astype(p.dtype)


class Muon(Optimizer):
    """Muon for the matrices, AdamW for the rest (MuonWithAuxAdam); `use_muon=False` in a group sends it to AdamW."""

    state_names = ("exp_avg", "exp_avg_sq")  # of the AdamW groups, which go flat on the GPU: AdamW's kernel
    update_rule = staticmethod(adamw_update)  # of the AdamW groups elsewhere
    flat_kernel = adam_flat_kernel
    flat_hyper = ("lr", "betas", "eps", "weight_decay")

    def __init__(self, params: Params, lr: float = 0.02, momentum: float = 0.95, nesterov: bool = True,
                 ns_steps: int = 5, weight_decay: float = 0.0, adam_lr: float = 3e-4,
                 adam_betas: tuple[float, float] = (0.9, 0.95), adam_eps: float = 1e-10,
                 adam_weight_decay: float = 0.0) -> None:
        check_options("Muon", dict(lr=lr, adam_lr=adam_lr, adam_eps=adam_eps, weight_decay=weight_decay,
                                   adam_weight_decay=adam_weight_decay), dict(adam_betas=adam_betas), {
            f"momentum ({momentum}) must be in [0, 1)": 0 <= momentum < 1, f"ns_steps ({ns_steps}) must be >= 1":
            ns_steps >= 1})
        self._adam_options = dict(lr=adam_lr, weight_decay=adam_weight_decay)
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps,
                                      weight_decay=weight_decay, betas=tuple(adam_betas), eps=adam_eps, use_muon=True))

    def add_param_group(self, param_group: dict) -> None:
        """Add a group; its < 2-D parameters (all of them with use_muon=False) form a second group, for AdamW."""
        super().add_param_group(param_group)  # checks the parameters and fills in the defaults
        group = self.param_groups.pop()
        muon = [group["use_muon"] and p.ndim >= 2 for p in group["params"]]
        if any(muon):
            self.param_groups.append({**group, "params": [p for p, m in zip(group["params"], muon) if m]})
        if not all(muon) or not any(muon):  # the user's own lr and weight decay for a use_muon=False group
            own = {k: v for k, v in param_group.items() if k in self._adam_options and not group["use_muon"]}
            self.param_groups.append({**group, **self._adam_options, **own, "use_muon": False,
                                      "params": [p for p, m in zip(group["params"], muon) if not m]})

    def _flat_supported(self, group: dict, packed: bool = False) -> bool:
        return not group["use_muon"]

    def _flat_hyper(self, group: dict) -> list[float]:
        return [*super()._flat_hyper(group), 0.0, 1.0]  # AdamW's kernel: not maximizing, decoupled weight decay

    def _initial_state(self, p, group):
        return {"momentum_buffer": zeros_like(p)} if group["use_muon"] else super()._initial_state(p, group)

    def _update(self, p, state, group):
        if not group["use_muon"]:
            return super()._update(p, state, group)  # AdamW's rule
        muon_update(p.data, p.grad.data, state["momentum_buffer"].data, lr=group["lr"], momentum=group["momentum"],
                    nesterov=group["nesterov"], ns_steps=group["ns_steps"], weight_decay=group["weight_decay"])
