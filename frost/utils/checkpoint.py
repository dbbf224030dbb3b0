"""Activation checkpointing, as torch.utils.checkpoint: trade compute for memory.

    y = checkpoint(block, x)                  # block's activations are not kept: backward recomputes them
    y = checkpoint_sequential(model, 2, x)    # a Sequential (or list of callables) in segments

The forward runs under no_grad and keeps only its inputs. The result is made by one op (recorded as
"checkpoint") whose parents are the tensor arguments and the parameters of `function` when it is a Module (or
a Module's bound method); its backward reruns the forward with grad, on the same inputs and with the random state
of the first run restored (so dropout draws the same masks), and differentiates that with frost.autograd.grad.
A function that reaches parameters some other way (a lambda calling a module) still gets their gradients: the
recomputed graph's other leaves have theirs added to .grad directly, as PyTorch's reentrant checkpoint does.
use_reentrant is accepted and both values behave as described. When no input or known parameter requires grad
(grad mode on), the function runs as usual with its graph: its parameters could not be found otherwise.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable, Iterator, Sequence

from frost.backend import cuda as backend_cuda
from frost.autograd import _accumulate, complete_deferred_gradients, enable_grad, grad, is_grad_enabled, no_grad
from frost.nn.hooks import gathered
from frost.nn.module import Module
from frost.random import fork_rng, get_cuda_rng_state, get_rng_state, set_cuda_rng_state, set_rng_state
from frost.tensor import Tensor

__all__ = ["checkpoint", "checkpoint_sequential"]


def checkpoint(function: Callable, *args, use_reentrant: bool | None = None, preserve_rng_state: bool = True,
               **kwargs) -> Any:
    """function(*args, **kwargs) without keeping its activations for backward (see the module docstring)."""
    if not callable(function):
        raise TypeError(f"checkpoint: function must be callable, got {type(function).__name__}")
    return _checkpointed(function, args, kwargs, _parameters_of([function]), preserve_rng_state)


def checkpoint_sequential(functions: Module | Sequence[Callable], segments: int, input: Tensor,
                          use_reentrant: bool | None = None, preserve_rng_state: bool = True) -> Any:
    """Run `functions` (a Sequential or a list of callables) one after the other on `input`, split into `segments`
    parts of len // segments functions: every part but the last is checkpointed, as PyTorch's."""
    functions = list(functions.children()) if isinstance(functions, Module) else list(functions)
    if not isinstance(segments, int) or not 1 <= segments <= len(functions):
        raise ValueError(f"checkpoint_sequential: segments must be an int from 1 to the number of functions "
                         f"({len(functions)}), got {segments!r}")
    size = len(functions) // segments
    end = 0
    for start in range(0, size * (segments - 1), size):
        end = start + size
        part = functions[start:end]
        input = _checkpointed(_in_turn(part), (input,), {}, _parameters_of(part), preserve_rng_state)
    return _in_turn(functions[end:])(input)


def _in_turn(functions: list) -> Callable:
    def run(x):
        for f in functions:
            x = f(x)
        return x
    return run


def _parameters_of(functions: Iterable[Callable]) -> list:
    """The parameters of the Modules (or the Modules of bound methods) among `functions`, each once."""
    found: dict = {}
    for f in functions:
        owner = f if isinstance(f, Module) else getattr(f, "__self__", None)
        if isinstance(owner, Module):
            found.update((id(p), p) for p in owner.parameters())
    return list(found.values())


def _checkpointed(function: Callable, args: tuple, kwargs: dict, params: list, preserve_rng_state: bool) -> Any:
    inputs = [a for a in args if isinstance(a, Tensor)]
    parents = inputs + [p for p in params if p.requires_grad and all(p is not t for t in inputs)]
    if not (is_grad_enabled() and any(p.requires_grad for p in parents)):
        return function(*args, **kwargs)
    rng = _RandomState(inputs) if preserve_rng_state else None
    with no_grad():
        out = function(*args, **kwargs)
    outs = (out,) if isinstance(out, Tensor) else tuple(out) if isinstance(out, (tuple, list)) else None
    if outs is None:
        raise TypeError(f"checkpoint: the function must return a Tensor or a tuple of them, got "
                        f"{type(out).__name__}")
    index = [i for i, o in enumerate(outs) if isinstance(o, Tensor) and o.dtype.is_floating_point]

    def recompute(grads: list) -> list:
        return _recomputed_gradients(function, args, kwargs, parents, rng, index, grads)

    made = gathered(parents, [outs[i].data for i in index], recompute, "checkpoint")
    result = list(outs)
    for i, t in zip(index, made):
        result[i] = t
    if isinstance(out, Tensor):
        return result[0]
    return type(out)(*result) if hasattr(out, "_fields") else type(out)(result)  # a namedtuple takes fields


def _recomputed_gradients(function: Callable, args: tuple, kwargs: dict, parents: list, rng, index: list,
                          grads: list) -> list:
    """The gradients of `parents` from rerunning function with grad on detached copies of the tensor arguments."""
    stand_ins = {id(a): a.detach().requires_grad_(a.requires_grad) for a in args if isinstance(a, Tensor)}
    rerun_args = tuple(stand_ins.get(id(a), a) if isinstance(a, Tensor) else a for a in args)
    with enable_grad(), (rng.restored() if rng is not None else contextlib.nullcontext()):
        out = function(*rerun_args, **kwargs)
    outs = (out,) if isinstance(out, Tensor) else tuple(out)
    pairs = [(outs[i], g) for i, g in zip(index, grads) if g is not None and outs[i].requires_grad]
    wanted = [stand_ins.get(id(p), p) for p in parents]
    if not pairs:
        return [None] * len(parents)
    others = [leaf for leaf in _leaves(o for o, _ in pairs) if all(leaf is not w for w in wanted)]
    found = grad([o for o, _ in pairs], [w for w in wanted if w.requires_grad] + others,
                 [Tensor(g) for _, g in pairs], allow_unused=True)
    by_id = {id(w): g for w, g in zip([w for w in wanted if w.requires_grad] + others, found)}
    complete_deferred_gradients()  # a parameter's .grad may still be filling from an op that claimed it
    for leaf in others:
        if by_id[id(leaf)] is not None:
            _accumulate(Tensor, leaf, by_id[id(leaf)].data)
    return [None if by_id.get(id(w)) is None else by_id[id(w)].data for w in wanted]


def _leaves(outputs: Iterable[Tensor]) -> list:
    """The leaves that require grad in the graph of `outputs`, each once."""
    seen, leaves, stack = set(), [], list(outputs)
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if t._ctx is None:
            leaves.append(t)
        else:
            stack.extend(p for p in t._ctx.parents if p.requires_grad)
    return [t for t in leaves if t.requires_grad]


class _RandomState:
    """The CPU generator's state and that of each GPU the inputs are on, as the first forward saw them. A GPU's
    state is copied on the device (Philox keeps it there), not read to the host: a step captured by frost.jit may
    not read the device, and the copies, made and written back by kernels, replay with the graph."""

    def __init__(self, inputs: list) -> None:
        self.cpu = get_rng_state()
        gpus = {t.device.index or 0 for t in inputs if t.device.type == "cuda"}
        self.gpus = {index: _gpu_state(index) for index in sorted(gpus)}

    @contextlib.contextmanager
    def restored(self) -> Iterator[None]:
        """Those states for the block; the states from before it afterwards."""
        before = {index: _gpu_state(index) for index in self.gpus}
        try:
            with fork_rng(devices=[]):  # the CPU's state only: the GPUs' are handled here
                set_rng_state(self.cpu)
                for index, state in self.gpus.items():
                    _set_gpu_state(index, state)
                yield
        finally:
            for index, state in before.items():
                _set_gpu_state(index, state)


def _gpu_state(index: int) -> Any:
    """A copy of GPU `index`'s generator state: its device array copied there (a Philox generator), else the
    (seed, offset) bytes that get_cuda_rng_state reads from the device."""
    generator = backend_cuda.generator(index)
    if not hasattr(generator, "state"):
        return get_cuda_rng_state(index)
    with backend_cuda.gpu_cupy().cuda.Device(index):
        return generator.state.copy()


def _set_gpu_state(index: int, state: Any) -> None:
    generator = backend_cuda.generator(index)
    if isinstance(state, Tensor):
        set_cuda_rng_state(state, index)
        return
    with backend_cuda.gpu_cupy().cuda.Device(index):
        generator.state[...] = state  # in place: graphs that hold the state array see the change
