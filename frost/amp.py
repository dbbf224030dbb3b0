"""PyTorch's frost.amp names: autocast (frost.autocast, re-exported) and GradScaler, the loss scaling that float16
training needs (bfloat16 has float32's range and needs none).

    scaler = frost.amp.GradScaler()
    with frost.amp.autocast("cuda", dtype=frost.float16):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)      # optional: to clip the true gradients
    scaler.step(optimizer)          # skipped when a gradient holds inf or NaN
    scaler.update()                 # backoff after a skipped step, growth after growth_interval good ones

The scale is kept on the host (a Python float), so step() reads one flag per device from the GPU: a scaled step
cannot be captured whole by frost.jit. Unlike PyTorch's, a GradScaler made for "cuda" on a machine without CUDA
stays enabled: frost scales gradients the same way on any device.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from frost.autocast import autocast
from frost.autograd import no_grad
from frost.tensor import Tensor

__all__ = ["GradScaler", "autocast"]

_READY, _UNSCALED, _STEPPED = "ready", "unscaled", "stepped"  # an optimizer's stage between two update() calls


class GradScaler:
    """Multiplies the loss by `scale` so that small float16 gradients do not flush to zero, divides the gradients
    by it again before the optimizer's step, skips steps whose gradients overflowed and adapts the scale: times
    `backoff_factor` after an overflow, times `growth_factor` after `growth_interval` steps without one (PyTorch's
    torch.amp.GradScaler, the same sequence of scales)."""

    def __init__(self, device: str = "cuda", init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True) -> None:
        _check_factors(init_scale, growth_factor, backoff_factor, growth_interval)
        self.device = str(device)
        self._enabled = bool(enabled)
        self._scale = _float32(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = int(growth_interval)
        self._growth_tracker = 0  # steps without an overflow since the last change of the scale
        self._per_optimizer: dict[int, dict[str, Any]] = {}

    # ------------------------------------------------------------ the training step
    def scale(self, outputs):
        """`outputs` (a tensor, or a list or tuple of them, nested) times the current scale."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, Tensor):
            return outputs * self._scale
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        raise TypeError(f"GradScaler.scale: expected a tensor or a list or tuple of tensors, got "
                        f"{type(outputs).__name__}")

    def unscale_(self, optimizer) -> None:
        """Divide the optimizer's gradients by the scale in place (once per step) and note whether any overflowed."""
        if not self._enabled:
            return
        state = self._state(optimizer)
        if state["stage"] == _UNSCALED:
            raise RuntimeError("GradScaler.unscale_: already called on this optimizer since the last update()")
        if state["stage"] == _STEPPED:
            raise RuntimeError("GradScaler.unscale_: called after step(); call it before step()")
        state["found_inf"] = _unscale_gradients(optimizer, 1.0 / self._scale)
        state["stage"] = _UNSCALED

    def step(self, optimizer, *args, **kwargs):
        """optimizer.step(*args, **kwargs) on the unscaled gradients, or nothing (None) when one holds inf or NaN."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("GradScaler.step: a closure is not supported (it would run backward() unscaled)")
        state = self._state(optimizer)
        if state["stage"] == _STEPPED:
            raise RuntimeError("GradScaler.step: already called on this optimizer since the last update()")
        if state["stage"] == _READY:
            self.unscale_(optimizer)
        if state["found_inf"] is None:
            raise RuntimeError("GradScaler.step: the optimizer has no gradients; call backward() on "
                               "scaler.scale(loss) first")
        result = None if state["found_inf"] else optimizer.step(*args, **kwargs)
        state["stage"] = _STEPPED
        return result

    def update(self, new_scale: float | Tensor | None = None) -> None:
        """Set the scale for the next step: `new_scale` when given, else backed off after an overflow in any
        optimizer's gradients this step, grown after `growth_interval` steps without one."""
        if not self._enabled:
            return
        if new_scale is not None:
            value = float(new_scale.item() if isinstance(new_scale, Tensor) else new_scale)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"GradScaler.update: new_scale must be a finite number > 0, got {value}")
            self._scale = _float32(value)
        else:
            checked = [s["found_inf"] for s in self._per_optimizer.values() if s["found_inf"] is not None]
            if not checked:
                raise RuntimeError("GradScaler.update: no gradients were unscaled since the last update(); call "
                                   "scaler.step(optimizer) (or unscale_) first")
            self._scale, self._growth_tracker = next_scale(self._scale, self._growth_tracker, any(checked),
                                                           self._growth_factor, self._backoff_factor,
                                                           self._growth_interval)
        self._per_optimizer = {}

    def _state(self, optimizer) -> dict[str, Any]:
        return self._per_optimizer.setdefault(id(optimizer), {"stage": _READY, "found_inf": None})

    # ------------------------------------------------------------ settings and state
    def get_scale(self) -> float:
        return self._scale if self._enabled else 1.0

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        _check_factors(self._scale, new_factor, self._backoff_factor, self._growth_interval)
        self._growth_factor = float(new_factor)

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        _check_factors(self._scale, self._growth_factor, new_factor, self._growth_interval)
        self._backoff_factor = float(new_factor)

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        _check_factors(self._scale, self._growth_factor, self._backoff_factor, new_interval)
        self._growth_interval = int(new_interval)

    def is_enabled(self) -> bool:
        return self._enabled

    def state_dict(self) -> dict[str, Any]:
        """PyTorch's keys and values (empty when disabled), so frost.save and torch's checkpoints agree."""
        if not self._enabled:
            return {}
        return {"scale": self._scale, "growth_factor": self._growth_factor, "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval, "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not self._enabled:
            raise RuntimeError("GradScaler.load_state_dict: the scaler is disabled (enabled=False)")
        if len(state_dict) == 0:
            raise RuntimeError("GradScaler.load_state_dict: the state dict is empty (saved from a disabled scaler)")
        missing = {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"} - set(state_dict)
        if missing:
            raise KeyError(f"GradScaler.load_state_dict: missing {sorted(missing)}")
        scale = state_dict["scale"]
        _check_factors(float(scale.item() if isinstance(scale, Tensor) else scale), state_dict["growth_factor"],
                       state_dict["backoff_factor"], state_dict["growth_interval"])
        self._scale = _float32(scale.item() if isinstance(scale, Tensor) else scale)
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        tracker = state_dict["_growth_tracker"]
        self._growth_tracker = int(tracker.item() if isinstance(tracker, Tensor) else tracker)


def next_scale(scale: float, growth_tracker: int, found_inf: bool, growth_factor: float, backoff_factor: float,
               growth_interval: int) -> tuple[float, int]:
    """The scale and growth tracker after a step (PyTorch's _amp_update_scale_): backoff on an overflow; growth
    when the step is the growth_interval-th good one in a row, unless the grown scale would be infinite."""
    if found_inf:
        return _float32(scale * backoff_factor), 0
    good = growth_tracker + 1
    if good < growth_interval:
        return scale, good
    grown = _float32(scale * growth_factor)
    return (grown if math.isfinite(grown) else scale), 0


def _float32(value: float) -> float:
    """value rounded to float32, as PyTorch keeps its scale (a float32 tensor): the same scales, the same limit."""
    with np.errstate(over="ignore"):
        return float(np.float32(value))


def _unscale_gradients(optimizer, inverse_scale: float) -> bool | None:
    """Multiply every gradient of the optimizer by inverse_scale in place; whether any holds inf or NaN after (None:
    no parameter has a gradient). The flags stay on their devices until the end: one read per device."""
    flags: dict[str, tuple[Any, list]] = {}  # device -> (its array module, a 0-d "all finite" flag per gradient)
    with no_grad():
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.dtype.name == "float16":
                    raise ValueError(f"GradScaler.unscale_: a parameter of shape {p.shape} has a float16 gradient; "
                                     f"keep the parameters (the master weights) in float32 and let autocast cast")
                p.grad.mul_(inverse_scale)
                flags.setdefault(str(p.grad.device), (p.grad.xp, []))[1].append(_all_finite(p.grad))
    if not flags:
        return None
    return not all(bool(xp.stack(device_flags).all()) for xp, device_flags in flags.values())


def _all_finite(grad: Tensor):
    """A 0-d boolean array on grad's device: all of grad's values are finite (bfloat16 read as float32)."""
    xp, data = grad.xp, grad.data
    if data.dtype.kind != "f":
        data = data.astype(xp.float32)
    return xp.isfinite(data).all()


def _check_factors(init_scale: float, growth_factor: float, backoff_factor: float, growth_interval: int) -> None:
    bad = []
    if not (isinstance(init_scale, (int, float)) and math.isfinite(init_scale) and init_scale > 0):
        bad.append(f"the scale must be a finite number > 0, got {init_scale!r}")
    if not (isinstance(growth_factor, (int, float)) and growth_factor > 1):
        bad.append(f"growth_factor must be > 1, got {growth_factor!r}")
    if not (isinstance(backoff_factor, (int, float)) and 0 < backoff_factor < 1):
        bad.append(f"backoff_factor must be in (0, 1), got {backoff_factor!r}")
    if not (isinstance(growth_interval, int) and not isinstance(growth_interval, bool) and growth_interval > 0):
        bad.append(f"growth_interval must be an integer > 0, got {growth_interval!r}")
    if bad:
        raise ValueError("GradScaler: " + "; ".join(bad))
