"""RMSprop: each coordinate's step divided by a running root mean square of its gradients (PyTorch's update rule).

Tieleman & Hinton, "Lecture 6.5 - rmsprop: Divide the gradient by a running average of its recent magnitude"
(COURSERA: Neural Networks for Machine Learning, 2012); the centered variant (the running variance instead of the
second moment) is from Graves, "Generating Sequences With Recurrent Neural Networks" (arXiv:1308.0850, 2013).
PyTorch's single-tensor RMSprop, in the same order:

    g = g + weight_decay * p                        # L2 decay through the gradient
    v = alpha * v + (1 - alpha) * g^2                # 'square_avg'
    m = m + (1 - alpha) * (g - m)                    # 'grad_avg', centered only
    avg = sqrt(v - m^2 if centered else v) + eps     # eps outside the root, as PyTorch (and unlike Keras)
    b = momentum * b + g / avg;  p = p - lr * b      # 'momentum_buffer', with momentum > 0
    p = p - lr * g / avg                             # without momentum

Hyper-parameters (PyTorch's defaults): lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0, centered=False.
State as PyTorch names it: 'step', 'square_avg', 'momentum_buffer' with momentum > 0, 'grad_avg' when centered.
The rule runs on the arrays (NumPy or CuPy) parameter by parameter: `rmsprop_update`.
"""
from frost.optim.optimizer import Optimizer, Params, array_module, check_options
from frost.tensor import zeros_like


def rmsprop_update(p, g, square_avg, grad_avg=None, momentum_buffer=None, *, step: float, lr: float, alpha: float,
                   eps: float, weight_decay: float, momentum: float, centered: bool, maximize: bool = False) -> None:
    """One RMSprop step on arrays, in place on p, square_avg, grad_avg (centered) and momentum_buffer (momentum > 0);
    step is counted, RMSprop does not use it."""
    xp = array_module(p)
    if maximize:
        g = -g
    if weight_decay != 0:
        g = g + weight_decay * p
    square_avg *= alpha
    square_avg += (1 - alpha) * (g * g)
    if centered:
        grad_avg += (1 - alpha) * (g - grad_avg)
        avg = xp.sqrt(square_avg - grad_avg * grad_avg)
    else:
        avg = xp.sqrt(square_avg)
    avg += eps
    if momentum > 0:
        momentum_buffer *= momentum
        momentum_buffer += g / avg
        p -= lr * momentum_buffer
    else:
        p -= lr * (g / avg)


class RMSprop(Optimizer):
    """RMSprop, optionally centered and with momentum, and L2 weight decay folded into the gradient."""

    state_names = ("square_avg", "grad_avg", "momentum_buffer")  # the last two only where the options need them
    update_rule = staticmethod(rmsprop_update)
    flat_hyper = ("lr", "alpha", "eps", "weight_decay", "momentum", "centered", "maximize")

    def __init__(self, params: Params, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False,
                 maximize: bool = False) -> None:
        check_options("RMSprop", dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum),
                      rules={f"alpha must be <= 1, got {alpha}": not alpha > 1})
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                                      centered=centered, maximize=maximize))

    def _initial_state(self, p, group):
        # as PyTorch's: the centered average and the momentum buffer exist only where the options use them
        state = {"step": self._new_step(), "square_avg": zeros_like(p)}
        self._add_optional_state(p, state, group)
        return state

    @staticmethod
    def _add_optional_state(p, state, group) -> None:
        """The buffers the group's options need and the state lacks (an option turned on after the first step)."""
        if group["momentum"] > 0 and "momentum_buffer" not in state:
            state["momentum_buffer"] = zeros_like(p)
        if group["centered"] and "grad_avg" not in state:
            state["grad_avg"] = zeros_like(p)

    def _update(self, p, state, group):
        self._add_optional_state(p, state, group)
        grad_avg = state["grad_avg"].data if group["centered"] else None
        buf = state["momentum_buffer"].data if group["momentum"] > 0 else None
        self.update_rule(p.data, p.grad.data, state["square_avg"].data, grad_avg, buf,
                         step=self._increment(state["step"]), **self._options(group))
