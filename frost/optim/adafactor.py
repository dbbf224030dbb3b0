"""Adafactor: Adam-like steps whose second moment of a matrix is kept as a row and a column running average.

Shazeer & Stern, "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost" (ICML 2018), Algorithms 4
(weight matrices) and 5 (weight vectors): update clipping, the increasing decay rate, relative step sizes with
parameter scaling, and no first moment (beta1 = 0). At step t, with G the gradient and X the parameter before the step:

    beta2_t = 1 - t^beta2_decay                              # decay rate -0.8: beta2_1 = 0
    alpha_t = max(eps2, RMS(X)) * min(lr, 1 / sqrt(t))       # the paper's relative step, capped at lr = 1e-2
    matrix (and the last two dims of any tensor with ndim >= 2):
        R = beta2_t R + (1 - beta2_t) mean_cols(G^2 + eps1)   # shape (..., n, 1)
        C = beta2_t C + (1 - beta2_t) mean_rows(G^2 + eps1)   # shape (..., 1, m)
        V = R C / mean(R)                                     # the paper's R C / (1^T R), with means
    vector or scalar: V = beta2_t V + (1 - beta2_t) (G^2 + eps1)
    U = G / sqrt(V);  U = U / max(1, RMS(U) / d);  X = X * (1 - lr * weight_decay) - alpha_t U

Hyper-parameters (paper defaults): lr=1e-2 (the cap of the relative step), beta2_decay=-0.8, eps=(1e-30, 1e-3),
d=1.0 (clipping threshold), weight_decay=0.0 (not in the paper; decoupled and scaled by lr, as PyTorch does). The
options are torch.optim.Adafactor's: the step is always relative (capped at lr) and scaled by RMS(X), without the
`relative_step` and `scale_parameter` switches of other implementations. This is the paper's variant (eps1 added
to G^2, as in the reference tensor2tensor/fairseq code); PyTorch's Adafactor instead clamps V at eps1^2, which is the
same update whenever G^2 >> eps1. State uses PyTorch's names and shapes: 'step', 'row_var' (..., n, 1), 'col_var'
(..., 1, m) for ndim >= 2, 'variance' otherwise. Where it runs: on the GPU a float32 group is one launch of
`adafactor_flat_kernel`, one block per parameter (the RMS values and the means of R are block sums and loops;
the factored state gets regions of its own size in the flat buffers); elsewhere `adafactor_update` runs on the
arrays (its twin; on CuPy the RMS values stay on the device, no host synchronisation).
"""
from frost.kernel import Array, bdx, block_sum, bx, f32, i32, kernel, rsqrt, shared, sqrt, static_range, tx
from frost.optim.optimizer import Optimizer, Params, array_module, check_options, whole_norm


def adafactor_update(p, g, row_var, col_var, *, step: float, lr: float, beta2_decay: float, eps: tuple[float, float],
                     d: float, weight_decay: float) -> None:
    """One Adafactor step on arrays (NumPy or CuPy), in place on p and on R and C, or on V (in row_var: col_var is
    None for ndim < 2)."""
    xp, (eps1, eps2), one_minus_beta2 = array_module(p), eps, step ** beta2_decay
    alpha = xp.maximum(eps2, whole_norm(p, rms=True)) * min(lr, step ** -0.5)
    g2 = g * g + eps1
    row_var += one_minus_beta2 * ((g2 if col_var is None else g2.mean(axis=-1, keepdims=True)) - row_var)
    if col_var is not None:
        col_var += one_minus_beta2 * (g2.mean(axis=-2, keepdims=True) - col_var)
    v = row_var if col_var is None else row_var / row_var.mean(axis=-2, keepdims=True) * col_var
    # for a dead unit (zero gradient in its row and column) v ~ eps1^2 = 1e-60 underflows float32 to 0 and the
    # update would be 0 / 0: the floor (the smallest normal float64; 1e-38 for float32 and bfloat16) keeps it
    # 0 / tiny = 0 and changes nothing where v is representable
    u = g / xp.sqrt(xp.maximum(v, 2.2250738585072014e-308 if v.dtype == xp.float64 else 1e-38))
    u /= xp.maximum(1.0, whole_norm(u, rms=True) / d).astype(u.dtype)
    p[...] = p * (1 - lr * weight_decay) - (alpha * u).astype(p.dtype, copy=False)


# ---------------------------------------------------------------- GPU kernel (twin: adafactor_update)
# hyper = [step, lr, beta2_decay, eps1, eps2, d, weight_decay]. Block b updates parameter b, seen as a stack of n x m
# matrices (a vector or a scalar as a stack of 1 x 1 matrices whose R is its V and which have no C, so that it needs
# no extra state). Pass 1 updates R (threads over rows, also summing X^2); then two sweeps over the columns
# (static_range: one loop, unrolled twice), where each thread sums the R of its matrix once per column for mean(R): the
# first updates C and sums U^2, the second takes the step. The optimizer base passes the last dims' strides and the
# state buffers' segments because Adafactor has a state_layout. Element (i, j) of matrix l lies at
# l // s * n * m * s + l % s + (i * m + j) * s in its parameter's region, where s is the last dim's stride: 1, or C
# for a channels-last (O, C, n, m) weight, whose matrix l = o * C + c lies C-strided in its (O, n, m, C) memory.

@kernel
def adafactor_flat_kernel(p: Array[f32], g: Array[f32], row: Array[f32], col: Array[f32], segments: Array[i32],
                          hyper: Array[f32], strides: Array[i32], row_segments: Array[i32], col_segments: Array[i32]):
    start, size, s = segments[2 * bx], segments[2 * bx + 1], strides[bx]
    ro, rows, co, cols = row_segments[2 * bx], row_segments[2 * bx + 1], col_segments[2 * bx], col_segments[2 * bx + 1]
    if size == 0:
        return
    m, n, x2, one_minus_beta2 = size // rows, size // cols if cols > 0 else 1, 0.0, pow(hyper[0], hyper[2])
    for r in range(tx, rows, bdx):  # row r % n of matrix r // n: m elements s apart
        e, acc = start + r // n // s * n * m * s + r // n % s + r % n * m * s, 0.0
        for k in range(e, e + m * s, s):
            acc += g[k] * g[k] + hyper[3]
            x2 += p[k] * p[k]
        row[ro + r] += one_minus_beta2 * (acc / m - row[ro + r])
    scratch = shared(f32, 32)
    x2 = block_sum(x2, scratch)  # its syncthreads also publishes the new R
    step, u2 = max(hyper[4], sqrt(x2 / size)) * min(hyper[1], rsqrt(hyper[0])), 0.0  # alpha; / max(1, RMS(U) / d) later
    for sweep in static_range(2):
        for c in range(tx, size // n, bdx):  # column c % m of matrix c // m: n elements m * s apart, from b; R from r0
            b, r0, total, acc = start + c // m // s * n * m * s + c // m % s + c % m * s, ro + c // m * n, 0.0, 0.0
            for i in range(n):
                total += row[r0 + i]
                acc += g[b + i * m * s] * g[b + i * m * s] + hyper[3]
            if sweep == 0 and cols > 0:
                col[co + c] += one_minus_beta2 * (acc / n - col[co + c])
            scale = col[co + c] * n / total if cols > 0 else 1.0  # V = R_i C_j / mean(R), or V itself (in R)
            for i in range(n):
                e = b + i * m * s
                u = g[e] / sqrt(max(row[r0 + i] * scale, 1e-38))
                u2 += u * u
                if sweep == 1:
                    p[e] = (1 - hyper[1] * hyper[6]) * p[e] - step * u
        if sweep == 0:
            step /= max(1.0, sqrt(block_sum(u2, scratch) / size) / hyper[5])


class Adafactor(Optimizer):
    """Adafactor (factored second moments, update clipping, relative step sizes; no first moment)."""

    state_names = ("row_var", "col_var")  # the flat buffers: R (or V, for ndim < 2) and C, as state_layout says
    update_rule = staticmethod(adafactor_update)
    flat_kernel = adafactor_flat_kernel
    flat_hyper = ("lr", "beta2_decay", "eps", "d", "weight_decay")

    def __init__(self, params: Params, lr: float = 1e-2, beta2_decay: float = -0.8,
                 eps: tuple[float, float] = (1e-30, 1e-3), d: float = 1.0, weight_decay: float = 0.0) -> None:
        check_options("Adafactor", dict(lr=lr, weight_decay=weight_decay, eps=tuple(eps)), rules={
            f"eps ({eps}) must be two numbers": len(eps) == 2, f"beta2_decay ({beta2_decay}) must be <= 0":
            beta2_decay <= 0, f"d ({d}) must be >= 1": d >= 1})
        super().__init__(params, dict(lr=lr, beta2_decay=beta2_decay, eps=tuple(eps), d=d, weight_decay=weight_decay))

    @staticmethod
    def state_layout(p) -> tuple:
        """(name, shape) of p's state in the flat buffers 'row_var' and 'col_var': R and C, or V and None (ndim < 2)."""
        if p.ndim < 2:
            return ("variance", p.shape), None
        return ("row_var", (*p.shape[:-1], 1)), ("col_var", (*p.shape[:-2], 1, p.shape[-1]))
