"""The device abstraction: which array module (NumPy or CuPy) serves a device."""
from __future__ import annotations

import numpy as np

from frost.backend import cpu  # noqa: F401 - frost.backend.cpu comes with its package
from frost.backend import cuda


class Device:
    """A device name: 'cpu', 'cuda' or 'cuda:N'. Compares equal to its string form."""

    __slots__ = ("type", "index")

    def __init__(self, spec: "str | Device") -> None:
        if isinstance(spec, Device):
            self.type, self.index = spec.type, spec.index
            return
        if not isinstance(spec, str):
            raise TypeError(f"device must be a string like 'cpu' or 'cuda:0', got {spec!r}")
        kind, _, idx = spec.partition(":")
        if kind not in ("cpu", "cuda"):
            raise ValueError(f"unknown device {spec!r}; expected 'cpu', 'cuda' or 'cuda:N'")
        if kind == "cpu":
            self.type, self.index = "cpu", None
        else:
            self.type, self.index = "cuda", int(idx) if idx else 0

    def __str__(self) -> str:
        return "cpu" if self.type == "cpu" else f"cuda:{self.index}"

    __repr__ = __str__

    def __eq__(self, other) -> bool:
        if isinstance(other, str):
            try:
                other = Device(other)
            except (ValueError, TypeError):
                return False
        return isinstance(other, Device) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self) -> int:
        return hash((self.type, self.index))


CPU = Device("cpu")


def xp_for(device: Device):
    """The array module for a device."""
    if device.type == "cpu":
        return np
    return cuda.gpu_cupy()


def device_of(array) -> Device:
    """The device an array lives on."""
    if isinstance(array, np.ndarray) or np.isscalar(array):
        return CPU
    return Device(f"cuda:{cuda.device_index(array)}")


def to_device(array, device: Device):
    """Copy an array to a device (a no-op when it is already there)."""
    src = device_of(array)
    if src == device:
        return array
    if device.type == "cpu":
        return cuda.to_host(array)
    return cuda.to_device(array, device.index)
