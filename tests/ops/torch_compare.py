"""Shared oracle of the op tests: frost against PyTorch CPU float64 (values, dtypes and every flagged gradient), and
frost on CUDA against frost on the CPU. Imported by name (pytest puts each test folder on sys.path)."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import pytest

import frost

torch = pytest.importorskip("torch")


def check_against_torch(frost_fn: Callable, torch_fn: Callable, arrays: Sequence[np.ndarray],
                        grads: Sequence[bool] | None = None, *, rng: np.random.Generator, atol: float = 1e-12,
                        rtol: float = 1e-10) -> None:
    """frost_fn's value and dtype against torch_fn's on the same arrays, then the gradients of the inputs flagged in
    `grads` (all by default) for one upstream gradient drawn from rng; an output torch cannot differentiate (an
    integer result) must not require grad in frost either."""
    grads = grads or [True] * len(arrays)
    fs = [frost.tensor(a, requires_grad=g) for a, g in zip(arrays, grads)]
    ts = [torch.tensor(a, requires_grad=g) for a, g in zip(arrays, grads)]
    fo, to = frost_fn(*fs), torch_fn(*ts)
    assert fo.shape == tuple(to.shape) and fo.dtype.name == str(to.dtype).removeprefix("torch.")
    np.testing.assert_allclose(fo.detach().numpy(), to.detach().numpy(), atol=atol, rtol=rtol)
    assert fo.requires_grad == to.requires_grad
    if not to.requires_grad:
        return
    up = rng.standard_normal(fo.shape)
    fo.backward(frost.tensor(up))
    to.backward(torch.tensor(up))
    for f, t in zip(fs, ts):
        if t.requires_grad:
            np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy(), atol=atol, rtol=rtol)


def check_cuda_matches_cpu(cases: Sequence[tuple[Callable, Sequence[np.ndarray]]]) -> None:
    """Each (fn, arrays): fn's value and input gradients (of its sum) on CUDA against the CPU's."""
    for fn, arrays in cases:
        cpu = [frost.tensor(a, requires_grad=True) for a in arrays]
        gpu = [frost.tensor(a, device="cuda", requires_grad=True) for a in arrays]
        expected, out = fn(*cpu), fn(*gpu)
        expected.sum().backward()
        out.sum().backward()
        np.testing.assert_allclose(out.detach().numpy(), expected.detach().numpy(), rtol=1e-10, atol=1e-12)
        for c, g in zip(cpu, gpu):
            np.testing.assert_allclose(g.grad.numpy(), c.grad.numpy(), rtol=1e-10, atol=1e-12)
