"""What the model tests share with their PyTorch twins: the same weights in float64, and every parameter's gradient
compared by name."""
from __future__ import annotations

import numpy as np
import torch

import frost


def with_weights_of(model: frost.nn.Module, twin: torch.nn.Module) -> torch.nn.Module:
    """twin in float64 holding copies of model's parameters and buffers (its state dict's names must be model's)."""
    twin = twin.double()
    twin.load_state_dict({k: torch.from_numpy(v.numpy().copy()) for k, v in model.state_dict().items()})
    return twin


def assert_same_parameter_grads(model: frost.nn.Module, twin: torch.nn.Module, rtol: float, atol: float) -> None:
    """Both have the same parameter names, and each of model's gradients is close to its twin's."""
    ours, theirs = dict(model.named_parameters()), dict(twin.named_parameters())
    assert sorted(ours) == sorted(theirs)
    for name, p in theirs.items():
        np.testing.assert_allclose(ours[name].grad.numpy(), p.grad.numpy(), rtol=rtol, atol=atol, err_msg=name)
