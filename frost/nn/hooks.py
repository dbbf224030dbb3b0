"""A module's full backward hooks (register_full_backward_hook, register_full_backward_pre_hook), as PyTorch's.

One module call routes its tensor inputs, and then its tensor outputs, each through a single tape node (a "pack":
one op whose parents are the tensors, read back through identity ops made from it), so that the node's backward
sees the gradients of all of them at once, as PyTorch's BackwardHookFunction does: the outputs' node runs the pre-
hooks and keeps grad_output; the inputs' node runs the hooks with grad_input and grad_output, and what a hook
returns replaces grad_input.
"""
from __future__ import annotations

from typing import Callable, Sequence

from frost.autograd import is_grad_enabled
from frost.tensor import Tensor, from_op, share_version

NAME = "BackwardHookFunction"


def through_one_node(tensors: Sequence[Tensor], on_gradients: Callable[[list], list]) -> list:
    """Stand-ins for `tensors` (the same arrays; those not requiring grad unchanged) whose gradients reach
    on_gradients together, as one list (None where none arrived); what it returns goes on to `tensors`."""
    hooked = [i for i, t in enumerate(tensors) if t.requires_grad]

    def on_hooked(grads: list) -> list:
        every = [None] * len(tensors)
        for i, g in zip(hooked, grads):
            every[i] = g
        return on_gradients(every)

    made = gathered(tensors, [tensors[i].data for i in hooked], on_hooked, NAME)
    stand_ins = list(tensors)
    for i, t in zip(hooked, made):
        stand_ins[i] = share_version(t, (tensors[i],))
    return stand_ins


def gathered(parents: Sequence[Tensor], arrays: Sequence, on_gradients: Callable[[list], list], name: str) -> list:
    """Tensors of `arrays` made by one op of `parents` (recorded as `name`) whose backward gets the gradients of
    all of them at once, as a list (None where none arrived), and returns the gradients of `parents`.

    The op is a scalar "pack" made from the parents; each array is read from it by an identity op that keeps
    its gradient aside, and the pack's backward, which the engine runs after all of them, hands them on."""
    first = next(p for p in parents if p.requires_grad)
    arrived: dict = {}

    def backward_of_pack(_):
        return tuple(on_gradients([arrived.pop(i, None) for i in range(len(arrays))]))

    pack = from_op(first.xp.zeros((), dtype=first.data.dtype), tuple(parents), backward_of_pack, name)
    return [from_op(a, (pack,), _kept_aside(arrived, i, pack), name) for i, a in enumerate(arrays)]


def _kept_aside(arrived: dict, i: int, pack: Tensor) -> Callable:
    zero = pack.xp.zeros((), dtype=pack.data.dtype)

    def backward(g):
        arrived[i] = g
        return (zero,)
    return backward


class BackwardHook:
    """The full backward hooks of one call of `module`: setup_inputs before forward, setup_outputs after it."""

    def __init__(self, module, hooks: list, pre_hooks: list) -> None:
        self.module, self.hooks, self.pre_hooks = module, hooks, pre_hooks
        self.grad_outputs: tuple | None = None
        self.n_inputs = 0
        self.inputs_hooked = False

    def setup_inputs(self, args: tuple) -> tuple:
        self.n_inputs = len(args)
        index = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        if not (is_grad_enabled() and any(args[i].requires_grad for i in index)):
            return args
        self.inputs_hooked = True
        stand_ins = through_one_node([args[i] for i in index], lambda grads: self._on_inputs(index, grads))
        new = list(args)
        for i, t in zip(index, stand_ins):
            new[i] = t
        return tuple(new)

    def setup_outputs(self, out):
        single = isinstance(out, Tensor)
        outs = (out,) if single else tuple(out) if isinstance(out, (tuple, list)) else ()
        index = [i for i, o in enumerate(outs) if isinstance(o, Tensor)]
        if not (is_grad_enabled() and any(outs[i].requires_grad for i in index)):
            return out
        stand_ins = through_one_node([outs[i] for i in index],
                                     lambda grads: self._on_outputs(index, len(outs), grads))
        new = list(outs)
        for i, t in zip(index, stand_ins):
            new[i] = t
        return new[0] if single else type(out)(*new) if hasattr(out, "_fields") else type(out)(new)

    def _on_outputs(self, index: list, n: int, grads: list) -> list:
        grad_outputs = _packed(index, grads, n)
        for hook in self.pre_hooks:
            result = hook(self.module, grad_outputs)
            if result is not None:
                grad_outputs = _checked(result, grad_outputs, "register_full_backward_pre_hook", "grad_output")
        self.grad_outputs = grad_outputs
        if not self.inputs_hooked:  # no input requires grad: the hooks run here, with grad_input all None
            for hook in self.hooks:
                hook(self.module, (None,) * self.n_inputs, grad_outputs)
        return [None if g is None else g.data for g in (grad_outputs[i] for i in index)]

    def _on_inputs(self, index: list, grads: list) -> list:
        if self.grad_outputs is None:  # the gradient reached the inputs without passing through the outputs
            return grads
        grad_inputs = _packed(index, grads, self.n_inputs)
        for hook in self.hooks:
            result = hook(self.module, grad_inputs, self.grad_outputs)
            if result is not None:
                grad_inputs = _checked(result, grad_inputs, "register_full_backward_hook", "grad_input")
        self.grad_outputs = None
        return [None if g is None else g.data for g in (grad_inputs[i] for i in index)]


def _packed(index: list, arrays: list, n: int) -> tuple:
    """Tensors of `arrays` at positions `index` of an n-tuple, None elsewhere (non-tensor arguments)."""
    out = [None] * n
    for i, a in zip(index, arrays):
        out[i] = None if a is None else Tensor(a)
    return tuple(out)


def _checked(result, expected: tuple, where: str, what: str) -> tuple:
    result = (result,) if isinstance(result, Tensor) else tuple(result)
    if len(result) != len(expected):
        raise RuntimeError(f"{where}: the hook returned {len(result)} values for {what}, expected {len(expected)}")
    for i, (new, old) in enumerate(zip(result, expected)):
        if new is not None and old is not None and tuple(new.shape) != tuple(old.shape):
            raise RuntimeError(f"{where}: the hook returned {what}[{i}] of shape {tuple(new.shape)}, expected "
                               f"{tuple(old.shape)}")
    return result
