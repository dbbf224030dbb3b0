"""frost.models.audio: the mel scale and filterbank and the log-mel spectrogram against NumPy references written
here (torchaudio's definitions, loop by loop), the classifier against a PyTorch twin with the same weights
(float64), the synthetic sounds, and a short training run that must beat chance clearly."""
import math

import numpy as np
import pytest
import torch
from torch import nn as tnn

import frost
import frost.nn.functional as F
from frost.models.audio import (SOUND_CLASSES, AudioCNN, LogMelSpectrogram, hz_to_mel, mel_filterbank, mel_to_hz,
                                synthesize_sounds)

from .twins import assert_same_parameter_grads, with_weights_of

SAMPLE_RATE, N_FFT, HOP, N_MELS = 8000, 256, 128, 40


# ---------------------------------------------------------------- NumPy references
def reference_hz_to_mel(f: float, scale: str) -> float:
    if scale == "htk":
        return 2595.0 * math.log10(1.0 + f / 700.0)
    return f * 3 / 200 if f < 1000 else 15.0 + 27.0 * math.log(f / 1000) / math.log(6.4)


def reference_mel_to_hz(m: float, scale: str) -> float:
    if scale == "htk":
        return 700.0 * (10 ** (m / 2595.0) - 1)
    return m * 200 / 3 if m < 15 else 1000.0 * 6.4 ** ((m - 15) / 27)


def reference_filterbank(n_freqs: int, f_min: float, f_max: float, n_mels: int, sample_rate: int,
                         norm: str | None, scale: str) -> np.ndarray:
    """Filter by filter, bin by bin: triangle m rises from corner m to corner m + 1 and falls to corner m + 2."""
    low, high = reference_hz_to_mel(f_min, scale), reference_hz_to_mel(f_max, scale)
    corners = [reference_mel_to_hz(low + (high - low) * k / (n_mels + 1), scale) for k in range(n_mels + 2)]
    fb = np.zeros((n_freqs, n_mels))
    for m in range(n_mels):
        left, centre, right = corners[m:m + 3]
        for k in range(n_freqs):
            f = (sample_rate // 2) * k / (n_freqs - 1)
            if left < f <= centre:
                fb[k, m] = (f - left) / (centre - left)
            elif centre < f < right:
                fb[k, m] = (right - f) / (right - centre)
        if norm == "slaney":
            fb[:, m] *= 2.0 / (right - left)
    return fb


def reference_log_mel(waves: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Reflect-padded frames, periodic Hann window, |rfft|^2, the filterbank, log."""
    padded = np.pad(waves, ((0, 0), (N_FFT // 2, N_FFT // 2)), mode="reflect")
    count = 1 + (padded.shape[1] - N_FFT) // HOP
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)
    frames = np.stack([padded[:, t * HOP:t * HOP + N_FFT] for t in range(count)], axis=1) * window
    power = np.abs(np.fft.rfft(frames, axis=-1)) ** 2                    # (batch, frames, freqs)
    fb = reference_filterbank(N_FFT // 2 + 1, 0.0, SAMPLE_RATE / 2, N_MELS, SAMPLE_RATE, None, "htk")
    return np.log(power @ fb + eps).transpose(0, 2, 1)                   # (batch, n_mels, frames)


# ---------------------------------------------------------------- mel scale and filterbank
@pytest.mark.parametrize("scale", ["htk", "slaney"])
def test_mel_scale_matches_the_formulas_and_inverts(scale):
    freqs = np.array([0.0, 100.0, 440.0, 999.0, 1000.0, 1001.0, 3000.0, 8000.0])
    mels = hz_to_mel(freqs, scale)
    np.testing.assert_allclose(mels, [reference_hz_to_mel(f, scale) for f in freqs], rtol=1e-13, atol=1e-12)
    np.testing.assert_allclose(mel_to_hz(mels, scale), freqs, rtol=1e-12, atol=1e-9)


def test_mel_scale_landmarks():
    assert hz_to_mel(1000.0, "slaney") == pytest.approx(15.0, rel=1e-14)
    assert hz_to_mel(6400.0, "slaney") == pytest.approx(42.0, rel=1e-14)  # 27 mels per factor 6.4 above 1 kHz
    assert hz_to_mel(700.0, "htk") == pytest.approx(2595.0 * math.log10(2.0), rel=1e-14)


@pytest.mark.parametrize("norm", [None, "slaney"])
@pytest.mark.parametrize("scale", ["htk", "slaney"])
@pytest.mark.parametrize("sizes", [(129, 0.0, 4000.0, 40, 8000), (201, 20.0, 7600.0, 23, 16000), (9, 0.0, 8.0, 2, 16)])
def test_mel_filterbank_matches_the_reference(sizes, scale, norm):
    fb = mel_filterbank(*sizes, norm=norm, mel_scale=scale, dtype=frost.float64)
    assert fb.shape == (sizes[0], sizes[3]) and fb.dtype == frost.float64
    np.testing.assert_allclose(fb.numpy(), reference_filterbank(*sizes, norm, scale), rtol=1e-12, atol=1e-14)


def test_mel_filterbank_by_hand():
    """9 bins of 1 Hz over [0, 8] Hz, one HTK triangle on [0, 8] Hz: corners 0, mel_to_hz(hz_to_mel(8) / 2), 8."""
    centre = 700.0 * (10 ** (2595.0 * math.log10(1 + 8 / 700) / 2 / 2595.0) - 1)
    expected = [k / centre if k <= centre else (8 - k) / (8 - centre) for k in range(9)]
    np.testing.assert_allclose(mel_filterbank(9, 0.0, 8.0, 1, 16, dtype=frost.float64).numpy()[:, 0], expected,
                               rtol=1e-12, atol=1e-15)


def test_mel_filterbank_refuses_bad_arguments():
    with pytest.raises(ValueError, match="mel_filterbank: expected 0 <= f_min < f_max"):
        mel_filterbank(129, 500.0, 100.0, 40, 8000)
    with pytest.raises(ValueError, match="mel_filterbank: n_mels must be a positive int"):
        mel_filterbank(129, 0.0, 4000.0, 0, 8000)
    with pytest.raises(ValueError, match="mel_filterbank: norm must be None or 'slaney'"):
        mel_filterbank(129, 0.0, 4000.0, 40, 8000, norm="area")
    with pytest.raises(ValueError, match="mel_filterbank: mel_scale must be one of"):
        mel_filterbank(129, 0.0, 4000.0, 40, 8000, mel_scale="bark")


# ---------------------------------------------------------------- log-mel spectrogram
def test_log_mel_spectrogram_matches_the_reference():
    waves = np.random.default_rng(0).standard_normal((3, 1000))
    log_mel = LogMelSpectrogram(SAMPLE_RATE, N_FFT, HOP, N_MELS, dtype=frost.float64)
    out = log_mel(frost.tensor(waves))
    assert out.shape == (3, N_MELS, 1 + 1000 // HOP)
    np.testing.assert_allclose(out.numpy(), reference_log_mel(waves), rtol=1e-10, atol=1e-10)


def test_log_mel_spectrogram_refuses_a_single_waveform():
    with pytest.raises(ValueError, match=r"LogMelSpectrogram: expected waveforms of shape \(batch, samples\)"):
        LogMelSpectrogram()(frost.zeros(4000))


def test_log_mel_buffers_are_not_in_the_state_dict():
    assert list(LogMelSpectrogram().state_dict()) == []


# ---------------------------------------------------------------- the classifier against a PyTorch twin
class TorchAudioCNN(tnn.Module):
    """AudioCNN in PyTorch: torch.stft's power spectrum onto the same filterbank, then the same layers."""

    def __init__(self, n_classes: int, width: int) -> None:
        super().__init__()
        fb = reference_filterbank(N_FFT // 2 + 1, 0.0, SAMPLE_RATE / 2, N_MELS, SAMPLE_RATE, None, "htk")
        self.register_buffer("filterbank", torch.tensor(fb), persistent=False)
        self.input_norm = tnn.BatchNorm1d(N_MELS)
        self.convs = tnn.Sequential(
            tnn.Conv1d(N_MELS, width, 3, padding=1), tnn.BatchNorm1d(width), tnn.ReLU(),
            tnn.Conv1d(width, width, 3, stride=2, padding=1), tnn.BatchNorm1d(width), tnn.ReLU(),
            tnn.Conv1d(width, 2 * width, 3, stride=2, padding=1), tnn.BatchNorm1d(2 * width), tnn.ReLU())
        self.head = tnn.Linear(2 * width, n_classes)

    def forward(self, waves: torch.Tensor) -> torch.Tensor:
        window = torch.hann_window(N_FFT, dtype=waves.dtype)
        spec = torch.stft(waves, N_FFT, HOP, window=window, center=True, pad_mode="reflect", return_complex=True)
        mel = (spec.abs() ** 2).transpose(1, 2) @ self.filterbank
        x = self.convs(self.input_norm(torch.log(mel + 1e-6).transpose(1, 2)))
        return self.head(x.mean(-1))


@pytest.mark.parametrize("training", [True, False])
def test_audio_cnn_matches_a_torch_twin_with_the_same_weights(training):
    frost.manual_seed(0)
    model = AudioCNN(len(SOUND_CLASSES), SAMPLE_RATE, N_FFT, HOP, N_MELS, width=8, dtype=frost.float64)
    twin = with_weights_of(model, TorchAudioCNN(len(SOUND_CLASSES), 8))
    model.train(training)
    twin.train(training)
    waves, labels = synthesize_sounds(6, seed=3)
    waves = waves.astype(np.float64)
    logits, t_logits = model(frost.tensor(waves)), twin(torch.tensor(waves))
    np.testing.assert_allclose(logits.detach().numpy(), t_logits.detach().numpy(), rtol=1e-9, atol=1e-10)
    loss = F.cross_entropy(logits, frost.tensor(labels))
    t_loss = tnn.functional.cross_entropy(t_logits, torch.tensor(labels))
    loss.backward()
    t_loss.backward()
    assert_same_parameter_grads(model, twin, rtol=1e-8, atol=1e-10)


def test_audio_cnn_refuses_bad_sizes():
    with pytest.raises(ValueError, match="AudioCNN: n_classes must be a positive int"):
        AudioCNN(0)


# ---------------------------------------------------------------- the synthetic sounds and a training run
def test_synthesized_sounds_are_balanced_reproducible_and_bounded():
    waves, labels = synthesize_sounds(60, seed=5)
    assert waves.shape == (60, 4000) and waves.dtype == np.float32 and labels.dtype == np.int64
    assert np.bincount(labels).tolist() == [10] * len(SOUND_CLASSES)
    again, again_labels = synthesize_sounds(60, seed=5)
    np.testing.assert_array_equal(waves, again)
    np.testing.assert_array_equal(labels, again_labels)
    assert not np.array_equal(waves, synthesize_sounds(60, seed=6)[0])
    assert np.isfinite(waves).all() and np.abs(waves).max() < 3.0


def test_synthesize_sounds_refuses_bad_arguments():
    with pytest.raises(ValueError, match="synthesize_sounds: n must be a positive int"):
        synthesize_sounds(0)
    with pytest.raises(ValueError, match="synthesize_sounds: duration must be in"):
        synthesize_sounds(10, duration=0.3)


def test_a_short_training_run_beats_chance_clearly():
    frost.manual_seed(0)
    train_waves, train_labels = synthesize_sounds(480, seed=10)
    test_waves, test_labels = synthesize_sounds(240, seed=11)
    model = AudioCNN(len(SOUND_CLASSES), width=16)  # 4 s of CPU; 0.42 measured
    opt = frost.optim.AdamW(model.parameters(), lr=5e-3)
    rng = np.random.default_rng(0)
    for _ in range(100):
        idx = rng.choice(len(train_labels), 32, replace=False)
        loss = F.cross_entropy(model(frost.tensor(train_waves[idx])), frost.tensor(train_labels[idx]))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with frost.no_grad():
        accuracy = float((model(frost.tensor(test_waves)).argmax(1).numpy() == test_labels).mean())
    assert accuracy > 0.3, accuracy  # chance: 1 / 6


@pytest.mark.cuda
def test_audio_cnn_on_cuda_matches_the_cpu():
    frost.manual_seed(0)
    model = AudioCNN(len(SOUND_CLASSES), width=8, dtype=frost.float64)
    waves = frost.tensor(synthesize_sounds(4, seed=2)[0].astype(np.float64))
    expected = model(waves).detach().numpy()
    model.to("cuda")
    np.testing.assert_allclose(model(waves.to("cuda")).cpu().detach().numpy(), expected, rtol=1e-9, atol=1e-10)
