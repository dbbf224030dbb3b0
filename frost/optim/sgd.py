"""SGD with momentum, dampening, Nesterov momentum and L2 weight decay (PyTorch's update rule).

Nesterov momentum as formulated by Sutskever et al., "On the importance of initialization and momentum in deep
learning" (ICML 2013).
"""
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


# GPU kernel: a fused one-launch version of sgd_update over flat parameter/gradient/state buffers goes here,
# with sgd_update as its NumPy twin in the tests.


class SGD(Optimizer):
    """Stochastic gradient descent: p -= lr * (momentum-averaged) grad."""

    def __init__(self, params: Params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, maximize: bool = False) -> None:
        check_options("SGD", dict(lr=lr, momentum=momentum, weight_decay=weight_decay), rules={
            f"Nesterov momentum needs momentum > 0 and dampening = 0, got momentum={momentum}, dampening="
            f"{dampening}": not nesterov or (momentum > 0 and dampening == 0)})
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov, maximize=maximize))

    def _initial_state(self, p, group):
        return {}  # no step counter; the momentum buffer is a copy of the first gradient (PyTorch's state)

    def _update(self, p, state, group):
        buf = state.get("momentum_buffer")
        new_buf = sgd_update(p.data, p.grad.data, None if buf is None else buf.data, lr=group["lr"],
                             momentum=group["momentum"], dampening=group["dampening"],
                             weight_decay=group["weight_decay"], nesterov=group["nesterov"], maximize=group["maximize"])
        if buf is None and new_buf is not None:
            state["momentum_buffer"] = Tensor(new_buf)
