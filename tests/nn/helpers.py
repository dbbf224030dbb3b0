"""Comparing frost layers with their PyTorch twins: copy weights across by state dict, compare values and grads."""
from __future__ import annotations

import numpy as np
import torch

import frost


def to_frost_state(torch_module: torch.nn.Module) -> dict:
    """A torch module's state dict as NumPy arrays (what frost's load_state_dict accepts)."""
    return {k: v.detach().cpu().numpy().copy() for k, v in torch_module.state_dict().items()}


def copy_weights(torch_module: torch.nn.Module, frost_module: frost.nn.Module) -> None:
    frost_module.load_state_dict(to_frost_state(torch_module))


def assert_close(frost_value, torch_value, rtol: float = 1e-10, atol: float = 1e-12, what: str = "") -> None:
    a = frost_value.detach().numpy() if isinstance(frost_value, frost.Tensor) else np.asarray(frost_value)
    b = torch_value.detach().cpu().numpy() if isinstance(torch_value, torch.Tensor) else np.asarray(torch_value)
    assert a.shape == b.shape, f"{what}: shape {a.shape} != torch's {b.shape}"
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=what)


def compare_layer(frost_module, torch_module, *inputs: np.ndarray, rtol: float = 1e-10, atol: float = 1e-12,
                  grad_inputs: bool = True, copy: bool = True, output_index: int | None = None) -> None:
    """Forward and backward of both modules on the same float64 inputs; outputs and all gradients must match."""
    torch_module = torch_module.double()
    frost_module = frost_module.to(frost.float64)
    if copy:
        copy_weights(torch_module, frost_module)
    t_in = [torch.tensor(x, requires_grad=grad_inputs and x.dtype.kind == "f") for x in inputs]
    f_in = [frost.tensor(x, requires_grad=grad_inputs and x.dtype.kind == "f") for x in inputs]
    t_out, f_out = torch_module(*t_in), frost_module(*f_in)
    if output_index is not None:
        t_out, f_out = t_out[output_index], f_out[output_index]
    assert_close(f_out, t_out, rtol, atol, "forward")
    upstream = np.random.default_rng(1).standard_normal(tuple(t_out.shape))
    t_out.backward(torch.tensor(upstream))
    f_out.backward(frost.tensor(upstream))
    for (name, tp), (fname, fp) in zip(torch_module.named_parameters(), frost_module.named_parameters()):
        assert name == fname
        assert (fp.grad is None) == (tp.grad is None), f"grad of {name}: frost {fp.grad}, torch {tp.grad}"
        if tp.grad is not None:
            assert_close(fp.grad, tp.grad, rtol, atol, f"grad of {name}")
    for i, (ti, fi) in enumerate(zip(t_in, f_in)):
        if ti.requires_grad:
            assert_close(fi.grad, ti.grad, rtol, atol, f"grad of input {i}")
