"""stft, istft and the window functions against PyTorch CPU in float64: values and gradients (signal, spectrogram
and window), through torch.view_as_real for complex results; round trips; PyTorch's errors."""
import warnings

import numpy as np
import pytest

import frost

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(8)
WINDOWS = ["hann_window", "hamming_window", "blackman_window", "bartlett_window", "kaiser_window"]


@pytest.mark.parametrize("name", WINDOWS)
@pytest.mark.parametrize("length", [0, 1, 2, 7, 8])
@pytest.mark.parametrize("periodic", [True, False])
def test_windows_match_torch(name, length, periodic):
    ours = getattr(frost, name)(length, periodic, dtype=frost.float64)
    expected = getattr(torch, name)(length, periodic, dtype=torch.float64)
    np.testing.assert_allclose(ours.numpy(), expected.numpy(), atol=1e-12)


def test_window_options():
    np.testing.assert_allclose(frost.hamming_window(9, alpha=0.6, beta=0.4).numpy(),
                               torch.hamming_window(9, True, 0.6, 0.4).numpy(), atol=1e-7)
    np.testing.assert_allclose(frost.kaiser_window(9, beta=5.0).numpy(), torch.kaiser_window(9, True, 5.0).numpy(),
                               atol=1e-7)
    window = frost.hann_window(4, requires_grad=True)
    assert window.dtype == frost.float32 and window.requires_grad
    with pytest.raises(RuntimeError, match="hann_window requires non-negative window length, got window_length=-1"):
        frost.hann_window(-1)
    with pytest.raises(RuntimeError, match="blackman_window expects a floating point dtype, got frost.int64"):
        frost.blackman_window(4, dtype=frost.int64)


def _leaves(*arrays):
    return ([None if a is None else frost.tensor(a, requires_grad=True) for a in arrays],
            [None if a is None else torch.tensor(a, requires_grad=True) for a in arrays])


def _check_grads(ours, theirs, out, expected):
    weights = RNG.standard_normal(out.shape)
    (out * frost.tensor(weights)).sum().backward()
    (expected * torch.tensor(weights)).sum().backward()
    for mine, reference in zip(ours, theirs):
        if mine is not None:
            np.testing.assert_allclose(mine.grad.numpy(), reference.grad.numpy(), atol=1e-10)


STFT_CASES = [
    ((50,), {"n_fft": 16}, None),
    ((3, 50), {"n_fft": 16, "hop_length": 5, "win_length": 11, "normalized": True}, 11),
    ((3, 50), {"n_fft": 16, "hop_length": 3, "center": False, "onesided": False}, 16),
    ((2, 40), {"n_fft": 10, "pad_mode": "constant", "win_length": 8}, 8),
    ((2, 33), {"n_fft": 9, "hop_length": 9, "pad_mode": "replicate"}, 9),
    ((1, 64), {"n_fft": 64, "hop_length": 16, "pad_mode": "circular"}, 64),
]


@pytest.mark.parametrize("shape, kwargs, window_length", STFT_CASES)
def test_stft_matches_torch_with_gradients_for_signal_and_window(shape, kwargs, window_length):
    window = None if window_length is None else RNG.uniform(0.2, 1.0, window_length)
    (x, w), (tx, tw) = _leaves(RNG.standard_normal(shape), window)
    out = frost.stft(x, window=w, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's advice to pass a window
        expected = torch.view_as_real(torch.stft(tx, window=tw, return_complex=True, **kwargs))
    assert out.shape == tuple(expected.shape)
    np.testing.assert_allclose(out.detach().numpy(), expected.detach().numpy(), atol=1e-10)
    _check_grads((x, w), (tx, tw), out, expected)


def test_stft_of_non_contiguous_signals_and_the_tensor_method():
    signal = RNG.standard_normal((60, 2))
    (x,), (tx,) = _leaves(signal)
    window = frost.hann_window(12, dtype=frost.float64)
    out = x.transpose(0, 1).stft(12, hop_length=4, window=window, return_complex=True)
    expected = torch.view_as_real(torch.stft(tx.transpose(0, 1), 12, hop_length=4,
                                             window=torch.hann_window(12, dtype=torch.float64), return_complex=True))
    np.testing.assert_allclose(out.detach().numpy(), expected.detach().numpy(), atol=1e-10)
    _check_grads((x,), (tx,), out, expected)
    strided = frost.tensor(signal[:, 0]).reshape(30, 2)[:, 0]
    np.testing.assert_allclose(frost.stft(strided, 8, window=frost.ones(8, dtype=frost.float64)).numpy(),
                               torch.view_as_real(torch.stft(torch.tensor(signal[::2, 0]), 8,
                                                             window=torch.ones(8, dtype=torch.float64),
                                                             return_complex=True)).numpy(), atol=1e-10)


ISTFT_CASES = [
    ((9, 11, 2), {"n_fft": 16, "hop_length": 4}, 16),
    ((2, 9, 11, 2), {"n_fft": 16, "hop_length": 4, "length": 50}, 16),  # longer than the signal: zero-padded
    ((2, 9, 11, 2), {"n_fft": 16, "hop_length": 4, "length": 30, "normalized": True}, 16),
    ((2, 16, 11, 2), {"n_fft": 16, "hop_length": 4, "center": False}, 16),
    ((2, 16, 11, 2), {"n_fft": 16, "hop_length": 4, "onesided": False}, 16),
    ((2, 16, 11, 2), {"n_fft": 16, "hop_length": 4, "return_complex": True, "onesided": False}, 16),
    ((2, 9, 11, 2), {"n_fft": 16, "hop_length": 2, "win_length": 10}, 10),
]


@pytest.mark.parametrize("shape, kwargs, window_length", ISTFT_CASES)
def test_istft_matches_torch_with_gradients_for_spectrogram_and_window(shape, kwargs, window_length):
    window = RNG.uniform(0.5, 1.0, window_length)  # never near 0: the overlap-added squares stay away from 0
    (z, w), (tz, tw) = _leaves(RNG.standard_normal(shape), window)
    out = frost.istft(z, window=w, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's notice that `length` pads
        expected = torch.istft(torch.view_as_complex(tz), window=tw, **kwargs)
    expected = torch.view_as_real(expected) if expected.is_complex() else expected
    assert out.shape == tuple(expected.shape)
    np.testing.assert_allclose(out.detach().numpy(), expected.detach().numpy(), atol=1e-10)
    _check_grads((z, w), (tz, tw), out, expected)


@pytest.mark.parametrize("center", [True, False])
def test_istft_inverts_stft(center):
    signal = frost.randn(3, 200, dtype=frost.float64)
    window = frost.hamming_window(32, dtype=frost.float64)  # nowhere 0, so uncentered frames invert too
    spectrogram = frost.stft(signal, 32, hop_length=8, window=window, center=center)
    restored = frost.istft(spectrogram, 32, hop_length=8, window=window, center=center, length=200)
    np.testing.assert_allclose(restored.numpy(), signal.numpy(), atol=1e-10)


def test_bad_arguments_are_refused_as_torch_refuses_them():
    x = frost.randn(20)
    with pytest.raises(RuntimeError, match="stft: expected hop_length > 0, but got hop_length=0"):
        frost.stft(x, 8, hop_length=0)
    with pytest.raises(RuntimeError, match="stft: expected 0 < win_length <= n_fft, but got win_length=9"):
        frost.stft(x, 8, win_length=9)
    with pytest.raises(RuntimeError, match=r"stft: expected a 1D window tensor of size equal to win_length=8, but "
                                           r"got window with size \[5\]"):
        frost.stft(x, 8, window=frost.ones(5))
    with pytest.raises(RuntimeError, match=r"stft: expected a real floating 1D or 2D tensor, got frost.float32 of "
                                           r"shape \(1, 1, 20\)"):
        frost.stft(x.reshape(1, 1, 20), 8)
    with pytest.raises(RuntimeError, match=r"stft: expected 0 < n_fft <= 20 \(the padded length\), but got "
                                           r"n_fft=32"):
        frost.stft(x, 32, center=False)
    spectrogram = frost.stft(x, 8)
    with pytest.raises(RuntimeError, match=r"istft: expected the frequency dimension \(3rd to the last\) of the "
                                           r"input tensor to match n_fft / 2 \+ 1 when onesided=True \(6\), but got 5"):
        frost.istft(spectrogram, 10)
    with pytest.raises(RuntimeError, match="istft: window overlap add min below 1e-11"):
        frost.istft(spectrogram, 8, window=frost.zeros(8))
    with pytest.raises(RuntimeError, match="istft: cannot have onesided output if return_complex=True"):
        frost.istft(spectrogram, 8, return_complex=True)
    with pytest.raises(ValueError, match="istft: a complex tensor is a floating one whose last dimension holds"):
        frost.istft(frost.randn(5, 3), 8)


@pytest.mark.cuda
def test_stft_and_istft_on_cuda_match_the_cpu():
    signal = RNG.standard_normal((2, 100))
    window = frost.hann_window(16, dtype=frost.float64)
    results = []
    for device in ("cpu", "cuda"):
        x = frost.tensor(signal, device=device, requires_grad=True)
        spectrogram = frost.stft(x, 16, hop_length=4, window=window.to(device))
        restored = frost.istft(spectrogram * 2, 16, hop_length=4, window=window.to(device), length=100)
        restored.square().sum().backward()
        results.append((spectrogram.detach().numpy(), restored.detach().numpy(), x.grad.numpy()))
    for on_gpu, on_cpu in zip(results[1], results[0]):
        np.testing.assert_allclose(on_gpu, on_cpu, atol=1e-10)
