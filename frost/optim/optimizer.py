"""The Optimizer base class: parameter groups, per-parameter state, the step loop (per tensor and flat), state dicts."""
from __future__ import annotations

import functools
import inspect
import warnings
from collections import defaultdict
from numbers import Real
from typing import Any, Callable, Iterable

import numpy as np

from frost import backend
from frost.autograd import AnomalyError, _has_nonfinite, enable_grad, is_anomaly_enabled, mark_grad_zero
from frost.kernel import cdiv
from frost.tensor import Tensor, zeros
from frost.optim import flat as flat_module

# what an optimizer takes: tensors, (name, tensor) pairs as model.named_parameters() yields them, or param groups
Params = Iterable[Tensor] | Iterable[tuple[str, Tensor]] | Iterable[dict]


def array_module(array):
    """NumPy or CuPy: the module that serves `array` (for the optimizers' pure update functions)."""
    return np if isinstance(array, np.ndarray) else backend.xp_for(backend.device_of(array))


def whole_norm(a, rms: bool = False):
    """The 2-norm of a whole array (its root mean square with rms=True), accumulated in at least float32: LAMB's
    trust ratio and Adafactor's scales would lose their precision to bfloat16 sums."""
    xp = array_module(a)
    a = a.astype(xp.float64 if a.dtype == xp.float64 else xp.float32, copy=False)
    return xp.sqrt(xp.mean(a * a) if rms else xp.sum(a * a))


def check_options(optimizer: str, nonnegative: dict[str, Any], betas: dict[str, Any] | None = None,
                  rules: dict[str, bool] | None = None) -> None:
    """One ValueError naming the optimizer and each bad option: `nonnegative` values must be numbers >= 0 (NaN fails),
    `betas` pairs of numbers in [0, 1), and each text of `rules` must hold."""
    bad = [problem for k, v in nonnegative.items() if (problem := _negative_option(k, v))]
    bad += [f"{k} must be two numbers in [0, 1), got {v}" for k, v in (betas or {}).items()
            if not isinstance(v, (tuple, list)) or len(v) != 2 or not all(isinstance(b, Real) and 0 <= b < 1
                                                                          for b in v)]
    bad += [text for text, holds in (rules or {}).items() if not holds]
    if bad:
        raise ValueError(f"{optimizer}: " + "; ".join(bad))


def _negative_option(name: str, value: Any) -> str | None:
    """What is wrong with an option that must be a number >= 0 (or a tuple of them), or None."""
    values = value if isinstance(value, tuple) else (value,)
    if not all(isinstance(x, Real) for x in values):
        return f"{name} must be {'numbers' if isinstance(value, tuple) else 'a number'}, got {value!r}"
    return None if all(x >= 0 for x in values) else f"{name} ({value}) must be >= 0"


# PyTorch's implementation switches: frost picks its own (one fused launch per flat GPU group, frost.optim.flat;
# frost.jit captures any step), so they are accepted and ignored; differentiable=True (a step on the tape) it cannot do
_SPEED_FLAGS = ("fused", "foreach", "capturable")


def _accepting_torch_flags(init: Callable, takes_maximize: bool) -> Callable:
    """`init` that also takes PyTorch's fused=, foreach=, capturable=, differentiable= and (where `init` has no
    maximize) maximize=, refusing only what it cannot honour."""
    @functools.wraps(init)
    def wrapped(self, *args, **kwargs):
        name = type(self).__name__
        for flag in _SPEED_FLAGS:
            kwargs.pop(flag, None)
        if kwargs.pop("differentiable", False):
            raise ValueError(f"{name}: differentiable=True is not supported (frost's steps are not recorded by "
                             f"autograd)")
        if not takes_maximize and kwargs.pop("maximize", False):
            raise ValueError(f"{name}: maximize=True is not supported by this optimizer; negate the loss instead")
        init(self, *args, **kwargs)
    return wrapped


class Optimizer:
    """Holds parameter groups (a list of dicts: 'params' plus per-group options) and per-parameter state.

    Subclasses pass their default options to `__init__`, name their per-parameter state (`state_names`), their
    rule for one parameter (`update_rule(p, g, *state, step=, **options)`, on raw arrays, in place) and the group
    options it and the kernel read (`flat_hyper`); a rule that needs more overrides `_update(p, state, group)`.
    `step()` runs it for every parameter with a gradient (flat GPU groups instead get the one-launch kernel,
    `flat_kernel`). The options are read from the group at every step, so
    `group['lr'] = x` takes effect at once.
    `params` may also be `model.named_parameters()` ((name, tensor) pairs, also inside groups), as in PyTorch 2:
    the names then appear in errors, e.g. anomaly mode's report of a NaN gradient.
    """

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:
            init = cls.__dict__["__init__"]
            cls.__init__ = _accepting_torch_flags(init, "maximize" in inspect.signature(init).parameters)

    def __init__(self, params: Params, defaults: dict[str, Any]) -> None:
        self.defaults = dict(defaults)
        # defaultdict as in PyTorch: state[p] is {} before p's first update (the step loop reads state.get(p))
        self.state: defaultdict[Tensor, dict[str, Any]] = defaultdict(dict)
        self.param_groups: list[dict[str, Any]] = []
        self._param_names: dict[int, str] = {}  # id(param) -> name, for parameters given as (name, tensor)
        if isinstance(params, (Tensor, set)):
            raise TypeError(f"{type(self).__name__}: params must be an ordered iterable of tensors or of dicts "
                            f"(param groups), got {type(params).__name__}")
        groups = list(params)
        if not groups:
            raise ValueError(f"{type(self).__name__} got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)
        self._flat: dict[int, object] = {}  # group index -> flat.FlatGroup, for groups packed on the GPU
        self._never_flat: set[int] = set()  # groups that left their flat buffers or could not share a step counter

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines += [f"    {k}: {v}" for k, v in sorted(group.items()) if k != "params"]
        return "\n".join(lines) + "\n)"

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group of parameters with its own options (missing options take the optimizer's defaults)."""
        if not isinstance(param_group, dict):
            raise TypeError(f"{type(self).__name__}.add_param_group: expected a dict, got {type(param_group).__name__}")
        group = dict(param_group)
        params = group.get("params")
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, set) or params is None:
            raise TypeError(f"{type(self).__name__}: a param group's 'params' must be a tensor or an ordered "
                            f"list of tensors, got {type(params).__name__}")
        group["params"] = params = [self._remember_name(p) for p in params]
        for i, p in enumerate(params):
            if not isinstance(p, Tensor):
                raise TypeError(f"{type(self).__name__}: can only optimize Tensors, but param {i} of group "
                                f"{len(self.param_groups)} is a {type(p).__name__}")
            if not p.is_leaf:
                raise ValueError(f"{type(self).__name__}: cannot optimize a non-leaf tensor (param {i} of group "
                                 f"{len(self.param_groups)}, made by {p.grad_fn.name})")
        for name, default in self.defaults.items():
            group.setdefault(name, default)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if len({id(p) for p in params}) != len(params) or any(id(p) in seen for p in params):
            raise ValueError(f"{type(self).__name__}: some parameters appear more than once (in one group or "
                             f"in several groups); PyTorch only warns within a group, then updates them twice")
        self.param_groups.append(group)

    def _remember_name(self, p):
        """A (name, tensor) pair, as model.named_parameters() yields them, becomes the tensor; the name is kept."""
        if isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str):
            self._param_names[id(p[1])] = p[0]
            return p[1]
        return p

    def _param_name(self, p: Tensor, group_index: int, i: int) -> str:
        """p's name as model.named_parameters() gave it, or 'param <group>.<index>'."""
        return self._param_names.get(id(p), f"param {group_index}.{i}")

    def _check_finite_grads(self, where: str = "step") -> None:
        """In anomaly mode, raise AnomalyError naming the first parameter whose gradient holds NaN or inf.

        Unnamed parameters are called 'param <group>.<index>'. Off anomaly mode this costs nothing (no sync).
        """
        if not is_anomaly_enabled():
            return
        for gi, group in enumerate(self.param_groups):
            for i, p in enumerate(group["params"]):
                if p.grad is not None and _has_nonfinite(p.grad.data):
                    name = self._param_name(p, gi, i)
                    raise AnomalyError(f"anomaly: gradient of parameter '{name}' (shape {p.shape}, "
                                       f"{p.grad.dtype.name}) contains NaN or inf at {type(self).__name__}.{where}()")

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop every parameter's gradient (or fill it with zeros when set_to_none=False).

        A flat group on the GPU always zero-fills its one gradient buffer (one memset; the gradients stay views),
        so a parameter that the next backward() does not reach is updated with a zero gradient, as torch.optim does
        after zero_grad(set_to_none=False) (model.zero_grad() sets None: such a parameter is then skipped).
        Zero-filled gradients are marked as such, so that the next backward() may write them in place
        (frost.autograd.grad_destination) instead of adding fresh arrays to the zeros.
        """
        for gi, group in enumerate(self.param_groups):
            if gi in self._flat:
                self._flat[gi].zero_grad()
                continue
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad = p.grad.detach()
                    p.grad.data[...] = 0
                    mark_grad_zero(p)

    # ------------------------------------------------------------ the step, driven here for every optimizer
    # A subclass names its state (`state_names`: arrays shaped like the parameter, or as `state_layout(p)` gives
    # them) and its rule for one parameter: `update_rule(p, g, *state, step=, **options)` on arrays, in place, where
    # state follows state_names' order (None where state_layout leaves a slot empty) and the options are the group's
    # `flat_hyper` ones (the values the GPU kernel reads from hyper, by name). step() runs it for every parameter that
    # has a gradient, outside the flat groups; a rule that needs more overrides `_update(p, state, group)` instead.
    state_names: tuple[str, ...] = ()
    state_layout = None  # p -> a (state name, shape) or None per slot of state_names, for state unlike p
    update_rule = None

    def step(self, closure: Callable[[], Any] | None = None):
        """One update of every parameter with a gradient; `closure` recomputes the loss (returned) and gradients."""
        loss = self._evaluate(closure)
        self._update_groups(self._update, self._flat_step)
        return loss

    def _update(self, p: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        """`update_rule` on p's arrays, its state, the advanced step counter and the group's `flat_hyper` options."""
        if self.update_rule is None:
            raise NotImplementedError(f"{type(self).__name__} has neither an update_rule nor an _update() (its rule "
                                      f"for one parameter)")
        arrays = [state[slot[0]].data if slot else None for slot in self._layout(p)]
        self.update_rule(p.data, p.grad.data, *arrays, step=self._increment(state["step"]), **self._options(group))

    def _layout(self, p: Tensor) -> list:
        """p's (state name, shape) per slot of state_names (None for an empty slot): state_layout's, or p's shape."""
        return list(self.state_layout(p)) if self.state_layout else [(name, p.shape) for name in self.state_names]

    def _options(self, group: dict[str, Any]) -> dict[str, Any]:
        """The group's options that the rule and the kernel read, by name (`flat_hyper`)."""
        return {name: group[name] for name in self.flat_hyper}

    def _update_groups(self, update: Callable, flat_update: Callable, where: str = "step") -> None:
        """Check the gradients (anomaly mode); give each flat group to `flat_update` and every other parameter that
        has a gradient to `update(p, state, group)`, its state made by `_initial_state` on first use."""
        self._check_finite_grads(where)
        for index, group in enumerate(self.param_groups):
            flat = self._flat_group(index, group)
            if flat is not None:
                moved, missing = flat.check()
                if len(missing) == len(flat.members):
                    continue  # no gradient at all: nothing changes, as in PyTorch
                if not moved and not missing:
                    flat.set_hyper(self._flat_hyper(group))
                    flat_update(flat)
                    continue
                self._leave_flat(index, moved, missing)
            for p in self._params_with_grad(group):
                state = self.state.get(p) or self._initial_state(p, group)
                update(p, state, group)
                if state:  # an empty state is not kept (SGD without momentum has none, as in PyTorch)
                    self.state[p] = state

    def _initial_state(self, p: Tensor, group: dict[str, Any]) -> dict[str, Any]:
        """p's state before its first update: a step counter and zeros for each of `state_names`."""
        return {"step": self._new_step(), **{name: zeros(shape, dtype=p.dtype, device=p.device)
                                             for name, shape in filter(None, self._layout(p))}}

    # ------------------------------------------------------------ flat GPU groups
    # A subclass with a one-launch GPU kernel sets `flat_kernel` and `flat_hyper`, the group options that the kernel
    # reads from hyper[1:] (in that order; tuples are flattened, booleans become 0 or 1). The kernel takes
    # (params, grads, *state buffers in state_names' order, n, hyper): one thread per element; or, with
    # `flat_per_parameter` (implied by a `state_layout`: state unlike its parameter cannot be indexed elementwise),
    # (params, grads, *state buffers, segments, hyper): one block per parameter, for rules that reduce over a whole
    # tensor; with a `state_layout` also (last_strides, *state_segments), where each parameter's last dim steps and
    # where its state lies in each buffer (see FlatGroup). `flat_threads` is the block size: by default 256, and 512
    # for a block per parameter (a whole tensor's sums). `_flat_update(flat, *extra)` launches it, with extra
    # arguments appended.
    flat_kernel = None
    flat_hyper: tuple[str, ...] = ()
    flat_per_parameter = False
    flat_threads: int | None = None

    def _flat_group(self, index: int, group: dict):
        """The group's FlatGroup, packing it on first use when it is eligible; None for the per-tensor path."""
        flat = self._flat.get(index)
        if flat is not None and not self._flat_supported(group, packed=True):  # e.g. an option set since
            self._leave_flat(index)
            return None
        if flat is None and index not in self._never_flat and self.flat_kernel is not None and \
                self._flat_supported(group):
            params = group["params"]
            if flat_module.eligible(params):
                step = flat_module.common_step(params, self.state)
                if step is None:  # the parameters have taken different numbers of steps: each keeps its own counter
                    self._never_flat.add(index)
                    return None
                flat = self._flat[index] = flat_module.FlatGroup(params, self.state, self.state_names,
                                                                 len(self._flat_hyper(group)), self.state_layout, step)
                flat_module.live_optimizers.add(self)
        return flat

    def _leave_flat(self, index: int, moved: list = (), missing: list = ()) -> None:
        """Group `index` goes back to updates parameter by parameter, for good: its state stays (views of the flat
        buffers), each parameter gets a step counter of its own; `missing` parameters skip this step (.grad None)."""
        flat = self._flat.pop(index)
        self._never_flat.add(index)
        for p in flat.members:
            self.state[p]["step"] = Tensor(np.array(float(self.state[p]["step"].item()), dtype=np.float32))
        for p in missing:
            p.grad = None
        if moved or missing:
            position = {id(p): i for i, p in enumerate(flat.members)}
            names = [self._param_name(p, index, position[id(p)]) for p in [*moved, *missing]]
            who = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
            one = len(names) == 1
            why = (f"no longer lie{'s' if one else ''} in the group's flat buffer (.data replaced: model.to(), .half() "
                   f"or an assignment)" if moved else
                   f"{'has' if one else 'have'} no gradient at this step (torch.optim skips such parameters)")
            warnings.warn(f"{type(self).__name__}: {who} {why}: parameter group {index} leaves its one-launch GPU "
                          f"update; its parameters are updated one by one from now on", stacklevel=4)

    def _flat_supported(self, group: dict, packed: bool = False) -> bool:
        """Whether the kernel serves the group's options (asked before packing, and at each step once packed)."""
        return True

    def _flat_hyper(self, group: dict) -> list[float]:
        """The values of `flat_hyper` in the group, flattened: what the kernel reads from hyper[1:]."""
        values = [group[name] for name in self.flat_hyper]
        return [float(x) for v in values for x in (v if isinstance(v, (tuple, list)) else (v,))]

    def _flat_step(self, flat) -> None:
        """A step of a flat group: advance its step counter on the device, then launch the update."""
        flat_module.advance_step[1, 32](flat.hyper)
        self._flat_update(flat)

    def _flat_update(self, flat, *extra) -> None:
        """One launch of `flat_kernel` over the group's buffers (the shapes of launch in the comment above)."""
        state = flat.state.values()
        if self.flat_per_parameter or self.state_layout:
            if self.state_layout:  # state unlike its parameter: the kernel finds it by the regions' segments
                extra = (flat.last_strides, *flat.state_segments.values(), *extra)
            threads = self.flat_threads or 512
            self.flat_kernel[len(flat.members), threads](flat.params, flat.grads, *state, flat.segments, flat.hyper,
                                                         *extra)
        else:
            threads = self.flat_threads or 256
            self.flat_kernel[cdiv(flat.numel, threads), threads](flat.params, flat.grads, *state, flat.numel,
                                                                 flat.hyper, *extra)

    def sync_device_hyperparameters(self) -> None:
        """Copy changed group options (e.g. a scheduler's lr) to the flat groups' device arrays."""
        for index, flat in self._flat.items():
            flat.set_hyper(self._flat_hyper(self.param_groups[index]))

    # ------------------------------------------------------------ helpers for subclasses
    @staticmethod
    def _evaluate(closure: Callable[[], Any] | None):
        """Run the closure (which recomputes the loss and its gradients) with gradients on."""
        if closure is None:
            return None
        with enable_grad():
            return closure()

    @staticmethod
    def _params_with_grad(group: dict[str, Any]) -> list[Tensor]:
        return [p for p in group["params"] if p.grad is not None]

    @staticmethod
    def _new_step() -> Tensor:
        """A step counter as PyTorch keeps it: a 0-d float32 tensor on the CPU (reading it never syncs a GPU)."""
        return Tensor(np.zeros((), dtype=np.float32))

    @staticmethod
    def _increment(step: Tensor) -> float:
        step.data[...] = step.data + 1
        return float(step.data)

    # ------------------------------------------------------------ state dicts
    def state_dict(self) -> dict[str, Any]:
        """{'state': {index: {name: Tensor | value}}, 'param_groups': [{options..., 'params': [index, ...]}]}.

        Parameters are numbered in order across groups, as PyTorch does; like PyTorch's, it lists every parameter
        in `self.state`, with {} for one whose state was only looked up. The state tensors are the live ones (not
        copies): save them (frost.save) or copy them before training on.
        """
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            for p in group["params"]:
                index.setdefault(id(p), len(index))
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["params"] = [index[id(p)] for p in group["params"]]
            groups.append(packed)
        state = {index[id(p)]: dict(s) for p, s in self.state.items() if id(p) in index}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore options and state saved by `state_dict()` into an optimizer over the same parameters.

        Everything is checked before anything changes, and a ValueError names the parameter group, the parameter
        (its position in the group, its name, its index in the state dict) and the state or option: each group
        needs 'params' (that many indices) and options of their defaults' kinds; each state tensor needs the shape
        its parameter's state has (the parameter's, or Adafactor's factored shapes: `state_layout`) and a
        floating-point dtype for a floating-point parameter; 'step' is one number >= 0. State tensors are copied
        onto each parameter's device (and dtype, for floating-point state other than the step counter), so the
        loaded optimizer never shares memory with `state_dict`. Options missing from a saved group (an older
        checkpoint) take their defaults, as PyTorch's __setstate__ fills them.
        """
        name = f"{type(self).__name__}.load_state_dict"
        if not isinstance(state_dict, dict) or "state" not in state_dict or "param_groups" not in state_dict:
            keys = sorted(map(str, state_dict)) if isinstance(state_dict, dict) else type(state_dict).__name__
            raise ValueError(f"{name}: expected a dict with 'state' and 'param_groups', got {keys}")
        saved_groups, saved_state = state_dict["param_groups"], state_dict["state"]
        if not isinstance(saved_groups, (list, tuple)) or not isinstance(saved_state, dict):
            raise ValueError(f"{name}: 'param_groups' must be a list and 'state' a dict, got "
                             f"{type(saved_groups).__name__} and {type(saved_state).__name__}")
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"{name}: the state dict has {len(saved_groups)} parameter groups but the optimizer "
                             f"has {len(self.param_groups)}")
        places = self._saved_places(name, saved_groups)

        state: defaultdict[Tensor, dict[str, Any]] = defaultdict(dict)
        for index, values in saved_state.items():
            if index not in places:
                raise ValueError(f"{name}: the state dict has state for parameter {index!r}, which no parameter "
                                 f"group lists")
            gi, position = places[index]
            p = self.param_groups[gi]["params"][position]
            where = (f"{name}: parameter group {gi}, parameter {position} ({self._param_name(p, gi, position)}, "
                     f"index {index} in the state dict)")
            if not isinstance(values, dict):
                raise ValueError(f"{where}: its state must be a dict of state names, got {type(values).__name__}")
            missing = sorted(self._required_state(p) - set(values)) if values else []
            if missing:
                raise ValueError(f"{where}: its state lacks {', '.join(map(repr, missing))} ({type(self).__name__} "
                                 f"keeps {sorted(self._required_state(p))} for it)")
            shapes = {key: tuple(shape) for key, shape in filter(None, self._layout(p))}
            state[p] = {key: _cast_state(where, key, value, p, shapes.get(key, p.shape))
                        for key, value in values.items()}

        new_groups, defaults = [], _class_defaults(self)
        for group, saved in zip(self.param_groups, saved_groups):
            new_group = {k: _copy_option(v) for k, v in saved.items() if k != "params"}
            for option, default in defaults.items():
                new_group.setdefault(option, _copy_option(default))
            new_group["params"] = group["params"]
            new_groups.append(new_group)
        self.param_groups = new_groups
        self.state = state
        self._flat, self._never_flat = {}, set()  # flat groups are packed again from the loaded state at the next step

    def _required_state(self, p: Tensor) -> set[str]:
        """The names a parameter's non-empty state must hold: those `_initial_state` makes, where it is the base's
        (a subclass with its own makes state as it goes: SGD's momentum buffer, Muon's)."""
        if type(self)._initial_state is not Optimizer._initial_state:
            return set()
        return {"step", *(entry[0] for entry in filter(None, self._layout(p)))}

    def _saved_places(self, name: str, saved_groups: list) -> dict[int, tuple[int, int]]:
        """Each saved parameter index -> (group, position in the group), after checking every saved group: a dict
        with 'params' (as many distinct indices as the optimizer's group has parameters) and options of the kinds
        of their defaults."""
        places: dict[int, tuple[int, int]] = {}
        for gi, (group, saved) in enumerate(zip(self.param_groups, saved_groups)):
            if not isinstance(saved, dict) or "params" not in saved:
                got = sorted(map(str, saved)) if isinstance(saved, dict) else type(saved).__name__
                raise ValueError(f"{name}: parameter group {gi} of the state dict needs a 'params' list of parameter "
                                 f"indices, got {got}")
            indices = saved["params"]
            if not isinstance(indices, (list, tuple)) or not all(_is_int(i) for i in indices):
                raise ValueError(f"{name}: parameter group {gi}: 'params' must be a list of parameter indices (ints), "
                                 f"got {indices!r:.80}")
            if len(indices) != len(group["params"]):
                raise ValueError(f"{name}: parameter group {gi} has {len(indices)} parameters in the "
                                 f"state dict but {len(group['params'])} in the optimizer")
            for position, index in enumerate(indices):
                if index in places:
                    raise ValueError(f"{name}: parameter index {index} is listed twice (parameter group "
                                     f"{places[index][0]} and group {gi})")
                places[index] = (gi, position)
            for option, value in saved.items():
                problem = _option_problem(option, value, self.defaults)
                if problem:
                    raise ValueError(f"{name}: parameter group {gi}: {problem}")
        return places


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _option_problem(option: Any, value: Any, defaults: dict[str, Any]) -> str | None:
    """What is wrong with a saved option (its name must be a str; a known option must be of its default's kind:
    a bool, a number, or a tuple of as many numbers), or None. Unknown options pass, as in PyTorch."""
    if not isinstance(option, str):
        return f"option names must be str, got {option!r}"
    if option == "params" or option not in defaults or defaults[option] is None:
        return None
    default = defaults[option]
    if isinstance(default, bool):
        ok, kind = isinstance(value, (bool, np.bool_)), "True or False"
    elif isinstance(default, Real):
        ok, kind = _is_number(value), "a number"
    elif isinstance(default, (tuple, list)):
        ok = isinstance(value, (tuple, list)) and len(value) == len(default) and all(map(_is_number, value))
        kind = f"{len(default)} numbers"
    else:
        return None
    return None if ok else f"option {option!r} must be {kind}, got {value!r:.80}"


def _is_number(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, (bool, np.bool_))


def _class_defaults(optimizer: Optimizer) -> dict[str, Any]:
    """Each option's default in the optimizer class's signature (else the optimizer's `defaults`): what a
    checkpoint written before the option existed ran with; PyTorch's __setstate__ fills missing options so."""
    signature = inspect.signature(type(optimizer).__init__).parameters
    return {name: signature[name].default if name in signature and
            signature[name].default is not inspect.Parameter.empty else value
            for name, value in optimizer.defaults.items()}


def _cast_state(where: str, key: str, value: Any, p: Tensor, shape: tuple):
    """A private copy of one state value, on the parameter's device (and in its float dtype, except 'step'), after
    checking it: a tensor must have `shape` and a dtype the update can use; 'step' one number >= 0."""
    if key == "step":  # the counter stays a float32 tensor on the CPU, whatever device the parameter is on
        return Tensor(np.array(_step_value(where, value), dtype=np.float32))
    if not isinstance(value, Tensor):
        return _copy_option(value)
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"{where}: state {key!r} has shape {tuple(value.shape)}, expected {tuple(shape)} (the "
                         f"parameter has shape {tuple(p.shape)})")
    if p.dtype.is_floating_point and not value.dtype.is_floating_point or \
            not p.dtype.is_floating_point and value.dtype != p.dtype:
        expected = "a floating-point dtype" if p.dtype.is_floating_point else p.dtype.name
        raise ValueError(f"{where}: state {key!r} has dtype {value.dtype.name}, expected {expected} (the parameter "
                         f"is {p.dtype.name})")
    out = value.detach().to(p.device)
    if value.dtype.is_floating_point and p.dtype.is_floating_point:
        out = out.to(p.dtype)
    return Tensor(out.data.copy())


def _step_value(where: str, value: Any) -> float:
    """A saved step counter as a float: a plain number or a one-element tensor, finite and >= 0."""
    number = value.detach().numpy().reshape(-1) if isinstance(value, Tensor) else np.asarray(value).reshape(-1)
    if number.size != 1 or number.dtype.kind not in "iuf" or not np.isfinite(number[0]) or number[0] < 0:
        raise ValueError(f"{where}: state 'step' must be one number >= 0 (a step count), got {value!r:.80}")
    return float(number[0])


def _copy_option(value):
    if isinstance(value, list):
        return [_copy_option(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_copy_option(v) for v in value)
    if isinstance(value, dict):
        return {k: _copy_option(v) for k, v in value.items()}
    return value
