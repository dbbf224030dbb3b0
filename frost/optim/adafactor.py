"""Adafactor: Adam-like steps whose second moment of a matrix is kept as a row and a column running average.

Shazeer & Stern, "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost" (ICML 2018), Algorithms 4
(weight matrices) and 5 (weight vectors): update clipping, the increasing decay rate, relative step sizes with
parameter scaling, and no first moment (beta1 = 0). At step t, with G the gradient and X the parameter before the step:

    beta2_t = 1 - t^beta2_decay                              # decay rate -0.8: beta2_1 = 0
    rho_t   = min(lr, 1 / sqrt(t))   (relative_step=True)    # the paper's min(1e-2, 1/sqrt(t)) at lr=1e-2
            = lr                     (relative_step=False)   # a fixed step size instead
    alpha_t = max(eps2, RMS(X)) * rho_t   (scale_parameter=True; else alpha_t = rho_t)
    matrix (and the last two dims of any tensor with ndim >= 2):
        R = beta2_t R + (1 - beta2_t) mean_cols(G^2 + eps1)   # shape (..., n, 1)
        C = beta2_t C + (1 - beta2_t) mean_rows(G^2 + eps1)   # shape (..., 1, m)
        V = R C / mean(R)                                     # the paper's R C / (1^T R), with means
    vector or scalar: V = beta2_t V + (1 - beta2_t) (G^2 + eps1)
    U = G / sqrt(V);  U = U / max(1, RMS(U) / d);  X = X * (1 - lr * weight_decay) - alpha_t U

Hyper-parameters (paper defaults): lr=1e-2 (the cap of the relative step), beta2_decay=-0.8, eps=(1e-30, 1e-3),
d=1.0 (clipping threshold), weight_decay=0.0 (not in the paper; decoupled and scaled by lr, as PyTorch does),
relative_step=True, scale_parameter=True. This is the paper's variant (eps1 added to G^2, as in the reference
tensor2tensor/fairseq code); PyTorch's Adafactor instead clamps V at eps1^2, which is the same update whenever
G^2 >> eps1. State uses PyTorch's names and shapes: 'step', 'row_var' (..., n, 1), 'col_var' (..., 1, m) for
ndim >= 2, 'variance' otherwise. Where it runs: `adafactor_update` is array code (NumPy, or CuPy for CUDA
parameters): the row/column means and the two RMS values are per-tensor reductions, so there is no flat launch;
the RMS values stay on the device (no host synchronisation).
"""
from __future__ import annotations

from typing import Iterable

from frost.optim.optimizer import Optimizer, array_module, check_options
from frost.tensor import Tensor, zeros, zeros_like


def adafactor_update(p, g, row_var, col_var, variance, *, lr: float, step: float, beta2_decay: float, eps1: float,
                     eps2: float, d: float, weight_decay: float, relative_step: bool, scale_parameter: bool) -> None:
    """One Adafactor step on arrays (NumPy or CuPy), in place on p and on (row_var, col_var) or variance."""
    xp = array_module(p)
    one_minus_beta2 = step ** beta2_decay
    rho = min(lr, step ** -0.5) if relative_step else lr
    alpha = xp.maximum(eps2, _rms(xp, p)) * rho if scale_parameter else rho
    g2 = g * g + eps1
    if variance is None:
        row_var += one_minus_beta2 * (g2.mean(axis=-1, keepdims=True) - row_var)
        col_var += one_minus_beta2 * (g2.mean(axis=-2, keepdims=True) - col_var)
        v = row_var / row_var.mean(axis=-2, keepdims=True) * col_var
    else:
        variance += one_minus_beta2 * (g2 - variance)
        v = variance
    # for a dead unit (zero gradient in its row and column) v ~ eps1^2 = 1e-60 underflows float32 to 0 and the
    # update would be 0 / 0: the floor keeps it 0 / tiny = 0 and changes nothing where v is representable
    u = g / xp.sqrt(xp.maximum(v, _TINY.get(str(v.dtype), 1e-38)))
    u /= xp.maximum(1.0, _rms(xp, u) / d).astype(u.dtype)
    p *= 1 - lr * weight_decay
    p -= (alpha * u).astype(p.dtype, copy=False)


_TINY = {"float64": 2.2250738585072014e-308}  # smallest normal numbers; float32 and bfloat16 share 1e-38


def _rms(xp, a):
    """Root mean square of a whole tensor, accumulated in at least float32."""
    a = a.astype(xp.float64 if a.dtype == xp.float64 else xp.float32, copy=False)
    return xp.sqrt(xp.mean(a * a))


class Adafactor(Optimizer):
    """Adafactor (factored second moments, update clipping, relative step sizes; no first moment)."""

    def __init__(self, params: Iterable[Tensor] | Iterable[dict], lr: float = 1e-2, beta2_decay: float = -0.8,
                 eps: tuple[float, float] = (1e-30, 1e-3), d: float = 1.0, weight_decay: float = 0.0,
                 relative_step: bool = True, scale_parameter: bool = True) -> None:
        check_options("Adafactor", dict(lr=lr, weight_decay=weight_decay, eps=tuple(eps)), rules={
            f"eps ({eps}) must be two numbers": len(eps) == 2, f"beta2_decay ({beta2_decay}) must be <= 0":
            beta2_decay <= 0, f"d ({d}) must be >= 1": d >= 1})
        super().__init__(params, dict(lr=lr, beta2_decay=beta2_decay, eps=tuple(eps), d=d, weight_decay=weight_decay,
                                      relative_step=relative_step, scale_parameter=scale_parameter))

    def step(self, closure=None):
        loss = self._evaluate(closure)
        for group in self._groups_to_step():
            for p in self._params_with_grad(group):
                state = self.state.setdefault(p, {})
                if not state:
                    state["step"] = self._new_step()
                    if p.ndim >= 2:
                        state["row_var"] = zeros((*p.shape[:-1], 1), dtype=p.dtype, device=p.device)
                        state["col_var"] = zeros((*p.shape[:-2], 1, p.shape[-1]), dtype=p.dtype, device=p.device)
                    else:
                        state["variance"] = zeros_like(p)
                factors = [state[k].data if k in state else None for k in ("row_var", "col_var", "variance")]
                adafactor_update(p.data, p.grad.data, *factors, lr=group["lr"], step=self._increment(state["step"]),
                                 beta2_decay=group["beta2_decay"], eps1=group["eps"][0], eps2=group["eps"][1],
                                 d=group["d"], weight_decay=group["weight_decay"],
                                 relative_step=group["relative_step"], scale_parameter=group["scale_parameter"])
        return loss
