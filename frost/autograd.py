"""Reverse-mode automatic differentiation: the tape node, grad mode, anomaly mode and backward().

Two walks over the tape: the one of every backward() runs each op's backward closure on raw arrays (fast; the
gradients it makes have no graph), and the one of create_graph=True calls each op's Tensor-level backward, written
with Frost's ops next to the op's forward, so that the gradients it makes are on the tape and can be differentiated
again (a gradient penalty, a Hessian-vector product)."""
from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import os
import threading
from typing import Any, Callable, Sequence

import numpy as np

from frost import dispatch, layout
from frost.backend import cuda

_state = threading.local()


def is_grad_enabled() -> bool:
    return getattr(_state, "grad_enabled", True)


def _set_grad_enabled(mode: bool) -> None:
    _state.grad_enabled = mode


class set_grad_enabled(contextlib.ContextDecorator):
    """Turns recording of operations on or off (per thread): as a context manager, a decorator, or, like
    PyTorch's, as a plain call `frost.set_grad_enabled(False)` that takes effect at once."""

    def __init__(self, mode: bool) -> None:
        self.mode = bool(mode)
        self._applied = False
        if type(self) is set_grad_enabled:  # no_grad() and enable_grad() act only when entered
            self.prev = is_grad_enabled()
            _set_grad_enabled(self.mode)
            self._applied = True

    def _recreate_cm(self):
        # a fresh object per decorated call: recursive or concurrent calls must not share the saved state
        fresh = copy.copy(self)
        fresh._applied = False
        return fresh

    def __enter__(self):
        if not self._applied:
            self.prev = is_grad_enabled()
            _set_grad_enabled(self.mode)
        self._applied = False
        return self

    def __exit__(self, *exc) -> bool:
        _set_grad_enabled(self.prev)
        return False

    def __call__(self, func: Callable) -> Callable:
        if inspect.isgeneratorfunction(func):
            return _in_mode_at_each_step(self._recreate_cm, func)
        return super().__call__(func)


def _in_mode_at_each_step(mode: Callable, func: Callable) -> Callable:
    """A generator function whose body runs in the grad mode `mode()` at every step (and only then: the caller's
    code between the steps keeps its own mode), as PyTorch's decorated generators do."""
    @functools.wraps(func)
    def generator(*args, **kwargs):
        gen = func(*args, **kwargs)
        try:
            with mode():
                response = gen.send(None)
            while True:
                try:
                    request = yield response
                except GeneratorExit:
                    with mode():
                        gen.close()
                    raise
                except BaseException as e:
                    with mode():
                        response = gen.throw(e)
                else:
                    with mode():
                        response = gen.send(request)
        except StopIteration as stop:
            return stop.value
    return generator


class no_grad(set_grad_enabled):
    """Operations inside do not record a tape; `with frost.no_grad():`, `@frost.no_grad()` or `@frost.no_grad`
    (on generator functions too)."""

    def __new__(cls, func: Callable | None = None):
        return super().__new__(cls) if func is None else cls()(func)

    def __init__(self, func: Callable | None = None) -> None:
        super().__init__(False)


class enable_grad(set_grad_enabled):
    """Operations inside record a tape again (inside no_grad); as a context manager or a decorator."""

    def __new__(cls, func: Callable | None = None):
        return super().__new__(cls) if func is None else cls()(func)

    def __init__(self, func: Callable | None = None) -> None:
        super().__init__(True)


# ---------------------------------------------------------------- anomaly mode

_anomaly = {"on": os.environ.get("FROST_DETECT_ANOMALY", "") not in ("", "0")}


def is_anomaly_enabled() -> bool:
    return _anomaly["on"]


class detect_anomaly(contextlib.ContextDecorator):
    """Check every op's forward output and backward gradients for NaN and name the first op that made one (not its
    inputs); an optimizer's step also names a parameter whose gradient holds NaN or inf. Infinities in ops are not
    anomalies (-inf attention masks, sqrt's gradient at 0), as in PyTorch.

    Also on when the environment variable FROST_DETECT_ANOMALY=1 is set.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled

    def _recreate_cm(self):
        return copy.copy(self)

    def __enter__(self):
        self.prev = _anomaly["on"]
        _anomaly["on"] = self.enabled
        return self

    def __exit__(self, *exc) -> bool:
        _anomaly["on"] = self.prev
        return False


class AnomalyError(RuntimeError):
    """Raised in anomaly mode when an op produced NaN (or an optimizer step met a NaN or inf gradient)."""


def _has_nonfinite(array) -> bool:
    if array is None or array.dtype.kind not in "fc" and str(array.dtype) != "bfloat16":
        return False
    xp = _array_module(array)
    return not bool(xp.isfinite(array.astype(xp.float32) if str(array.dtype) == "bfloat16" else array).all())


def _array_module(array):
    import numpy as np
    if isinstance(array, np.ndarray):
        return np
    return cuda.cupy()


def _has_nan(array) -> bool:
    if array is None or array.dtype.kind not in "fc" and str(array.dtype) != "bfloat16":
        return False
    xp = _array_module(array)
    return bool(xp.isnan(array.astype(xp.float32) if str(array.dtype) == "bfloat16" else array).any())


def check_forward(name: str, out, inputs: Sequence) -> None:
    """In anomaly mode, raise if `out` holds NaN while the inputs did not. Infinities are not anomalies (a -inf
    attention mask, sqrt's gradient at 0), as in PyTorch's detect_anomaly, which looks for NaN."""
    if _has_nan(out) and not any(_has_nan(getattr(t, "data", None)) for t in inputs):
        shapes = ", ".join(str(tuple(getattr(t, "shape", ()))) for t in inputs)
        raise AnomalyError(f"anomaly: forward of '{name}' produced NaN (input shapes {shapes})")


# ---------------------------------------------------------------- the tape


class Node:
    """How a tensor was made: its parent tensors and the function from output gradient to input gradients (on arrays),
    and, for the ops that have one, `tensor_backward(grad_out, out)`: the same on Tensors, with Frost's ops (None: the
    op's gradient cannot be differentiated again; create_graph=True refuses it by name)."""

    __slots__ = ("parents", "backward", "name", "versions", "tensor_backward")

    def __init__(self, parents: tuple, backward: Callable, name: str, tensor_backward: Callable | None = None) -> None:
        self.parents = parents
        self.backward = backward
        self.name = name
        self.tensor_backward = tensor_backward
        # the parents' versions when the op read them: an in-place change after that (Tensor._values_change)
        # would feed backward values the op never saw
        self.versions = tuple(0 if (counter := p._version_counter) is None else counter[0] for p in parents)

    def __repr__(self) -> str:
        return f"<Node {self.name}>"


def _topological_order(root) -> list:
    """Tensors reachable from root through the tape, each after all tensors it was made from.

    Iterative depth-first post-order (no recursion limit on deep graphs). A tensor is marked when it
    is expanded, not when it is pushed, so that a tensor reached along two paths of different lengths
    (a diamond) still lands after every tensor it depends on.
    """
    order, expanded = [], set()
    stack = [(root, False)]
    while stack:
        t, done = stack.pop()
        if done:
            order.append(t)
            continue
        if id(t) in expanded:
            continue
        expanded.add(id(t))
        stack.append((t, True))
        if t._ctx is not None:
            for p in t._ctx.parents:
                if p.requires_grad and id(p) not in expanded:
                    stack.append((p, False))
    return order


def backward(root, gradient=None, retain_graph: bool | None = None, create_graph: bool = False) -> None:
    """Accumulate d(root)/d(leaf) into `.grad` of every leaf that requires grad.

    create_graph=True: the gradients are made with Frost's ops and keep their graph (each leaf's .grad then has one,
    as in PyTorch), so a second backward() can differentiate them; retain_graph defaults to create_graph. Every op
    on the way needs a Tensor-level backward (HIGHER_ORDER_OPS); another is refused by name before anything runs.
    """
    if not root.requires_grad:
        raise RuntimeError("backward: tensor does not require grad and has no grad_fn "
                           "(did you compute it under no_grad, or from tensors without requires_grad=True?)")
    xp = root.xp
    if gradient is None:
        if root.data.size != 1:
            raise RuntimeError(f"backward: grad can be implicitly created only for scalar outputs, "
                               f"but the tensor has shape {tuple(root.shape)}; pass gradient=")
        g0 = xp.ones(root.data.shape, dtype=root.data.dtype)
    else:
        g0 = gradient.data if isinstance(gradient, type(root)) else xp.asarray(gradient)
        if g0.dtype != root.data.dtype:
            g0 = g0.astype(root.data.dtype)
        if tuple(g0.shape) != tuple(root.shape):
            raise RuntimeError(f"backward: gradient shape {tuple(g0.shape)} does not match "
                               f"tensor shape {tuple(root.shape)}")
    if create_graph:
        seed = gradient if isinstance(gradient, type(root)) and gradient.dtype == root.dtype else type(root)(g0)
        _run_graph_backward((root,), [seed], retain_graph is not False, "backward")
        return
    claims: dict = {}  # id(leaf) -> its .grad buffer, claimed by an op through grad_destination()
    stack = _claim_stack()
    stack.append(claims)
    outer_callbacks = _begin_callbacks()
    try:
        _run_backward(root, g0, retain_graph, claims)
    finally:
        complete_deferred_gradients()
        end_callbacks, _state.end_callbacks = _state.end_callbacks, outer_callbacks
        stack.pop()
        for buffer in claims.values():
            # claimed but never accumulated (an error, or an op that claimed and returned None): the buffer
            # may hold part of a gradient; give it back as the zeros it was
            buffer[...] = 0
        if not stack:
            _zero_marks["epoch"] += 1  # a zero-grad mark lasts until the end of the next backward()
    for callback in end_callbacks:
        callback()


def grad(outputs, inputs, grad_outputs=None, retain_graph: bool | None = None, create_graph: bool = False,
         allow_unused: bool | None = None, materialize_grads: bool = False) -> tuple:
    """The gradients of `outputs` with respect to `inputs` (leaves or tensors made by ops), as a tuple in the order
    of `inputs`, without touching any .grad: torch.autograd.grad. Only the part of the graph between them runs.

    create_graph=True: the gradients are made with Frost's ops and keep their graph, so that they can be
    differentiated again (a WGAN-GP gradient penalty, a Hessian-vector product); retain_graph defaults to
    create_graph, as in PyTorch. Every op on the way needs a Tensor-level backward (HIGHER_ORDER_OPS lists the ops
    that have one); another is refused by name, with a RuntimeError, before anything runs."""
    if materialize_grads and allow_unused is False:
        raise ValueError("frost.autograd.grad: expected allow_unused to be True or not passed when "
                         "materialize_grads=True")
    outputs, inputs = _as_tensor_tuple(outputs, "outputs"), _as_tensor_tuple(inputs, "inputs")
    if not inputs:
        raise RuntimeError("frost.autograd.grad: inputs is empty; pass the tensors to differentiate with respect to")
    for i, t in enumerate(inputs):
        if not t.requires_grad:
            raise RuntimeError(f"frost.autograd.grad: input {i} (shape {tuple(t.shape)}) does not require grad")
    capture = dict.fromkeys(map(id, inputs))
    if create_graph:
        seeds = _seed_tensors(outputs, grad_outputs)
        _run_graph_backward(outputs, seeds, retain_graph is not False, "frost.autograd.grad", capture)
        return tuple(_captured(t, i, capture[id(t)], allow_unused or materialize_grads, materialize_grads)
                     for i, t in enumerate(inputs))
    sink = _gradient_sink(outputs, _output_gradients(outputs, grad_outputs))
    stack = _claim_stack()
    stack.append(None)  # ops may not claim a .grad buffer: grad() leaves every .grad as it is
    outer_callbacks = _begin_callbacks()
    try:
        _run_backward(sink, sink.xp.ones((), dtype=sink.data.dtype), bool(retain_graph), {}, capture)
    finally:
        complete_deferred_gradients()
        end_callbacks, _state.end_callbacks = _state.end_callbacks, outer_callbacks
        stack.pop()
    for callback in end_callbacks:
        callback()
    return tuple(_captured(t, i, capture[id(t)], allow_unused or materialize_grads, materialize_grads)
                 for i, t in enumerate(inputs))


def _as_tensor_tuple(value, what: str) -> tuple:
    Tensor = _tensor_type()
    items = (value,) if isinstance(value, Tensor) else tuple(value)
    for i, t in enumerate(items):
        if not isinstance(t, Tensor):
            raise TypeError(f"frost.autograd.grad: {what}[{i}] must be a Tensor, got {type(t).__name__}")
    return items


_registered = {}


def register_tensor_type(cls: type) -> None:
    """frost.tensor registers its Tensor class here when it is defined: this lower module cannot import it."""
    _registered["Tensor"] = cls


def _tensor_type():
    return _registered["Tensor"]


def _output_gradients(outputs: tuple, grad_outputs) -> list:
    """The starting gradient array of each output: grad_outputs[i], or ones for a scalar output given None."""
    Tensor = _tensor_type()
    given = [None] * len(outputs) if grad_outputs is None else list(
        (grad_outputs,) if isinstance(grad_outputs, Tensor) else grad_outputs)
    if len(given) != len(outputs):
        raise RuntimeError(f"frost.autograd.grad: grad_outputs has {len(given)} tensors but outputs has "
                           f"{len(outputs)}")
    arrays = []
    for i, (out, g) in enumerate(zip(outputs, given)):
        if not out.requires_grad:
            raise RuntimeError(f"frost.autograd.grad: element {i} of outputs (shape {tuple(out.shape)}) does not "
                               f"require grad and does not have a grad_fn")
        if g is None:
            if out.data.size != 1:
                raise RuntimeError(f"frost.autograd.grad: grad can be implicitly created only for scalar outputs, "
                                   f"but outputs[{i}] has shape {tuple(out.shape)}; pass grad_outputs")
            g = out.xp.ones(out.data.shape, dtype=out.data.dtype)
        else:
            g = g.data if isinstance(g, Tensor) else out.xp.asarray(g)
            if tuple(g.shape) != tuple(out.shape):
                raise RuntimeError(f"frost.autograd.grad: grad_outputs[{i}] has shape {tuple(g.shape)} but "
                                   f"outputs[{i}] has shape {tuple(out.shape)}")
            g = g.astype(out.data.dtype, copy=False)
        arrays.append(g)
    return arrays


def _gradient_sink(outputs: tuple, gradients: list):
    """A scalar made from every output, whose backward hands each output its starting gradient: one backward pass
    from it runs the outputs' shared graph once."""
    Tensor = _tensor_type()
    first = outputs[0]
    sink = Tensor(first.xp.zeros((), dtype=first.data.dtype))
    sink.requires_grad = True
    sink._ctx = Node(outputs, lambda _: gradients, "grad")
    return sink


def _leading_to(order: list, targets: dict) -> set:
    """The ids of the tensors of `order` (parents first) whose gradient flows on to one of `targets`; a graph freed
    by an earlier backward counts as leading there (its links are gone), so that running it again is refused."""
    leads = set()
    for t in order:
        node = t._ctx
        if id(t) in targets or (node is not None and (node.backward is None
                                                      or any(id(p) in leads for p in node.parents))):
            leads.add(id(t))
    return leads


def _captured(t, i: int, g, allow_unused: bool, materialize: bool):
    """Input t's gradient as a Tensor of its dtype (a copy: an op may hand one array to several inputs)."""
    Tensor = _tensor_type()
    if g is None:
        if not allow_unused:
            raise RuntimeError(f"frost.autograd.grad: input {i} (shape {tuple(t.shape)}) appears to not have been "
                               f"used in the graph; set allow_unused=True if this is the desired behavior")
        return Tensor(t.xp.zeros(t.data.shape, dtype=t.data.dtype)) if materialize else None
    if isinstance(g, Tensor):  # create_graph: the gradient itself, with its graph
        return g if g.dtype == t.dtype else g.to(t.dtype)
    return Tensor(g.astype(t.data.dtype, copy=True))


def _check_versions(node: Node) -> None:
    """Refuse, as PyTorch does, to run a backward whose inputs were changed in place after its op read them."""
    for i, (p, version) in enumerate(zip(node.parents, node.versions)):
        if p._version != version:
            raise RuntimeError(f"backward of '{node.name}': its input {i} (shape {tuple(p.shape)}, {p.dtype}) was "
                               f"changed in place after '{node.name}' used it (version {p._version}, used at "
                               f"version {version}), so its gradient would use values the op never saw; change a "
                               f"copy (x.clone()), or change it after backward()")


def _run_backward(root, g0, retain_graph: bool, claims: dict, capture: dict | None = None) -> None:
    """Backpropagate g0 from root: into the .grad of leaves (and of tensors that retain grad), or, with `capture`
    (id -> None for the tensors wanted), into capture[id] only, running just the part of the graph leading there."""
    Tensor = type(root)
    anomaly = is_anomaly_enabled()
    grads = {id(root): g0}
    owned: set = set()   # ids whose gradient so far is one contribution a `fresh_gradients` backward allocated
    order = _topological_order(root)
    leads = None if capture is None else _leading_to(order, capture)
    # inf - inf in a sum of gradients is nan without a NumPy warning, as in PyTorch (anomaly mode finds it)
    with no_grad(), np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for t in reversed(order):
            g = _read(grads.pop(id(t), None))
            if g is None or (leads is not None and id(t) not in leads):
                continue
            node = t._ctx
            hooks = t.__dict__.get("_grad_hooks")
            if isinstance(g, GradientPair) and (node is None or t._retains_grad or hooks or leads is not None
                                                or not getattr(node.backward, "takes_gradient_pairs", False)):
                g = sum_of_gradients(*g)
            if (hooks or t._retains_grad) and node is not None and _holds_claim(g):
                complete_deferred_gradients()  # a claimed .grad buffer passed on (autocast's cast): read below
            if hooks:
                g = _run_hooks(t, g, hooks)
            if leads is not None:
                if id(t) in capture:
                    capture[id(t)] = g
                if node is None or (node.backward is not None and not any(id(p) in leads for p in node.parents)):
                    continue
            elif node is None or t._retains_grad:
                # a leaf's fresh gradient, seen by no hook, becomes its .grad as it is (no copy)
                _accumulate(Tensor, t, g, claims.pop(id(t), None), owned=node is None and not hooks and id(t) in owned)
                for hook in t.__dict__.get("_post_accumulate_hooks", ()):
                    hook(t)
            if node is None:
                continue
            if node.backward is None:
                raise RuntimeError(f"backward: trying to go through the graph of '{node.name}' a second time; "
                                   f"pass retain_graph=True to the first backward()")
            _check_versions(node)
            so_far = _gradients_so_far(node, grads) if leads is None else None
            in_grads = node.backward(g) if so_far is None else node.backward(g, so_far)
            parents = node.parents
            fresh = getattr(node.backward, "fresh_gradients", False)
            if not retain_graph:
                # free the graph as we go, as PyTorch does: the closure's saved arrays, and the links to the
                # parents, so that a loss kept alive (say until the next step) does not keep every activation
                node.backward, node.parents, node.tensor_backward = None, (), None
            for p, pg in zip(parents, in_grads):
                if pg is None or not p.requires_grad:
                    continue
                if anomaly:
                    complete_deferred_gradients()  # the check reads every gradient as it is produced
                    pg = _read(pg)
                if anomaly and _has_nan(pg) and not any(map(_has_nan, _parts(g))):
                    raise AnomalyError(f"anomaly: backward of '{node.name}' produced NaN in the gradient of an "
                                       f"input of shape {tuple(p.shape)}")
                if tuple(pg.shape) != tuple(p.shape):
                    raise RuntimeError(f"backward of '{node.name}': gradient shape {tuple(pg.shape)} "
                                       f"does not match input shape {tuple(p.shape)} (a bug in that op)")
                k = id(p)
                # out of place: grads[k] may be a claimed .grad buffer, which must keep its own contribution
                if k in grads:
                    owned.discard(k)
                    grads[k] = _combine(grads[k], pg, p)
                else:
                    grads[k] = pg
                    if fresh:
                        owned.add(k)


def _gradients_so_far(node, grads: dict) -> list | None:
    """For a backward that adds its inputs' gradients to theirs so far (`adds_to_gradients`, LayerNorm's on a residual
    stream: one pass instead of a second one summing them), each non-leaf parent's plain gradient so far, taken out
    of `grads` (the backward's answer includes it), else None."""
    if not getattr(node.backward, "adds_to_gradients", False):
        return None
    plain = [id(p) in grads and type(grads[id(p)]) is type(p.data) and p._ctx is not None and not p._retains_grad
             and not p.__dict__.get("_grad_hooks") and not _holds_claim(grads[id(p)]) for p in node.parents]
    return [grads.pop(id(p), None) if take else None for p, take in zip(node.parents, plain)]  # a parent twice: once


# ---------------------------------------------------------------- higher-order gradients (create_graph=True)

# the ops whose gradient create_graph=True can make (their from_op is given a Tensor-level backward), for the error
HIGHER_ORDER_OPS = ("abs", "add", "binary_cross_entropy_with_logits", "cast", "cat", "ceil", "clamp", "clone",
                    "contiguous", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                    "conv_transpose3d", "cos", "cross_entropy", "div", "erf", "exp", "expand", "expm1", "flip",
                    "floor", "gelu", "index", "index_backward", "leaky_relu", "linear", "log", "log1p", "log_softmax",
                    "masked_fill", "matmul", "mean", "mse_loss", "mul", "neg", "nll_loss", "pad", "permute", "pow",
                    "reciprocal", "relu", "reshape", "round", "rsqrt", "sigmoid", "sign", "silu", "sin", "softmax",
                    "softplus", "sqrt", "sub", "sum", "tanh", "to_device", "where")


def _seed_tensors(outputs: tuple, grad_outputs) -> list:
    """The starting gradient of each output as a Tensor: a given Tensor itself (its graph kept, as PyTorch keeps
    it), else ones or the given values."""
    Tensor = _tensor_type()
    arrays = _output_gradients(outputs, grad_outputs)
    given = [None] * len(outputs) if grad_outputs is None else list(
        (grad_outputs,) if isinstance(grad_outputs, Tensor) else grad_outputs)
    return [g if isinstance(g, Tensor) and g.dtype == out.dtype else Tensor(a)
            for g, out, a in zip(given, outputs, arrays)]


def _run_graph_backward(outputs: tuple, seeds: list, retain_graph: bool, caller: str,
                        capture: dict | None = None) -> None:
    """_run_backward on Tensors, in grad mode: each node's tensor_backward makes its parents' gradients with Frost's
    ops, summed with `+`, so every gradient has a graph. Into leaves' .grad (out of place, as PyTorch's does then),
    or, with `capture`, into capture[id] only."""
    Tensor = _tensor_type()
    sink = Tensor(np.zeros(()))
    sink._ctx = Node(tuple(outputs), None, "grad")
    order = _topological_order(sink)[:-1]
    leads = None if capture is None else _leading_to(order, capture)
    _refuse_underivable(order, leads, caller)
    grads: dict = {}
    for out, seed in zip(outputs, seeds):
        grads[id(out)] = seed if id(out) not in grads else grads[id(out)] + seed
    with enable_grad():
        for t in reversed(order):
            g = grads.pop(id(t), None)
            if g is None or (leads is not None and id(t) not in leads):
                continue
            node = t._ctx
            for hook in list(t.__dict__.get("_grad_hooks", {}).values()):
                result = hook(g)
                g = g if result is None else result
            if leads is not None:
                if id(t) in capture:
                    capture[id(t)] = g
                if node is None or not any(id(p) in leads for p in node.parents):
                    continue
            elif node is None or t._retains_grad:
                _accumulate_graph(t, g)
            if node is None:
                continue
            _check_versions(node)
            in_grads, parents = node.tensor_backward(g, t), node.parents
            if not retain_graph:
                node.backward, node.parents, node.tensor_backward = None, (), None
            for p, pg in zip(parents, in_grads):
                if pg is None or not p.requires_grad:
                    continue
                if tuple(pg.shape) != tuple(p.shape):
                    raise RuntimeError(f"Tensor-level backward of '{node.name}': gradient shape {tuple(pg.shape)} "
                                       f"does not match input shape {tuple(p.shape)} (a bug in that op)")
                grads[id(p)] = pg if id(p) not in grads else grads[id(p)] + pg


def _refuse_underivable(order: list, leads: set | None, caller: str) -> None:
    """Before anything runs: every node the gradients will go through must still be there and have a tensor_backward."""
    for t in order:
        node = t._ctx
        if node is None or (leads is not None and id(t) not in leads):
            continue
        if node.backward is None:
            raise RuntimeError(f"{caller}: trying to go through the graph of '{node.name}' a second time; pass "
                               f"retain_graph=True to the first backward()")
        if leads is not None and not any(id(p) in leads for p in node.parents):
            continue
        if node.tensor_backward is None:
            raise RuntimeError(f"{caller}(create_graph=True): the backward of '{node.name}' is not differentiable "
                               f"in Frost yet (ops that are: {', '.join(HIGHER_ORDER_OPS)})")


def _accumulate_graph(t, g) -> None:
    """Leaf t's .grad = its gradient g with g's graph (a copy: g may be another tensor's gradient too), or the old
    .grad + g (out of place, so the old .grad's graph is kept), as PyTorch's does under create_graph=True."""
    _spend_zero_mark(t)
    _check_float_leaf(t)
    g = g if g.dtype == t.dtype else g.to(t.dtype)
    t.grad = g.clone() if t.grad is None else t.grad + g
    for hook in t.__dict__.get("_post_accumulate_hooks", ()):
        hook(t)


def _begin_callbacks() -> list:
    """Give the starting backward() (or grad()) its own list of end callbacks and return the enclosing one's: a
    backward inside a backward (checkpoint's recompute runs grad() inside the outer backward) must not run the
    callbacks that the outer one's hooks queued before the outer one has finished."""
    outer = getattr(_state, "end_callbacks", [])
    _state.end_callbacks = []
    return outer


def queue_callback(callback: Callable[[], None]) -> None:
    """Run `callback()` when the running backward() has finished every gradient (not when it fails): data-parallel
    training waits there for the gradients it is averaging."""
    if not _claim_stack():
        raise RuntimeError("queue_callback: call it from inside backward() (a hook), not outside")
    _state.end_callbacks.append(callback)


def register_post_accumulate_grad_hook(t, hook: Callable) -> None:
    """Have backward() call `hook(t)` each time it has added a gradient into leaf t's .grad (PyTorch's
    Tensor.register_post_accumulate_grad_hook): data-parallel training starts averaging a bucket of gradients as
    soon as its last one is in."""
    if t._ctx is not None or not t.requires_grad:
        raise RuntimeError(f"register_post_accumulate_grad_hook: only a leaf tensor that requires grad has a .grad "
                           f"(shape {tuple(t.shape)})")
    t.__dict__.setdefault("_post_accumulate_hooks", []).append(hook)


class RemovableHandle:
    """What Tensor.register_hook returns: remove() unregisters the hook (a second remove() does nothing)."""

    def __init__(self, hooks: dict, key: int) -> None:
        self._hooks, self._key = hooks, key

    def remove(self) -> None:
        self._hooks.pop(self._key, None)


def register_hook(t, hook: Callable) -> RemovableHandle:
    """Have backward() call `hook(grad)` with t's whole gradient (all contributions summed) before it reaches t's
    .grad (a leaf) or the op that made t; a tensor the hook returns replaces the gradient, None keeps it."""
    if not t.requires_grad:
        raise RuntimeError(f"register_hook: cannot register a hook on a tensor (shape {tuple(t.shape)}) that does not "
                           f"require grad")
    if not callable(hook):
        raise TypeError(f"register_hook: the hook must be callable, got {type(hook).__name__}")
    hooks = t.__dict__.setdefault("_grad_hooks", {})
    key = max(hooks, default=-1) + 1
    hooks[key] = hook
    return RemovableHandle(hooks, key)


def _run_hooks(t, g, hooks: dict):
    """t's gradient array after its hooks, in the order they were registered."""
    complete_deferred_gradients()  # a hook reads the gradient, which may be a claimed .grad buffer still filling
    Tensor = type(t)
    g = g if g.dtype == t.data.dtype else g.astype(t.data.dtype)  # a product's float32 gradient of a 16-bit cast
    for hook in list(hooks.values()):
        result = hook(Tensor(g))
        if result is None:
            continue
        new = result.data if isinstance(result, Tensor) else result
        if tuple(new.shape) != tuple(t.shape) or type(new) is not type(g):
            raise RuntimeError(f"register_hook: a hook on a tensor of shape {tuple(t.shape)} returned a gradient of "
                               f"shape {tuple(new.shape)} ({type(new).__name__}); it must keep the shape and device")
        g = new if new.dtype == g.dtype else new.astype(g.dtype)
    return g


class GradientPair(tuple):
    """Two gradient contributions to one tensor, not yet added: the backward of the op that made the tensor gets
    them as they are when it says it can (its backward function's attribute `takes_gradient_pairs = True`; channels-
    last batch norm adds them as it loads them: a residual block's input gradient without an add kernel)."""


class PlacedGradient:
    """Gradient contributions g_i, each placed at a basic index idx_i (slices, integers) of zeros of one shape, not
    yet summed: the gradients of slices of one tensor (split, chunk, getitem). Read (array) when the tensor's own
    backward runs: slices that tile one dim join (a view, where the contributions lie side by side in one block,
    as flash attention writes the gradients of q, k and v; else one concatenation), others are added into zeros.
    Without it, each slice's gradient is a full-size array of zeros and the sum of them one more full-size pass
    per slice."""
    __slots__ = ("xp", "shape", "dtype", "parts")

    def __init__(self, xp, shape: tuple, dtype, parts: list) -> None:
        self.xp, self.shape, self.dtype, self.parts = xp, tuple(shape), dtype, parts

    def joins(self, other: PlacedGradient) -> bool:
        return self.xp is other.xp and self.shape == other.shape and self.dtype == other.dtype

    def joined(self, other: PlacedGradient) -> PlacedGradient:
        return PlacedGradient(self.xp, self.shape, self.dtype, self.parts + other.parts)

    def array(self):
        xp = self.xp
        tiles = _tiling(self.parts, self.shape)
        if tiles is not None:
            axis, pieces = tiles
            if len(pieces) == 1:
                return pieces[0]
            joined = layout.joined_view(pieces, axis)
            return joined if joined is not None else xp.concatenate(pieces, axis=axis)
        out = xp.zeros(self.shape, dtype=self.dtype)
        for idx, g in self.parts:
            out[idx] += g
        return out


def _tiling(parts: list, shape: tuple):
    """(axis, contributions in order) where the parts' indices are slices of one dim (every other dim whole) that
    cover it once, from 0 to its end, with contributions of the full shape; else None."""
    spans = []
    for idx, g in parts:
        if not isinstance(idx, tuple) or len(idx) > len(shape) or not all(isinstance(i, slice) for i in idx):
            return None
        ranges = [i.indices(n) for i, n in zip(idx, shape)]
        cut = [d for d, (lo, hi, step) in enumerate(ranges) if (lo, hi, step) != (0, shape[d], 1)]
        if len(cut) > 1 or g.ndim != len(shape) or (cut and ranges[cut[0]][2] != 1):
            return None
        spans.append((cut[0] if cut else None, ranges[cut[0]][:2] if cut else (0, 0), g))
    axes = {a for a, _, _ in spans}
    if len(axes) != 1 or None in axes:
        return None
    spans.sort(key=lambda s: s[1][0])
    end = 0
    axis = spans[0][0]
    for _, (lo, hi), g in spans:
        if lo != end or g.shape[axis] != hi - lo:
            return None
        end = hi
    return (axis, [g for _, _, g in spans]) if end == shape[axis] else None


def _read(g):
    """A PlacedGradient summed into its array; any other gradient as it is."""
    return g.array() if isinstance(g, PlacedGradient) else g


def _parts(g) -> tuple:
    return tuple(g) if isinstance(g, GradientPair) else (g,)


def _holds_claim(g) -> bool:
    """Whether g is (or holds) a .grad buffer claimed in the running backward(), which may still be filling."""
    stack = getattr(_state, "claims", None)
    return bool(stack) and stack[-1] is not None and any(p is b for p in _parts(g) for b in stack[-1].values())


def _combine(a, b, p):
    """The gradient so far plus contribution b: a GradientPair where p's op takes pairs and a and b are alike."""
    if isinstance(a, PlacedGradient) and isinstance(b, PlacedGradient) and a.joins(b):
        return a.joined(b)
    a, b = _read(a), _read(b)
    ctx = p._ctx
    if ctx is None or _holds_claim(a) or _holds_claim(b):
        complete_deferred_gradients()  # a leaf's second contribution, or a claimed buffer passed on: the sum reads it
    if (not isinstance(a, GradientPair) and ctx is not None and not p._retains_grad
            and getattr(ctx.backward, "takes_gradient_pairs", False) and a.dtype == b.dtype and a.shape == b.shape):
        return GradientPair((a, b))
    return sum_of_gradients(*_parts(a), b) if isinstance(a, GradientPair) else sum_of_gradients(a, b)


def sum_of_gradients(a, b, c=None):
    """a + b (+ c) (out of place) in a's memory format: CuPy's add would answer channels-last operands in C order,
    and the next op (batch norm, a convolution) would have to convert it back."""
    if c is not None:
        return sum_of_gradients(sum_of_gradients(a, b), c)
    if a.dtype == b.dtype and a.shape == b.shape and layout.is_channels_last(a):
        # added as the dense NHWC arrays they are (CuPy's strided add into a channels-last out is 3x slower)
        return (a.transpose(0, 2, 3, 1) + b.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    alike = getattr(a, "ndim", 0) > 0 and type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape
    fast = dispatch.lookup("add", a, b, dtype=a.dtype) if alike else None
    return fast(a, b, a.dtype) if fast is not None else a + b


def _accumulate(Tensor, t, g, claimed=None, owned: bool = False) -> None:
    """g into leaf t's .grad. owned: nothing but the graph holds g (an op's `fresh_gradients`), so that a first
    gradient needs no copy, as PyTorch's AccumulateGrad takes a gradient no one else references."""
    _spend_zero_mark(t)
    if claimed is not None:
        # the .grad buffer was zero and an op wrote its contribution straight into it: nothing to add when
        # that is the whole gradient; when other contributions were summed with it, the sum replaces it
        if g is not claimed:
            claimed[...] = g
        return
    _check_float_leaf(t)
    if g.dtype != t.data.dtype:
        g, owned = g.astype(t.data.dtype), True   # a new array
    if t.grad is None:
        # A copy unless owned: the same gradient array may be handed to several inputs (add's backward), and
        # later accumulation into .grad happens in place. An owned gradient with gaps (the gradient of a strided
        # view) is compacted, as the copy would.
        keep = owned and (g.flags.c_contiguous or layout.is_channels_last(g))
        t.grad = Tensor(g if keep else g.copy(order="K"))  # order K: a channels-last gradient stays channels-last
    else:
        t.grad.data += g


def _spend_zero_mark(t) -> None:
    """The zero_grad() mark of leaf t is used up by the first gradient written into its .grad (mark_grad_zero)."""
    if getattr(t, "_zero_grad_mark", None) is not None:
        t._zero_grad_mark = None


def _check_float_leaf(t) -> None:
    """A gradient goes into leaf t's .grad only if t is of a float type."""
    if t.data.dtype.kind in "iub":  # requires_grad set on an integer tensor by assignment (requires_grad_ refuses)
        raise RuntimeError(f"backward: a {t.data.dtype} tensor of shape {tuple(t.shape)} requires grad; only "
                           f"floating-point tensors can (its gradient would be truncated to integers)")


# ---------------------------------------------------------------- gradients completed by a later launch
# An op that writes a leaf's gradient into its claimed .grad buffer (grad_destination) may leave the last step of
# that write to a later launch (the convolution weight gradient's fixed-order sum of its split partials rides along
# with the next weight-gradient kernel: one launch fewer per convolution). It registers a function that completes
# whatever is left; backward() runs it before anything reads a leaf's gradient: before a second contribution to a
# leaf is added, before anomaly mode checks a gradient, and when backward() ends (on an error too, before the
# claimed buffers are zeroed). Nothing outside backward() ever sees an incomplete gradient.

def defer_gradient_completion(complete: Callable[[], None]) -> None:
    """Have `complete()` run (once) before the running backward() reads a leaf's gradient or returns."""
    pending = _deferred()
    if complete not in pending:
        pending.append(complete)


def complete_deferred_gradients() -> None:
    """Run the completions registered with defer_gradient_completion on this thread, in order."""
    pending = _deferred()
    while pending:
        pending.pop(0)()


def _deferred() -> list:
    pending = getattr(_state, "deferred", None)
    if pending is None:
        pending = _state.deferred = []
    return pending


# ---------------------------------------------------------------- gradients on a branch of a captured step
# While a step is being captured into a CUDA graph, an op's backward may compute a leaf's gradient (into its claimed
# .grad buffer, which nothing reads before the completions) on a side stream forked from the capturing one: the
# graph then runs it beside the chain of input gradients that the rest of backward() waits for (a convolution's
# weight gradient beside the layers below). The branch joins the capturing stream again as the first deferred
# completion (so before a completion that sums what the branch wrote); the arrays it reads stay referenced until
# then, so that memory freed on the capturing stream is not handed out again under it. Eager calls stay on one
# stream: kernels launched uncaptured on a side stream slow the graphs captured later (docs/gpu.md). The side stream
# has CUDA's lowest priority and frost.jit captures on one of the highest, so the branch's blocks fill the SMs that
# the critical path leaves (frost.jit keeps the priorities in the graph).
# FROST_GRADIENT_BRANCH=0 (read at each call) keeps captured gradients on one stream too.

@contextlib.contextmanager
def gradient_branch(*reads, when: bool = True):
    """Run the block on the side stream of a captured backward() when `when` and the current CUDA stream is
    capturing (else as it is); `reads`: the arrays the block reads, kept alive until the branch joins."""
    origin = _capturing_stream(reads) if when and os.environ.get("FROST_GRADIENT_BRANCH", "1") != "0" else None
    if origin is None:
        yield
        return
    branch = getattr(_state, "branch", None)
    if branch is not None and branch["origin"] is not origin:
        _join_gradient_branch()  # a branch from another stream: joined first (never seen in a step)
        branch = None
    if branch is None:
        branch = _state.branch = {"origin": origin, "side": cuda.kept_stream("gradient branch"), "reads": []}
        _deferred().insert(0, _join_gradient_branch)
    branch["side"].wait_event(origin.record())
    branch["reads"].append(reads)
    with branch["side"]:
        yield


def _capturing_stream(arrays):
    """The current CUDA stream when it is capturing and the arrays are CuPy's, else None."""
    if not any(type(a).__module__.startswith("cupy") for a in arrays):
        return None
    stream = cuda.current_stream()
    return stream if stream.ptr and stream.is_capturing() else None


def _join_gradient_branch() -> None:
    branch, _state.branch = getattr(_state, "branch", None), None
    if branch is not None:
        branch["origin"].wait_event(branch["side"].record())


# ---------------------------------------------------------------- gradients written straight into .grad
# An optimizer's zero_grad() marks each parameter whose .grad it filled with zeros. During the next backward(),
# an op may ask grad_destination(p) for that buffer and compute p's gradient straight into it (a cuDNN weight
# gradient, a matmul, batch norm's finalize kernel), saving the fresh array and the `.grad += g` add. A mark
# names the .grad tensor it was made for (replacing .grad voids it) and the epoch it was made in: every
# outermost backward() ends the epoch, so a mark never outlives the first backward after the zero_grad, and
# anything done to .grad after that (all-reduce, clipping, unscaling) cannot leave a stale mark behind.

_zero_marks = {"epoch": 0}


def _claim_stack() -> list:
    """The claims of the running backward() calls of this thread, innermost last."""
    stack = getattr(_state, "claims", None)
    if stack is None:
        stack = _state.claims = []
    return stack


def mark_grad_zero(t) -> None:
    """Note that leaf `t`'s .grad is all zeros now, so the next backward() may write t's gradient into it (unless
    something writes into that .grad first: Tensor's in-place methods and item assignment drop `_known_zero`)."""
    if t.grad is not None:
        t._zero_grad_mark = (t.grad, _zero_marks["epoch"])
        t.grad._known_zero = True


def forget_zero_grads() -> None:
    """Void every zero-grad mark: frost.jit does so before a capture, so that only a zero_grad() inside the
    captured step (replayed with it) lets the graph overwrite .grad instead of adding to it."""
    _zero_marks["epoch"] += 1


def grad_destination(t: Any) -> Any:
    """The array an op's backward may write leaf `t`'s gradient into, or None (then it returns a fresh array).

    Only inside backward(), for a leaf that requires grad whose .grad is marked all zeros (mark_grad_zero), is
    dense (C-contiguous, or channels-last: the ops write either) and has t's shape, dtype and device. The buffer
    is claimed at most once per mark: the op overwrites it with its contribution and returns that same array as
    t's gradient; the engine then adds nothing (or, when t received other contributions too, assigns their sum,
    which already includes it).
    """
    stack = getattr(_state, "claims", None)
    if not stack or stack[-1] is None or t._ctx is not None or not t.requires_grad:  # None: grad() touches no .grad
        return None
    mark, grad = getattr(t, "_zero_grad_mark", None), t.grad
    if (mark is None or grad is None or mark[0] is not grad or mark[1] != _zero_marks["epoch"]
            or not grad.__dict__.get("_known_zero")):
        return None
    buffer, data = grad.data, t.data
    if (type(buffer) is not type(data) or buffer.shape != data.shape or buffer.dtype != data.dtype
            or not (buffer.flags.c_contiguous or layout.is_channels_last(buffer))
            or (not isinstance(data, np.ndarray) and buffer.device.id != data.device.id)):
        return None
    t._zero_grad_mark = None
    stack[-1][id(t)] = buffer
    return buffer


def unbroadcast(grad, shape: tuple):
    """Sum `grad` down to `shape`, undoing NumPy broadcasting."""
    if tuple(grad.shape) == tuple(shape):
        return grad
    extra = grad.ndim - len(shape)
    if extra:
        grad = grad.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    if axes:
        grad = grad.sum(axis=axes, keepdims=True)
    return grad
