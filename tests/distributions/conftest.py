"""What the distribution tests share: a check of a frost expression against the same torch expression, values and
gradients with respect to every parameter, in float64."""
import numpy as np
import pytest

import frost


@pytest.fixture
def against_torch():
    """check(frost_fn, torch_fn, params, atol): params maps names to float64 arrays; both functions take the
    parameters as keyword tensors (requiring grad) and return a tensor; values and gradients of a random weighted
    sum must agree."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)

    def check(frost_fn, torch_fn, params: dict, atol: float = 1e-10):
        ours = {k: frost.tensor(v, dtype=frost.float64, requires_grad=True) for k, v in params.items()}
        theirs = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in params.items()}
        out, expected = frost_fn(**ours), torch_fn(**theirs)
        assert out.shape == tuple(expected.shape)
        np.testing.assert_allclose(out.detach().numpy(), expected.detach().numpy(), atol=atol, rtol=1e-9)
        weights = rng.standard_normal(out.shape)
        finite = np.isfinite(expected.detach().numpy())
        (out * frost.tensor(np.where(finite, weights, 0.0))).sum().backward()
        (expected * torch.tensor(np.where(finite, weights, 0.0))).sum().backward()
        for name in params:
            grad, expected_grad = ours[name].grad, theirs[name].grad
            expected_grad = np.zeros(params[name].shape) if expected_grad is None else expected_grad.numpy()
            got = np.zeros(params[name].shape) if grad is None else grad.numpy()
            np.testing.assert_allclose(got, expected_grad, atol=atol, rtol=1e-9, err_msg=f"gradient of {name}")
    return check
