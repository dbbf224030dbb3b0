"""The CPU backend: NumPy arrays and Frost's CPU random generator."""
from __future__ import annotations

import numpy as np

_generator = np.random.default_rng(0)


def generator() -> np.random.Generator:
    """The global CPU random generator (reseeded by frost.manual_seed)."""
    return _generator


def manual_seed(seed: int) -> None:
    global _generator
    _generator = np.random.default_rng(seed)
