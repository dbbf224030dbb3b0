"""Flat buffers for a parameter group on the GPU: parameters, gradients and optimizer state packed contiguously.

Parameters and their gradients become views into one buffer each, so zero_grad is one memset and an
optimizer's update is one kernel launch over the whole group. The hyper-parameters (lr, betas, ...) and the
step counter live in a small device array: the update kernel reads them there, so a step captured into a CUDA
graph keeps counting steps and follows a learning-rate schedule on replay without being captured again.
"""
from __future__ import annotations

import weakref

import numpy as np

from frost import dispatch
from frost.autocast import register_weight_cast
from frost.autograd import mark_grad_zero
from frost.backend import cuda
from frost.kernel import Array, f32, kernel, tx
from frost.layout import is_channels_last
from frost.ops.elementwise import converted
from frost.tensor import Tensor

STEP = 0  # slot of the step counter in `hyper`; slots 1.. are the optimizer's own hyper-parameters

# optimizers with flat groups; frost.jit refreshes their device hyper-parameters before each replay
live_optimizers: "weakref.WeakSet" = weakref.WeakSet()
# id(flat parameter buffer) -> its FlatGroup (weakly): autocast casts a whole buffer at once (cast_in_one)
_groups_by_buffer: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()
# id(flat gradient buffer) -> its FlatGroup (weakly): clip_grad_norm_ reads and scales whole buffers
_groups_by_grads: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()


def cast_in_one(array, dtype, casts: dict):
    """`array` in `dtype` as a view of one cast of the whole flat parameter buffer it lies in, made once per `casts`
    dict (autocast's, one per region: a step's weights cost one cast launch, not one per parameter); None when
    `array` is not in a flat parameter buffer. The view has array's element offset and strides."""
    base = getattr(array, "base", None)
    group = _groups_by_buffer.get(id(base)) if base is not None else None
    if group is None or group.params is not base or isinstance(base, np.ndarray):
        return None
    key = (id(base), np.dtype(dtype).str)
    whole = casts.get(key)
    if whole is None:
        whole = casts[key] = converted(base, dtype)
    cp = cuda.cupy()
    size = np.dtype(dtype).itemsize
    offset = (array.data.ptr - base.data.ptr) // base.itemsize
    return cp.ndarray(array.shape, dtype, memptr=whole.data + offset * size,
                      strides=tuple(st // base.itemsize * size for st in array.strides))


register_weight_cast(cast_in_one)


@kernel.warm
@kernel
def advance_step(hyper: Array[f32]):
    """hyper[STEP] += 1 on the device, before each step's update launch (a captured step keeps counting)."""
    if tx == 0:
        hyper[0] += 1


def groups_of(grads: list) -> list | None:
    """The flat groups whose gradient buffers hold exactly `grads` (each group's every member's .grad, nothing
    else), or None."""
    groups = {}
    for g in grads:
        group = _groups_by_grads.get(id(getattr(g.data, "base", None)))
        if group is None:
            return None
        groups[id(group)] = group
    members = {id(t) for group in groups.values() for t in group.grad_tensors}
    return list(groups.values()) if members == {id(g) for g in grads} and len(members) == len(grads) else None


def in_whole_buffers(grad, grads: list) -> bool:
    """Whether `grads` (on one device) are exactly the members' gradients of some flat groups."""
    return len({str(g.device) for g in grads}) == 1 and groups_of(grads) is not None


@dispatch.register("gradient_buffers", device="cuda", dtypes=("float32",), applies=in_whole_buffers)
def gradient_buffers(grads: list) -> list:
    """The flat gradient buffers holding exactly `grads`, zeros in the gaps between them: clip_grad_norm_ takes one
    norm and one scale per buffer instead of several launches per parameter."""
    return [group.grads for group in groups_of(grads)]


def eligible(params: list[Tensor]) -> bool:
    """A group can go flat when every parameter is a float32 CUDA tensor on one device with a gradient."""
    if not params or any(p.grad is None for p in params):
        return False
    devices = {str(p.device) for p in params}
    return len(devices) == 1 and params[0].device.type == "cuda" and all(p.dtype == "float32" for p in params)


def common_step(params: list[Tensor], state: dict) -> float | None:
    """The number of steps all of params' state has taken (0 without state; 1 for state without a counter, as SGD's
    momentum buffers, which PyTorch keeps without one); None when they differ: one device counter cannot serve them."""
    steps = {0.0 if not state.get(p) else float(state[p]["step"].item()) if "step" in state[p] else 1.0 for p in params}
    return steps.pop() if len(steps) == 1 else None


def _view_like(region, like):
    """A 1-D region of like.size elements seen with like's shape and memory format (channels-last stays so)."""
    if is_channels_last(like):
        n, c, h, w = like.shape
        return region.reshape(n, h, w, c).transpose(0, 3, 1, 2)
    return region.reshape(like.shape)


class FlatGroup:
    """One group's parameters, gradients and named state as views into flat CuPy buffers.

    Each parameter starts at a multiple of ALIGN elements, as a fresh allocation would: cuDNN and vectorized
    kernels read and write these views (weights, and gradients written in place by the backward). The gaps
    hold zeros, which every update rule keeps at zero.
    """

    ALIGN = 64  # float32 elements: 256 bytes

    def __init__(self, params: list[Tensor], state: dict, state_names: tuple, n_hyper: int,
                 state_layout=None, step: float = 0.0) -> None:
        """`state_names` name the state buffers. By default buffer `name` holds state `name` of each parameter, in
        the parameters' layout (elementwise kernels index every buffer alike). `state_layout(p)` may instead give,
        per buffer, the (state name, shape) that p keeps there, or None: state smaller than the parameter (e.g.
        Adafactor's row and column averages) then gets a region of its own size; `state_segments[name]` is
        [offset, numel] of each parameter's region (numel 0 where None). `step` is the steps every parameter's state
        has taken (common_step)."""
        xp = params[0].xp  # CuPy; NumPy only in tests of the layout and of zero_grad
        offsets, self.numel = self._pack([p.numel() for p in params])
        self.members = list(params)
        self.params = xp.zeros(self.numel, dtype=xp.float32)
        _groups_by_buffer[id(self.params)] = self
        self.grads = xp.zeros(self.numel, dtype=xp.float32)
        _groups_by_grads[id(self.grads)] = self
        self.hyper = xp.zeros(1 + n_hyper, dtype=xp.float32)
        # [offset, numel] of each parameter, for kernels that work per parameter (one block each, e.g. LAMB's norms)
        self.segments = xp.asarray([[o, p.numel()] for p, o in zip(params, offsets)], dtype=xp.int32).reshape(-1)
        self._host_hyper: list[float] | None = None
        self.hyper[STEP] = step
        step_view = Tensor(self.hyper[STEP:STEP + 1].reshape(()))
        self.param_views, self.grad_tensors = [], []  # what each member's .data and .grad must stay (see check)
        for p, offset in zip(params, offsets):
            view = slice(offset, offset + p.numel())
            param_view, grad_view = _view_like(self.params[view], p.data), _view_like(self.grads[view], p.data)
            param_view[...], grad_view[...] = p.data, p.grad.data
            p.data, p.grad = param_view, Tensor(grad_view)
            self.param_views.append(param_view)
            self.grad_tensors.append(p.grad)
        # the element stride of each parameter's last dim: 1, or C for a channels-last (N, C, H, W) parameter
        self.last_strides = xp.asarray([p.data.strides[-1] // 4 if p.ndim else 1 for p in params], dtype=xp.int32)
        layouts = [state_layout(p) if state_layout else [(name, p.shape) for name in state_names] for p in params]
        new_state = {p: {"step": step_view} for p in params}
        self.state, self.state_segments = {}, {}
        for slot, name in enumerate(state_names):
            entries = [layout[slot] for layout in layouts]
            sizes = [int(np.prod(entry[1])) if entry else 0 for entry in entries]
            slot_offsets, total = self._pack(sizes)
            buffer = self.state[name] = xp.zeros(total, dtype=xp.float32)
            self.state_segments[name] = xp.asarray([*zip(slot_offsets, sizes)], dtype=xp.int32).reshape(-1)
            for p, entry, offset, size in zip(params, entries, slot_offsets, sizes):
                if entry:
                    key, shape = entry
                    region = buffer[offset:offset + size]
                    # state shaped like its parameter is laid out like it: the kernels index both alike
                    view = _view_like(region, p.data) if tuple(shape) == tuple(p.shape) else region.reshape(shape)
                    if key in state.get(p, {}):
                        view[...] = state[p][key].data
                    new_state[p][key] = Tensor(view)
        state.update(new_state)

    @classmethod
    def _pack(cls, sizes: list[int]) -> tuple[list[int], int]:
        """Offsets of regions of these sizes, each starting at a multiple of ALIGN, and the total length."""
        offsets, end = [], 0
        for size in sizes:
            offsets.append(end)
            end += -(-size // cls.ALIGN) * cls.ALIGN
        return offsets, end

    def zero_grad(self) -> None:
        """One memset; every .grad is its view of the buffer again (also one set to None or replaced since). The
        gradients are zeros, not None, whatever set_to_none says: a parameter that the next backward() does not reach
        is then updated with a zero gradient, as torch.optim does after zero_grad(set_to_none=False). (That a
        backward() wrote a gradient cannot be told from Python once a captured step replays it.)"""
        self.grads.fill(0)
        for p, grad in zip(self.members, self.grad_tensors):
            p.grad = grad
            mark_grad_zero(p)  # the next backward() may write these gradients straight into the buffer

    def check(self) -> tuple[list[Tensor], list[Tensor]]:
        """Before a step: (members whose .data no longer is the buffer's view (model.to(), .half(), an assignment),
        members whose .grad is None). A gradient found outside the buffer (model.zero_grad() then backward(), or
        .grad assigned) is copied into it, and .grad is the buffer's view again: the kernel reads only the buffer."""
        moved = [p for p, view in zip(self.members, self.param_views) if p.data is not view]
        missing = []
        for p, grad in zip(self.members, self.grad_tensors):
            if p.grad is None:
                missing.append(p)
            elif p.grad is not grad:
                grad.data[...] = p.grad.data
                p.grad = grad
        return moved, missing

    def set_hyper(self, values: list[float]) -> None:
        """Write the hyper-parameters to the device, only when they changed (a capture never sees a write)."""
        if values != self._host_hyper:
            xp = np if isinstance(self.hyper, np.ndarray) else cuda.cupy()
            self.hyper[1:] = xp.asarray(values, dtype=xp.float32)
            self._host_hyper = list(values)
