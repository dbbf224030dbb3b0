"""SGD with momentum, dampening, Nesterov momentum and L2 weight decay (PyTorch's update rule).

Nesterov momentum as formulated by Sutskever et al., "On the importance of initialization and momentum in deep
learning" (ICML 2013). State: 'momentum_buffer' (a copy of the first gradient, then the running average), none
without momentum, as in PyTorch. Where it runs: on the GPU a float32 group with momentum is one launch of
`sgd_flat_kernel` over the flat buffers (its state then also holds the group's 'step' counter); elsewhere
`sgd_update` runs on the arrays (its twin).
"""
from frost.kernel import Array, bdx, bx, f32, i32, kernel, tx
from frost.optim.optimizer import Optimizer, Params, check_options
from frost.tensor import Tensor


def sgd_update(p, g, buf, *, lr: float, momentum: float = 0.0, dampening: float = 0.0, weight_decay: float = 0.0,
               nesterov: bool = False, maximize: bool = False):
    """One SGD step on arrays (NumPy or CuPy), in place on `p` and `buf`.

    `buf` is the momentum buffer, None before the first step; returns the buffer to keep (a copy of the
    first gradient on the first step, as PyTorch does), or None without momentum.
    """
    if maximize:
        g = -g
    if weight_decay != 0:
        g = g + weight_decay * p
    if momentum != 0:
        if buf is None:
            buf = g.copy()
        else:
            buf *= momentum
            buf += (1 - dampening) * g
        g = g + momentum * buf if nesterov else buf
    p -= lr * g
    return buf


# ---------------------------------------------------------------- GPU kernel (twin: sgd_update)
# hyper = [step, lr, momentum, dampening, weight_decay, nesterov, maximize]; at step 1 the buffer takes the gradient.

@kernel
def sgd_flat_kernel(p: Array[f32], g: Array[f32], buf: Array[f32], n: i32, hyper: Array[f32]):
    i = bx * bdx + tx
    if i < n:
        d = (1 - 2 * hyper[6]) * g[i] + hyper[4] * p[i]
        b = d if hyper[0] == 1 or hyper[2] == 0 else hyper[2] * buf[i] + (1 - hyper[3]) * d
        if hyper[2] > 0:  # momentum set to 0 after the group went flat: PyTorch leaves the buffer as it was
            buf[i] = b
        p[i] -= hyper[1] * (d + hyper[2] * b if hyper[5] > 0 else b)


class SGD(Optimizer):
    """Stochastic gradient descent: p -= lr * (momentum-averaged) grad."""

    state_names = ("momentum_buffer",)  # of the flat groups; the per-tensor path makes it on the first step
    flat_kernel = sgd_flat_kernel
    flat_hyper = ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize")

    def __init__(self, params: Params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, maximize: bool = False) -> None:
        check_options("SGD", dict(lr=lr, momentum=momentum, weight_decay=weight_decay), rules={
            f"Nesterov momentum needs momentum > 0 and dampening = 0, got momentum={momentum}, dampening="
            f"{dampening}": not nesterov or (momentum > 0 and dampening == 0)})
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov, maximize=maximize))

    def _flat_supported(self, group: dict, packed: bool = False) -> bool:
        return packed or group["momentum"] > 0  # without momentum no state (PyTorch's); the kernel serves momentum 0

    def _initial_state(self, p, group):
        return {}  # no step counter; the momentum buffer is a copy of the first gradient (PyTorch's state)

    def _update(self, p, state, group):
        buf = state.get("momentum_buffer")
        new_buf = sgd_update(p.data, p.grad.data, None if buf is None else buf.data, lr=group["lr"],
                             momentum=group["momentum"], dampening=group["dampening"],
                             weight_decay=group["weight_decay"], nesterov=group["nesterov"], maximize=group["maximize"])
        if buf is None and new_buf is not None:
            state["momentum_buffer"] = Tensor(new_buf)
