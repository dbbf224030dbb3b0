"""The activations of frost.ops.activation (and their nn layers) against PyTorch CPU float64: values and gradients,
also at the kinks where the side each takes matters."""
from functools import partial

import numpy as np
import pytest

import frost
import frost.nn.functional as F
from frost import nn
from torch_compare import check_against_torch

torch = pytest.importorskip("torch")
TF = torch.nn.functional

RNG = np.random.default_rng(7)
_check = partial(check_against_torch, rng=RNG)
# the kinks of every activation here, and values far out on both sides
KINKS = np.array([0.0, -3.0, 3.0, -1.0, 1.0, 6.0, -6.0, 40.0, -40.0, 1e-8, -1e-8, 2.5])


def _inputs() -> np.ndarray:
    """A non-contiguous float64 array holding the kinks and random values."""
    a = np.concatenate([KINKS, RNG.standard_normal(24) * 4]).reshape(4, 9)
    return a.T  # non-contiguous


ELEMENTWISE = [
    ("elu", {}), ("elu", {"alpha": 0.5}), ("selu", {}), ("celu", {}), ("celu", {"alpha": 2.0}), ("mish", {}),
    ("hardswish", {}), ("hardsigmoid", {}), ("hardtanh", {}), ("hardtanh", {"min_val": -2.0, "max_val": 3.0}),
    ("relu6", {}), ("logsigmoid", {}), ("softsign", {}), ("tanhshrink", {}),
]


# PyTorch's hardsigmoid gradient multiplies by 1/6 rounded to float32, even in float64; frost's by 1/6
ROUNDED_CONSTANT = {"hardsigmoid": 1e-7, "Hardsigmoid": 1e-7}


@pytest.mark.parametrize("name,kwargs", ELEMENTWISE)
def test_activation_matches_torch(name, kwargs):
    _check(lambda x: getattr(F, name)(x, **kwargs), lambda x: getattr(TF, name)(x, **kwargs), [_inputs()],
           rtol=ROUNDED_CONSTANT.get(name, 1e-10))


LAYERS = [
    ("ELU", {"alpha": 0.7}), ("SELU", {}), ("CELU", {"alpha": 1.5}), ("Mish", {}), ("Hardswish", {}),
    ("Hardsigmoid", {}), ("Hardtanh", {"min_val": -0.5, "max_val": 0.5}), ("ReLU6", {}), ("LogSigmoid", {}),
    ("Softsign", {}), ("Tanhshrink", {}), ("GLU", {"dim": 0}),
]


@pytest.mark.parametrize("name,kwargs", LAYERS)
def test_layer_matches_torch(name, kwargs):
    layer, reference = getattr(nn, name)(**kwargs), getattr(torch.nn, name)(**kwargs)
    _check(layer, reference, [_inputs()[:8]], rtol=ROUNDED_CONSTANT.get(name, 1e-10))


def test_inplace_layer_overwrites_input_without_grad():
    x = frost.tensor([-2.0, 0.5, 7.0])
    out = nn.ReLU6(inplace=True)(x)
    assert out is x and x.tolist() == [0.0, 0.5, 6.0]
    assert nn.ELU(alpha=2.0, inplace=True).extra_repr() == "alpha=2.0, inplace=True"


def test_logsigmoid_keeps_the_far_tails():
    x = np.array([-800.0, -40.0, 40.0, 800.0])
    _check(F.logsigmoid, TF.logsigmoid, [x])
    assert np.isfinite(F.logsigmoid(frost.tensor(x)).numpy()).all()


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_glu_matches_torch(dim):
    a = RNG.standard_normal((4, 6, 2)).transpose(1, 0, 2)  # (6, 4, 2), non-contiguous
    _check(lambda x: F.glu(x, dim), lambda x: TF.glu(x, dim), [a])


@pytest.mark.parametrize("shape,channels", [((5, 3), 3), ((2, 3, 4, 2), 3), ((2, 3, 4), 1), ((7,), 1), ((), 1)])
def test_prelu_matches_torch(shape, channels):
    x = RNG.standard_normal(shape)
    weight = RNG.uniform(-0.5, 0.5, channels)
    _check(F.prelu, TF.prelu, [x, weight])


def test_prelu_layer_learns_its_slopes():
    layer, reference = nn.PReLU(3, init=0.1), torch.nn.PReLU(3, init=0.1)
    x = RNG.standard_normal((4, 3, 5))
    out, expected = layer(frost.tensor(x)), reference(torch.tensor(x, dtype=torch.float32))
    out.sum().backward()
    expected.sum().backward()
    np.testing.assert_allclose(out.detach().numpy(), expected.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(layer.weight.grad.numpy(), reference.weight.grad.numpy(), rtol=1e-5)
    assert [name for name, _ in layer.named_parameters()] == ["weight"]


def test_integer_input_gives_default_float():
    out = F.elu(frost.tensor([-1, 0, 2]))
    np.testing.assert_allclose(out.numpy(), TF.elu(torch.tensor([-1.0, 0.0, 2.0])).numpy(), rtol=1e-6)
    assert out.dtype == frost.float32


def test_float32_stays_float32():
    x = _inputs().astype(np.float32)
    for name, kwargs in ELEMENTWISE:
        out = getattr(F, name)(frost.tensor(x), **kwargs)
        assert out.dtype == frost.float32, name
        np.testing.assert_allclose(out.numpy(), getattr(TF, name)(torch.tensor(x), **kwargs).numpy(), rtol=1e-5,
                                   atol=1e-6, err_msg=name)


def test_bad_inputs_name_the_op_and_shape():
    with pytest.raises(RuntimeError, match=r"glu: halving dimension must be even.*size 3.*\(2, 3\)"):
        F.glu(frost.zeros(2, 3))
    with pytest.raises(RuntimeError, match=r"prelu: the weight's 2 parameters.*3 channels.*\(4, 3\)"):
        F.prelu(frost.zeros(4, 3), frost.zeros(2))
    with pytest.raises(ValueError, match="celu: alpha must be nonzero"):
        F.celu(frost.zeros(3), alpha=0.0)
    with pytest.raises(ValueError, match="hardtanh: min_val"):
        F.hardtanh(frost.zeros(3), 2.0, 1.0)
    with pytest.raises(TypeError, match="elu: expected a Tensor, got list"):
        F.elu([1.0, 2.0])
    with pytest.raises(ValueError, match="PReLU: num_parameters"):
        nn.PReLU(0)


@pytest.mark.cuda
@pytest.mark.parametrize("name,kwargs", ELEMENTWISE)
def test_activation_on_cuda_matches_cpu(name, kwargs):
    a = _inputs()
    cpu, gpu = frost.tensor(a, requires_grad=True), frost.tensor(a, device="cuda", requires_grad=True)
    out_cpu, out_gpu = getattr(F, name)(cpu, **kwargs), getattr(F, name)(gpu, **kwargs)
    out_cpu.sum().backward()
    out_gpu.sum().backward()
    np.testing.assert_allclose(out_gpu.detach().numpy(), out_cpu.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(gpu.grad.numpy(), cpu.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.cuda
def test_glu_and_prelu_on_cuda_match_cpu():
    a, w = RNG.standard_normal((4, 6)), RNG.standard_normal(6)
    for fn, arrays in ((lambda x: F.glu(x, 1), [a]), (F.prelu, [a, w])):
        cpu = [frost.tensor(x, requires_grad=True) for x in arrays]
        gpu = [frost.tensor(x, device="cuda", requires_grad=True) for x in arrays]
        fn(*cpu).sum().backward()
        out = fn(*gpu)
        out.sum().backward()
        np.testing.assert_allclose(out.detach().numpy(), fn(*cpu).detach().numpy(), rtol=1e-10)
        for c, g in zip(cpu, gpu):
            np.testing.assert_allclose(g.grad.numpy(), c.grad.numpy(), rtol=1e-10)
