"""Parameter and Module: the base of every layer, with registration, state dicts, train/eval and device moves."""
from __future__ import annotations

from collections import OrderedDict, namedtuple
from typing import Callable, Iterator

import numpy as np

from frost import backend
from frost.autograd import no_grad
from frost.backend import Device
from frost.dtype import default_float_dtype, to_dtype
from frost.layout import in_format
from frost.nn.hooks import BackwardHook
from frost.tensor import Tensor


class Parameter(Tensor):
    """A tensor that a Module registers as a learnable parameter; requires grad by default.

    `Parameter(t)` shares `t`'s array, as PyTorch's does.
    """

    def __init__(self, data=None, requires_grad: bool = True) -> None:
        if data is None:
            data = np.empty((0,), dtype=default_float_dtype().np)
        super().__init__(data)
        self._is_param = True
        if requires_grad:
            self.requires_grad_(True)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()

    def __reduce_ex__(self, protocol):
        return (_rebuild_parameter, (self.data, self.requires_grad))


def _rebuild_parameter(data, requires_grad: bool) -> Parameter:
    return Parameter(data, requires_grad)


class IncompatibleKeys(namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])):
    """What load_state_dict(strict=False) returns: keys the model wanted but did not get, and keys it did not know."""

    def __repr__(self) -> str:
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()

    __str__ = __repr__


class RemovableHandle:
    """What register_*_hook returns: .remove() (or leaving a `with` block) unregisters the hook."""

    _next_id = 0

    def __init__(self, registry: dict, hook: Callable) -> None:
        self.id = RemovableHandle._next_id
        RemovableHandle._next_id += 1
        self._registry = registry
        registry[self.id] = hook

    def remove(self) -> None:
        self._registry.pop(self.id, None)

    def __enter__(self) -> "RemovableHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def _addindent(text: str, spaces: int) -> str:
    lines = text.split("\n")
    if len(lines) == 1:
        return text
    return lines[0] + "\n" + "\n".join(" " * spaces + line for line in lines[1:])


def _check_name(kind: str, name, module: "Module", registry: dict) -> None:
    if not isinstance(name, str):
        raise TypeError(f"{kind} name should be a string, got {type(name).__name__}")
    if name == "":
        raise KeyError(f'{kind} name can\'t be empty string ""')
    if "." in name:
        raise KeyError(f'{kind} name can\'t contain ".", got: {name}')
    if hasattr(module, name) and name not in registry:
        raise KeyError(f"attribute '{name}' already exists")


class Module:
    """Base class of every layer and model: subclasses set attributes in __init__ and define forward().

    Parameters, sub-modules and buffers assigned as attributes are registered automatically, in order;
    that order fixes the keys and order of state_dict(), which match PyTorch's for the same architecture.
    """

    training: bool

    def __init__(self) -> None:
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent_buffers", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_forward_pre_hooks", OrderedDict())
        object.__setattr__(self, "_forward_hooks", OrderedDict())
        object.__setattr__(self, "_backward_hooks", OrderedDict())
        object.__setattr__(self, "_backward_pre_hooks", OrderedDict())

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required "forward" function')

    def __call__(self, *args, **kwargs):
        backward_hooks = self.__dict__.get("_backward_hooks") or self.__dict__.get("_backward_pre_hooks")
        if not (self._forward_pre_hooks or self._forward_hooks or backward_hooks):
            return self.forward(*args, **kwargs)
        for hook in list(self._forward_pre_hooks.values()):
            result = hook(self, args)
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
        if backward_hooks:
            full_hook = BackwardHook(self, list(self._backward_hooks.values()),
                                     list(self._backward_pre_hooks.values()))
            args = full_hook.setup_inputs(args)
        out = self.forward(*args, **kwargs)
        for hook in list(self._forward_hooks.values()):
            result = hook(self, args, out)
            if result is not None:
                out = result
        return full_hook.setup_outputs(out) if backward_hooks else out

    def register_forward_pre_hook(self, hook: Callable) -> "RemovableHandle":
        """hook(module, args) runs before forward; a non-None return replaces the positional inputs."""
        return RemovableHandle(self._forward_pre_hooks, hook)

    def register_forward_hook(self, hook: Callable) -> "RemovableHandle":
        """hook(module, args, output) runs after forward; a non-None return replaces the output."""
        return RemovableHandle(self._forward_hooks, hook)

    def register_full_backward_hook(self, hook: Callable) -> "RemovableHandle":
        """hook(module, grad_input, grad_output) runs once the gradients of the module's positional tensor inputs
        are computed (grad_input: one entry per positional argument, None for non-tensors and inputs that need no
        gradient); a non-None return (a tuple as long as grad_input) replaces grad_input. Only the tensors passed
        to forward count: a module that changes its inputs in place is not supported (as in PyTorch)."""
        return RemovableHandle(self._backward_hooks, hook)

    def register_full_backward_pre_hook(self, hook: Callable) -> "RemovableHandle":
        """hook(module, grad_output) runs once the gradients of the module's outputs are computed, before those of
        its inputs; a non-None return (a tuple as long as grad_output) replaces grad_output."""
        return RemovableHandle(self._backward_pre_hooks, hook)

    # ------------------------------------------------------------ attribute registration
    def __setattr__(self, name: str, value) -> None:
        d = self.__dict__
        params, buffers, modules = d.get("_parameters"), d.get("_buffers"), d.get("_modules")
        if isinstance(value, Parameter):
            if params is None:
                raise AttributeError("cannot assign parameters before Module.__init__() call")
            self._forget(name, keep="_parameters")
            self.register_parameter(name, value)
        elif params is not None and name in params:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as parameter '{name}' "
                                f"(frost.nn.Parameter or None expected)")
            params[name] = None
        elif isinstance(value, Module):
            if modules is None:
                raise AttributeError("cannot assign module before Module.__init__() call")
            self._forget(name, keep="_modules")
            modules[name] = value
        elif modules is not None and name in modules:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as child module '{name}' "
                                f"(frost.nn.Module or None expected)")
            modules[name] = None
        elif buffers is not None and name in buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign '{type(value).__name__}' as buffer '{name}' "
                                f"(frost.Tensor or None expected)")
            buffers[name] = value
        else:
            object.__setattr__(self, name, value)

    def _forget(self, name: str, keep: str) -> None:
        """Drop `name` from the instance dict and the registries other than `keep` (where it keeps its place)."""
        d = self.__dict__
        d.pop(name, None)
        for registry in ("_parameters", "_buffers", "_modules"):
            if registry != keep:
                d[registry].pop(name, None)
        d["_non_persistent_buffers"].discard(name)

    def __getattr__(self, name: str):
        # only called when normal lookup fails: look in the registries
        d = self.__dict__
        for registry in ("_parameters", "_buffers", "_modules"):
            if registry in d and name in d[registry]:
                return d[registry][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name: str) -> None:
        d = self.__dict__
        for registry in ("_parameters", "_buffers", "_modules"):
            if name in d[registry]:
                del d[registry][name]
                d["_non_persistent_buffers"].discard(name)
                return
        object.__delattr__(self, name)

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._buffers) | set(self._modules))

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        """Add a parameter (or a None placeholder, as PyTorch's optional bias)."""
        if "_parameters" not in self.__dict__:
            raise AttributeError("cannot assign parameter before Module.__init__() call")
        _check_name("parameter", name, self, self._parameters)
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"cannot assign '{type(param).__name__}' object to parameter '{name}' "
                            f"(frost.nn.Parameter or None required)")
        if param is not None and param._ctx is not None:
            raise ValueError(f"Cannot assign non-leaf Tensor to parameter '{name}'. Model parameters must be "
                             f"created explicitly; wrap the tensor in Parameter(t.detach())")
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """Add a tensor that is state but not a parameter (BatchNorm's running_mean); persistent ones are saved."""
        if "_buffers" not in self.__dict__:
            raise AttributeError("cannot assign buffer before Module.__init__() call")
        _check_name("buffer", name, self, self._buffers)
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"cannot assign '{type(tensor).__name__}' object to buffer '{name}' "
                            f"(frost.Tensor or None required)")
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers.discard(name)
        else:
            self._non_persistent_buffers.add(name)

    def add_module(self, name: str, module: "Module | None") -> None:
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        _check_name("module", name, self, self._modules)
        self._modules[name] = module

    register_module = add_module

    def get_submodule(self, target: str) -> "Module":
        mod = self
        for part in target.split(".") if target else []:
            if part not in mod._modules or mod._modules[part] is None:
                raise AttributeError(f"{mod._get_name()} has no submodule `{part}` (looking up '{target}')")
            mod = mod._modules[part]
        return mod

    def get_parameter(self, target: str) -> Parameter:
        path, _, name = target.rpartition(".")
        mod = self.get_submodule(path)
        if name not in mod._parameters:
            raise AttributeError(f"{mod._get_name()} has no parameter `{name}` (looking up '{target}')")
        if mod._parameters[name] is None:  # registered as None (Linear(bias=False)): torch refuses it too
            raise AttributeError(f"`{name}` is not an nn.Parameter (it is None in {mod._get_name()}; looking up "
                                 f"'{target}')")
        return mod._parameters[name]

    # ------------------------------------------------------------ iteration
    def named_modules(self, memo: set | None = None, prefix: str = "", remove_duplicate: bool = True):
        """(qualified name, module) for this module and every descendant, each shared module once."""
        if memo is None:
            memo = set()
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, child in self._modules.items():
            if child is None:
                continue
            yield from child.named_modules(memo, prefix + ("." if prefix else "") + name, remove_duplicate)

    def modules(self) -> Iterator["Module"]:
        for _, m in self.named_modules():
            yield m

    def named_children(self):
        seen = set()
        for name, child in self._modules.items():
            if child is not None and id(child) not in seen:
                seen.add(id(child))
                yield name, child

    def children(self) -> Iterator["Module"]:
        for _, c in self.named_children():
            yield c

    def _named_members(self, registry: str, prefix: str, recurse: bool, remove_duplicate: bool):
        seen = set()
        mods = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else [(prefix, self)]
        for mod_prefix, mod in mods:
            for name, value in getattr(mod, registry).items():
                if value is None or (remove_duplicate and id(value) in seen):
                    continue
                seen.add(id(value))
                yield mod_prefix + ("." if mod_prefix else "") + name, value

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        """(qualified name, parameter) pairs; a parameter shared by several modules appears once."""
        yield from self._named_members("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        return (p for _, p in self.named_parameters(recurse=recurse))

    def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        yield from self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        return (b for _, b in self.named_buffers(recurse=recurse))

    # ------------------------------------------------------------ state dicts
    def _state_items(self):
        """This module's own entries of a state dict: parameters, then persistent buffers."""
        for name, p in self._parameters.items():
            if p is not None:
                yield name, p
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent_buffers:
                yield name, b

    def state_dict(self, destination=None, prefix: str = "", keep_vars: bool = False) -> "OrderedDict[str, Tensor]":
        """Parameters and persistent buffers by qualified name, sharing memory with the module (detached).

        The keys and their order are PyTorch's for the same architecture (e.g. `bn.running_mean`,
        `bn.num_batches_tracked`), so state dicts convert across by name.
        """
        if destination is None:
            destination = OrderedDict()
        for name, value in self._state_items():
            destination[prefix + name] = value if keep_vars else value.detach()
        for name, child in self._modules.items():
            if child is not None:
                child.state_dict(destination, prefix + name + ".", keep_vars)
        return destination

    # state a checkpoint may lack, which then keeps its value (BatchNorm's counter: PyTorch's checkpoints from
    # before it, as old converted weights, have none; PyTorch keeps the module's own)
    _optional_state: tuple[str, ...] = ()

    def _expected_state(self, prefix: str = ""):
        """(key, tensor, whether a checkpoint may lack it) of every parameter and buffer."""
        for name, value in self._state_items():
            yield prefix + name, value, name in self._optional_state
        for name, child in self._modules.items():
            if child is not None:
                yield from child._expected_state(prefix + name + ".")

    def load_state_dict(self, state_dict, strict: bool = True) -> IncompatibleKeys:
        """Copy values (frost Tensors or NumPy arrays) into this module's parameters and buffers, in place.

        Shape mismatches always raise; with strict=True, missing or unexpected keys raise too. Nothing is
        copied unless everything checks out. Values are cast to each parameter's dtype and device.
        Returns (missing_keys, unexpected_keys).
        """
        if not hasattr(state_dict, "keys") or not hasattr(state_dict, "__getitem__"):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict).__name__}.")
        expected = OrderedDict((key, (target, optional)) for key, target, optional in self._expected_state())
        missing = [k for k, (_, optional) in expected.items() if k not in state_dict and not optional]
        unexpected = [k for k in state_dict.keys() if k not in expected]
        errors, copies = [], []
        for key, (target, _) in expected.items():
            if key not in state_dict:
                continue
            source = _as_array(state_dict[key], key)
            if target.ndim == 0 and tuple(source.shape) == (1,):  # a 0-d buffer saved as (1,), as PyTorch accepts
                source = source.reshape(())
            if tuple(source.shape) != tuple(target.shape):
                errors.append(f"size mismatch for {key}: copying a param with shape {tuple(source.shape)} from "
                              f"checkpoint, the shape in current model is {tuple(target.shape)}.")
                continue
            try:  # converted now, so that nothing is written unless every value converts
                copies.append((target, _to_like(source, target)))
            except (TypeError, ValueError) as e:
                errors.append(f"cannot convert {key} ({source.dtype}) to the model's {target.dtype}: {e}")
        if strict:
            if unexpected:
                errors.insert(0, f"Unexpected key(s) in state_dict: {_quoted(unexpected)}. ")
            if missing:
                errors.insert(0, f"Missing key(s) in state_dict: {_quoted(missing)}. ")
        if errors:
            raise RuntimeError("Error(s) in loading state_dict for {}:\n\t{}".format(
                type(self).__name__, "\n\t".join(errors)))
        with no_grad():
            for target, source in copies:
                target._values_change()  # as copy_: a backward that read the old values refuses to run
                target.data[...] = source
        return IncompatibleKeys(missing, unexpected)

    # ------------------------------------------------------------ modes, grads
    def train(self, mode: bool = True) -> "Module":
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        object.__setattr__(self, "training", mode)
        for child in self.children():
            child.train(mode)  # a child's own train() (e.g. one that keeps a BatchNorm frozen) runs, as in PyTorch
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.data[...] = 0

    def apply(self, fn: Callable[["Module"], None]) -> "Module":
        """Call fn on every sub-module (children first) and then on self, e.g. for custom initialization."""
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    # ------------------------------------------------------------ device and dtype moves
    def to(self, *args, device=None, dtype=None, non_blocking: bool = False, memory_format=None) -> "Module":
        """Move parameters and buffers to a device and/or cast floating-point ones to a dtype, IN PLACE.

        Each Parameter keeps its identity (only its `.data` array is replaced, as PyTorch does), so an
        optimizer built before .to() still updates the right tensors. Optimizer *state* that already exists
        (momentum buffers after a step, flat buffers that parameters are views of) is not moved: move the
        model before the first optimizer step, or better, before building the optimizer. Arrays already of
        the right dtype and device are kept as they are (no copy). Integer buffers (BatchNorm's
        num_batches_tracked) keep their dtype. memory_format=frost.channels_last re-lays 4-D parameters and
        buffers (convolution weights) in channels-last memory, as the channels-last activations' convolutions
        want them. Returns self.
        """
        for a in args:
            if isinstance(a, Device) or (isinstance(a, str) and a.split(":")[0] in ("cpu", "cuda")):
                device = a
            elif isinstance(a, Tensor):
                device, dtype = a.device, a.dtype
            else:
                dtype = a
        dev = Device(device) if device is not None else None
        dt = to_dtype(dtype) if dtype is not None else None
        if dt is not None and not dt.is_floating_point:
            raise TypeError(f"nn.Module.to only accepts floating point dtypes, but got desired dtype={dt!r}")

        def convert(array):
            if dt is not None and (array.dtype.kind == "f" or str(array.dtype) == "bfloat16"):
                array = array.astype(dt.np, copy=False)  # no copy when the dtype is right: views stay views
            if dev is not None:
                array = backend.to_device(array, dev)
            if memory_format is not None and array.ndim == 4:
                array = in_format(array, memory_format)
            return array
        return self._apply(convert)

    def _apply(self, convert: Callable) -> "Module":
        seen = set()
        for m in self.modules():
            for t in list(m._parameters.values()) + list(m._buffers.values()):
                if t is None or id(t) in seen:
                    continue
                seen.add(id(t))
                t.data = convert(t.data)
                if t.grad is not None:
                    t.grad.data = convert(t.grad.data)
        return self

    def cuda(self, device: int | None = None) -> "Module":
        return self.to(f"cuda:{device or 0}")

    def cpu(self) -> "Module":
        return self.to("cpu")

    def float(self) -> "Module":
        return self.to("float32")

    def double(self) -> "Module":
        return self.to("float64")

    def half(self) -> "Module":
        return self.to("float16")

    def bfloat16(self) -> "Module":
        return self.to("bfloat16")

    # ------------------------------------------------------------ printing
    def _get_name(self) -> str:
        return type(self).__name__

    def extra_repr(self) -> str:
        """The text inside the parentheses of this module's repr line; layers override it."""
        return ""

    def __repr__(self) -> str:
        extra = self.extra_repr()
        extra_lines = extra.split("\n") if extra else []
        child_lines = [f"({name}): " + _addindent(repr(m), 2) for name, m in self._modules.items()]
        lines = extra_lines + child_lines
        text = self._get_name() + "("
        if lines:
            if len(extra_lines) == 1 and not child_lines:
                text += extra_lines[0]
            else:
                text += "\n  " + "\n  ".join(lines) + "\n"
        return text + ")"


def _quoted(keys: list) -> str:
    return ", ".join(f'"{k}"' for k in keys)


def _as_array(value, key: str):
    """The array of a state-dict value: a frost Tensor's array, or anything NumPy can read (arrays, scalars)."""
    if isinstance(value, Tensor):
        return value.data
    if hasattr(value, "__cuda_array_interface__"):
        return value  # a CuPy array
    try:
        array = np.asarray(value)
    except Exception as e:
        raise TypeError(f"load_state_dict: value for '{key}' is a {type(value).__name__}, expected a frost Tensor "
                        f"or a NumPy array ({e}); a PyTorch tensor loads as t.detach().cpu(), or "
                        f"t.detach().float().cpu() where NumPy has no dtype for it (bfloat16)") from e
    if array.dtype.kind not in "biuf" and array.dtype.name != "bfloat16":
        raise TypeError(f"load_state_dict: value for '{key}' is {value!r:.60} ({array.dtype}), not numbers")
    return array


def _to_like(source, target: Tensor):
    """`source` converted to `target`'s device and dtype."""
    if backend.device_of(source) != target.device:
        source = backend.to_device(source, target.device)
    if source.dtype != target.data.dtype:
        source = source.astype(target.data.dtype)
    return source
