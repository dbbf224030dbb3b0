"""Flat buffers for a parameter group on the GPU: parameters, gradients and optimizer state packed contiguously.

Parameters and their gradients become views into one buffer each, so zero_grad is one memset and an
optimizer's update is one kernel launch over the whole group. The hyper-parameters (lr, betas, ...) and the
step counter live in a small device array: the update kernel reads them there, so a step captured into a CUDA
graph keeps counting steps and follows a learning-rate schedule on replay without being captured again.
"""
from __future__ import annotations

import weakref

import numpy as np

from frost.autograd import mark_grad_zero
from frost.backend import cuda
from frost.tensor import Tensor

STEP = 0  # slot of the step counter in `hyper`; slots 1.. are the optimizer's own hyper-parameters

# optimizers with flat groups; frost.jit refreshes their device hyper-parameters before each replay
live_optimizers: "weakref.WeakSet" = weakref.WeakSet()


def eligible(params: list[Tensor]) -> bool:
    """A group can go flat when every parameter is a float32 CUDA tensor on one device with a gradient."""
    if not params or any(p.grad is None for p in params):
        return False
    devices = {str(p.device) for p in params}
    return len(devices) == 1 and params[0].device.type == "cuda" and all(p.dtype == "float32" for p in params)


class FlatGroup:
    """One group's parameters, gradients and named state as views into flat CuPy buffers.

    Each parameter starts at a multiple of ALIGN elements, as a fresh allocation would: cuDNN and vectorized
    kernels read and write these views (weights, and gradients written in place by the backward). The gaps
    hold zeros, which every update rule keeps at zero.
    """

    ALIGN = 64  # float32 elements: 256 bytes

    def __init__(self, params: list[Tensor], state: dict, state_names: tuple, n_hyper: int) -> None:
        xp = params[0].xp  # CuPy; NumPy only in tests of the layout and of zero_grad
        offsets, end = [], 0
        for p in params:
            offsets.append(end)
            end += -(-p.numel() // self.ALIGN) * self.ALIGN
        self.numel = end
        self.members = list(params)
        self.params = xp.zeros(self.numel, dtype=xp.float32)
        self.grads = xp.zeros(self.numel, dtype=xp.float32)
        self.state = {name: xp.zeros(self.numel, dtype=xp.float32) for name in state_names}
        self.hyper = xp.zeros(1 + n_hyper, dtype=xp.float32)
        # [offset, numel] of each parameter, for kernels that work per parameter (one block each, e.g. LAMB's norms)
        self.segments = xp.asarray([[o, p.numel()] for p, o in zip(params, offsets)], dtype=xp.int32).reshape(-1)
        self._host_hyper: list[float] | None = None
        steps = [float(state[p]["step"].item()) for p in params if p in state and "step" in state[p]]
        self.hyper[STEP] = steps[0] if steps else 0.0
        step_view = Tensor(self.hyper[STEP:STEP + 1].reshape(()))
        for p, offset in zip(params, offsets):
            n, shape = p.numel(), p.shape
            view = slice(offset, offset + n)
            self.params[view] = p.data.reshape(-1)
            self.grads[view] = p.grad.data.reshape(-1)
            p.data = self.params[view].reshape(shape)
            p.grad = Tensor(self.grads[view].reshape(shape))
            old = state.get(p, {})
            for name in state_names:
                if name in old:
                    self.state[name][view] = old[name].data.reshape(-1)
            state[p] = {"step": step_view, **{name: Tensor(self.state[name][view].reshape(shape))
                                              for name in state_names}}

    def zero_grad(self) -> None:
        self.grads.fill(0)
        for p in self.members:
            mark_grad_zero(p)  # the next backward() may write these gradients straight into the buffer

    def set_hyper(self, values: list[float]) -> None:
        """Write the hyper-parameters to the device, only when they changed (a capture never sees a write)."""
        if values != self._host_hyper:
            xp = np if isinstance(self.hyper, np.ndarray) else cuda.cupy()
            self.hyper[1:] = xp.asarray(values, dtype=xp.float32)
            self._host_hyper = list(values)
