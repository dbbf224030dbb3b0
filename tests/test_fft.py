"""frost.fft against torch.fft in float64, complex tensors compared through torch.view_as_real: values and
gradients for every transform, norm and length (cropping and zero-padding), non-contiguous inputs, errors."""
import numpy as np
import pytest

import frost
from frost import fft

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(7)
NORMS = [None, "backward", "ortho", "forward"]
REAL_INPUT = {"rfft", "rfft2", "rfftn"}


def _compare(name: str, array: np.ndarray, atol: float = 1e-10, make_view=None, **kwargs):
    """Values and gradients (of a random weighted sum of the output) of frost.fft.<name> and torch.fft.<name>;
    make_view turns the leaf into the (possibly non-contiguous) input of both."""
    view = make_view or (lambda t: t)
    ours = frost.tensor(array, requires_grad=True)
    theirs = torch.tensor(array, requires_grad=True)
    out = getattr(fft, name)(view(ours), **kwargs)
    their_input = view(theirs) if name in REAL_INPUT else torch.view_as_complex(view(theirs).contiguous())
    expected = getattr(torch.fft, name)(their_input, **kwargs)
    expected = torch.view_as_real(expected) if expected.is_complex() else expected
    assert out.shape == tuple(expected.shape) and out.dtype.name == str(expected.dtype).replace("torch.", "")
    np.testing.assert_allclose(out.detach().numpy(), expected.detach().numpy(), atol=atol)
    weights = RNG.standard_normal(out.shape)
    (out * frost.tensor(weights)).sum().backward()
    (expected * torch.tensor(weights)).sum().backward()
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), atol=atol)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("n", [None, 5, 8, 13])
@pytest.mark.parametrize("name", ["fft", "ifft"])
def test_complex_transforms_match_torch(name, n, norm):
    _compare(name, RNG.standard_normal((3, 8, 2)), n=n, norm=norm)
    _compare(name, RNG.standard_normal((7, 4, 2)), n=n, norm=norm, dim=0)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("n", [None, 5, 8, 13])
def test_rfft_matches_torch(n, norm):
    _compare("rfft", RNG.standard_normal((3, 8)), n=n, norm=norm)
    _compare("rfft", RNG.standard_normal((9, 2)), n=n, norm=norm, dim=0)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("n", [None, 4, 7, 10, 15])
def test_irfft_matches_torch_including_the_ignored_imaginary_parts(n, norm):
    _compare("irfft", RNG.standard_normal((3, 5, 2)), n=n, norm=norm)  # odd and even n: Nyquist counted once
    _compare("irfft", RNG.standard_normal((6, 2, 2)), n=n, norm=norm, dim=0)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("name, shape, kwargs", [
    ("fft2", (3, 6, 5, 2), {}),
    ("ifft2", (3, 6, 5, 2), {"s": (4, 9)}),
    ("fftn", (3, 6, 5, 2), {"dim": (0, 2)}),
    ("ifftn", (3, 4, 5, 2), {}),
    ("rfft2", (3, 6, 7), {"s": (5, 8)}),
    ("rfftn", (3, 6, 7), {}),
    ("rfftn", (3, 6, 7), {"s": (4, 9), "dim": (2, 0)}),  # the last dim listed gets the half spectrum
    ("irfft2", (3, 6, 4, 2), {}),
    ("irfftn", (3, 6, 4, 2), {"s": (5, 8, 7)}),
    ("irfftn", (3, 6, 4, 2), {"s": (-1, 6), "dim": (1, 2)}),
])
def test_multidimensional_transforms_match_torch(name, shape, kwargs, norm):
    _compare(name, RNG.standard_normal(shape), norm=norm, **kwargs)


def test_non_contiguous_inputs():
    _compare("rfft", RNG.standard_normal((8, 5)), make_view=lambda t: t.transpose(0, 1))
    _compare("rfft", RNG.standard_normal((5, 16)), make_view=lambda t: t[:, ::2])
    _compare("fft", RNG.standard_normal((6, 4, 2)), make_view=lambda t: t.transpose(0, 1), dim=0)
    _compare("irfft", RNG.standard_normal((10, 3, 2)), make_view=lambda t: t[::2], n=6)


def test_float32_stays_float32_and_round_trips():
    x = frost.randn(4, 64)
    spectrum = fft.rfft(x)
    assert spectrum.dtype == frost.float32 and spectrum.shape == (4, 33, 2)
    np.testing.assert_allclose(fft.irfft(spectrum, n=64).numpy(), x.numpy(), atol=1e-5)
    z = frost.randn(4, 10, 2, dtype=frost.float64)
    np.testing.assert_allclose(fft.ifft(fft.fft(z, norm="ortho"), norm="ortho").numpy(), z.numpy(), atol=1e-12)


def test_integers_are_transformed_in_the_default_float_dtype():
    out = fft.rfft(frost.tensor([1, 2, 3, 4]))
    assert out.dtype == frost.float32
    np.testing.assert_allclose(out.numpy(), torch.view_as_real(torch.fft.rfft(torch.tensor([1, 2, 3, 4]))).numpy())


def test_complex_real_and_imag_helpers():
    re, im = frost.randn(3, 4, requires_grad=True), frost.randn(3, 4)
    z = fft.complex(re, im)
    assert z.shape == (3, 4, 2)
    np.testing.assert_array_equal(fft.real(z).detach().numpy(), re.detach().numpy())
    np.testing.assert_array_equal(fft.imag(z).detach().numpy(), im.numpy())
    np.testing.assert_array_equal(fft.imag(fft.complex(re)).detach().numpy(), np.zeros((3, 4)))
    fft.real(fft.fft(fft.complex(re))).sum().backward()  # sum_k Re X_k = N x_0: the gradient is N at index 0
    np.testing.assert_allclose(re.grad.numpy(), np.tile([4.0, 0, 0, 0], (3, 1)), atol=1e-6)
    expected = torch.fft.fft(torch.tensor(re.detach().numpy(), dtype=torch.float64))
    np.testing.assert_allclose(fft.fft(fft.complex(re.detach().double())).numpy(), torch.view_as_real(expected),
                               atol=1e-12)


def test_frequencies_match_torch():
    for n, d in ((8, 1.0), (7, 0.1)):
        np.testing.assert_allclose(fft.fftfreq(n, d).numpy(), torch.fft.fftfreq(n, d).numpy(), rtol=1e-6)
        np.testing.assert_allclose(fft.rfftfreq(n, d).numpy(), torch.fft.rfftfreq(n, d).numpy(), rtol=1e-6)
    assert fft.fftfreq(4, dtype=frost.float64).dtype == frost.float64


def test_bad_input_is_refused_with_the_function_named():
    with pytest.raises(ValueError, match=r"fft.fft: a complex tensor is a floating one whose last dimension holds "
                                         r"\(real, imaginary\) pairs .*shape \(4, 3\)"):
        fft.fft(frost.randn(4, 3))
    with pytest.raises(ValueError, match="fft.rfft: invalid normalization mode 'unitary'"):
        fft.rfft(frost.randn(4), norm="unitary")
    with pytest.raises(RuntimeError, match=r"fft.irfft: invalid number of data points \(0\) specified"):
        fft.irfft(frost.randn(1, 2))
    with pytest.raises(RuntimeError, match=r"fft.rfft: invalid number of data points \(0\)"):
        fft.rfft(frost.randn(4), n=0)
    with pytest.raises(RuntimeError, match=r"fft.fftn: dims must be unique, got \(0, -2\)"):
        fft.fftn(frost.randn(3, 4, 2), dim=(0, -2))
    with pytest.raises(RuntimeError, match=r"fft.rfft2: s \(4,\) and dim \(-2, -1\) must have the same length"):
        fft.rfft2(frost.randn(3, 4), s=(4,))
    with pytest.raises(IndexError, match="fft.rfft"):
        fft.rfft(frost.randn(3), dim=1)


@pytest.mark.cuda
def test_transforms_and_gradients_on_cuda_match_the_cpu():
    x = RNG.standard_normal((3, 10))
    for name, kwargs in (("rfft", {"n": 12}), ("rfft2", {"norm": "ortho"})):
        grads = []
        for device in ("cpu", "cuda"):
            leaf = frost.tensor(x, device=device, requires_grad=True)
            out = getattr(fft, name)(leaf, **kwargs)
            irfft = fft.irfft(out, n=7) if name == "rfft" else fft.irfft2(out)
            (irfft * irfft).sum().backward()
            grads.append((out.detach().numpy(), leaf.grad.numpy()))
        np.testing.assert_allclose(grads[1][0], grads[0][0], atol=1e-10)
        np.testing.assert_allclose(grads[1][1], grads[0][1], atol=1e-10)
