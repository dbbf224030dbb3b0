"""A small audio classifier: log-mel spectrograms (frost.stft and a mel filterbank) into a 1-D CNN over the frames,
and the synthetic sound dataset that examples/audio_classifier.py trains it on.

`mel_filterbank` is torchaudio's `melscale_fbanks` (HTK or Slaney mel scale, optional Slaney area
normalization): triangles whose corners are equally spaced in mels. `LogMelSpectrogram` is the power STFT (Hann
window, centered frames) projected onto it, then log(. + eps). `AudioCNN` standardizes each mel band with
BatchNorm1d, runs three Conv1d + BatchNorm + ReLU layers along time (channels = mel bands, two of them stride 2),
averages over time and classifies with a linear layer: a log-mel variant of the M5-style networks.

`synthesize_sounds` makes the dataset: SOUND_CLASSES are six kinds of short sound (rising and falling chirps,
two beeps, a tremolo tone, a vibrato tone and a burst of band-limited noise), each drawn with a random pitch,
onset, length, loudness and background noise, so that no single feature (the pitch, the onset) gives the class.
"""
from __future__ import annotations

import math

import numpy as np

from frost import nn
from frost.dtype import default_float_dtype
from frost.ops.spectral import hann_window, stft
from frost.tensor import Tensor, _resolve

__all__ = ["SOUND_CLASSES", "AudioCNN", "LogMelSpectrogram", "hz_to_mel", "mel_filterbank", "mel_to_hz",
           "synthesize_sounds"]

# ---------------------------------------------------------------- mel scale and filterbank
_SLANEY_F_SP = 200.0 / 3          # Hz per mel below 1 kHz (the Slaney scale is linear there)
_SLANEY_MIN_LOG_HZ = 1000.0
_SLANEY_MIN_LOG_MEL = _SLANEY_MIN_LOG_HZ / _SLANEY_F_SP
_SLANEY_LOGSTEP = math.log(6.4) / 27.0  # above 1 kHz: 27 mels per factor 6.4 in frequency
_MEL_SCALES = ("htk", "slaney")


def _check_scale(name: str, mel_scale: str) -> None:
    if mel_scale not in _MEL_SCALES:
        raise ValueError(f"{name}: mel_scale must be one of {_MEL_SCALES}, got {mel_scale!r}")


def hz_to_mel(freq: np.ndarray | float, mel_scale: str = "htk") -> np.ndarray:
    """Frequencies in Hz to mels: HTK's 2595 log10(1 + f / 700), or Slaney's (linear below 1 kHz, log above)."""
    _check_scale("hz_to_mel", mel_scale)
    freq = np.asarray(freq, dtype=np.float64)
    if mel_scale == "htk":
        return 2595.0 * np.log10(1.0 + freq / 700.0)
    linear = freq / _SLANEY_F_SP
    logarithmic = _SLANEY_MIN_LOG_MEL + np.log(np.maximum(freq, _SLANEY_MIN_LOG_HZ) / _SLANEY_MIN_LOG_HZ) \
        / _SLANEY_LOGSTEP
    return np.where(freq >= _SLANEY_MIN_LOG_HZ, logarithmic, linear)


def mel_to_hz(mels: np.ndarray | float, mel_scale: str = "htk") -> np.ndarray:
    """The inverse of hz_to_mel."""
    _check_scale("mel_to_hz", mel_scale)
    mels = np.asarray(mels, dtype=np.float64)
    if mel_scale == "htk":
        return 700.0 * (10.0 ** (mels / 2595.0) - 1.0)
    linear = mels * _SLANEY_F_SP
    logarithmic = _SLANEY_MIN_LOG_HZ * np.exp(_SLANEY_LOGSTEP * (np.maximum(mels, _SLANEY_MIN_LOG_MEL)
                                                                 - _SLANEY_MIN_LOG_MEL))
    return np.where(mels >= _SLANEY_MIN_LOG_MEL, logarithmic, linear)


def _check_filterbank_args(n_freqs: int, f_min: float, f_max: float, n_mels: int, sample_rate: int,
                           norm: str | None) -> None:
    name = "mel_filterbank"
    for arg, value in (("n_freqs", n_freqs), ("n_mels", n_mels), ("sample_rate", sample_rate)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name}: {arg} must be a positive int, got {value!r}")
    if n_freqs < 2:
        raise ValueError(f"{name}: n_freqs must be at least 2 (n_fft // 2 + 1 for n_fft >= 2), got {n_freqs}")
    if not 0.0 <= f_min < f_max:
        raise ValueError(f"{name}: expected 0 <= f_min < f_max, got f_min={f_min}, f_max={f_max}")
    if norm not in (None, "slaney"):
        raise ValueError(f"{name}: norm must be None or 'slaney', got {norm!r}")


def mel_filterbank(n_freqs: int, f_min: float, f_max: float, n_mels: int, sample_rate: int,
                   norm: str | None = None, mel_scale: str = "htk", *, dtype=None, device=None) -> Tensor:
    """(n_freqs, n_mels) triangular filters, torchaudio.functional.melscale_fbanks's: n_freqs STFT bins evenly
    spaced over [0, sample_rate / 2], n_mels triangles with corners at n_mels + 2 points equally spaced in mels
    over [f_min, f_max]. norm="slaney" divides each triangle by its width in Hz (equal areas). Computed in float64
    on the host; `spectrogram.transpose(-1, -2) @ fb` gives mel bands."""
    _check_filterbank_args(n_freqs, f_min, f_max, n_mels, sample_rate, norm)
    _check_scale("mel_filterbank", mel_scale)
    dev, dt = _resolve(device, dtype, default_float_dtype())
    all_freqs = np.linspace(0.0, sample_rate // 2, n_freqs)
    m_pts = np.linspace(hz_to_mel(f_min, mel_scale), hz_to_mel(f_max, mel_scale), n_mels + 2)
    f_pts = mel_to_hz(m_pts, mel_scale)
    f_diff = np.diff(f_pts)                           # (n_mels + 1,)
    slopes = f_pts[None, :] - all_freqs[:, None]      # (n_freqs, n_mels + 2)
    rising = -slopes[:, :-2] / f_diff[:-1]
    falling = slopes[:, 2:] / f_diff[1:]
    fb = np.maximum(0.0, np.minimum(rising, falling))
    if norm == "slaney":
        fb *= 2.0 / (f_pts[2:n_mels + 2] - f_pts[:n_mels])
    return Tensor(fb.astype(dt.np)).to(dev)


# ---------------------------------------------------------------- the model
class LogMelSpectrogram(nn.Module):
    """Waveforms (batch, samples) -> log mel power spectrograms (batch, n_mels, frames), frames = 1 + samples //
    hop_length: |stft|^2 with a periodic Hann window of n_fft points, centered (reflect padding), onto
    mel_filterbank(n_fft // 2 + 1, f_min, f_max or sample_rate / 2, n_mels, sample_rate), then log(mel + eps)."""

    def __init__(self, sample_rate: int = 8000, n_fft: int = 256, hop_length: int = 128, n_mels: int = 40,
                 f_min: float = 0.0, f_max: float | None = None, eps: float = 1e-6, *, device=None,
                 dtype=None) -> None:
        super().__init__()
        self.n_fft, self.hop_length, self.eps = n_fft, hop_length, eps
        f_max = sample_rate / 2 if f_max is None else f_max
        # derived from the arguments, so not saved in state_dict (persistent=False); made in `dtype` rather than
        # cast by .double() later, which would keep float32's rounding
        self.register_buffer("window", hann_window(n_fft, dtype=dtype, device=device), persistent=False)
        self.register_buffer("filterbank", mel_filterbank(n_fft // 2 + 1, f_min, f_max, n_mels, sample_rate,
                                                          dtype=dtype, device=device), persistent=False)

    def forward(self, waveform: Tensor) -> Tensor:
        if waveform.ndim != 2:
            raise ValueError(f"LogMelSpectrogram: expected waveforms of shape (batch, samples), got {waveform.shape}")
        spec = stft(waveform, self.n_fft, self.hop_length, window=self.window, center=True)  # (b, freqs, t, 2)
        power = (spec * spec).sum(-1)
        mel = power.transpose(1, 2).matmul(self.filterbank)  # (b, t, n_mels)
        return (mel + self.eps).log().transpose(1, 2)


class AudioCNN(nn.Module):
    """Waveforms (batch, samples) -> class logits (batch, n_classes): log-mel frames, each band standardized by
    BatchNorm1d, three Conv1d(kernel 3) + BatchNorm1d + ReLU layers along time (the last two stride 2), the mean
    over time and a linear layer."""

    def __init__(self, n_classes: int, sample_rate: int = 8000, n_fft: int = 256, hop_length: int = 128,
                 n_mels: int = 40, width: int = 64, *, device=None, dtype=None) -> None:
        super().__init__()
        for arg, value in (("n_classes", n_classes), ("n_mels", n_mels), ("width", width)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"AudioCNN: {arg} must be a positive int, got {value!r}")
        made = {"device": device, "dtype": dtype}
        self.features = LogMelSpectrogram(sample_rate, n_fft, hop_length, n_mels, **made)
        self.input_norm = nn.BatchNorm1d(n_mels, **made)
        self.convs = nn.Sequential(
            nn.Conv1d(n_mels, width, 3, padding=1, **made), nn.BatchNorm1d(width, **made), nn.ReLU(),
            nn.Conv1d(width, width, 3, stride=2, padding=1, **made), nn.BatchNorm1d(width, **made), nn.ReLU(),
            nn.Conv1d(width, 2 * width, 3, stride=2, padding=1, **made), nn.BatchNorm1d(2 * width, **made),
            nn.ReLU(),
        )
        self.head = nn.Linear(2 * width, n_classes, **made)

    def forward(self, waveform: Tensor) -> Tensor:
        x = self.convs(self.input_norm(self.features(waveform)))  # (batch, 2 * width, frames / 4)
        return self.head(x.mean(-1))


# ---------------------------------------------------------------- the synthetic sounds
SOUND_CLASSES = ("rising chirp", "falling chirp", "two beeps", "tremolo tone", "vibrato tone", "noise burst")
_FADE_S = 0.01  # raised-cosine fade in and out, so that no class shows a click


def _fade(length: int, sample_rate: int) -> np.ndarray:
    ramp = min(int(_FADE_S * sample_rate), length // 2)
    envelope = np.ones(length)
    rise = 0.5 - 0.5 * np.cos(np.pi * np.arange(ramp) / max(ramp, 1))
    envelope[:ramp], envelope[length - ramp:] = rise, rise[::-1]
    return envelope


def _chirp(tau: np.ndarray, f_start: float, ratio: float, duration: float) -> np.ndarray:
    """An exponential sweep from f_start to f_start * ratio over duration: phase = 2 pi integral of f."""
    log_ratio = math.log(ratio)
    return np.sin(2 * np.pi * f_start * duration * (ratio ** (tau / duration) - 1) / log_ratio)


def _sound(kind: int, tau: np.ndarray, pitch: float, rng: np.random.Generator, sample_rate: int) -> np.ndarray:
    """One sound of class `kind` over the times tau (seconds from its onset), before its fade and loudness."""
    duration = len(tau) / sample_rate
    if kind in (0, 1):  # a sweep by a factor 1.5-3 centred (geometrically) on the pitch: at most 3.5 kHz
        ratio = rng.uniform(1.5, 3.0)
        return _chirp(tau, pitch / math.sqrt(ratio), ratio, duration) if kind == 0 else \
            _chirp(tau, pitch * math.sqrt(ratio), 1 / ratio, duration)
    if kind == 2:  # beep, gap, beep (the second at a slightly different pitch)
        second = pitch * rng.uniform(0.8, 1.25)
        third = len(tau) // 3
        tone = np.where(tau < tau[third], np.sin(2 * np.pi * pitch * tau), np.sin(2 * np.pi * second * tau))
        tone[third:2 * third] = 0.0
        return tone * np.concatenate([_fade(third, sample_rate), np.zeros(third),
                                      _fade(len(tau) - 2 * third, sample_rate)])
    if kind == 3:
        rate, depth = rng.uniform(6.0, 16.0), rng.uniform(0.7, 1.0)
        return np.sin(2 * np.pi * pitch * tau) * (1 - depth * (0.5 + 0.5 * np.cos(2 * np.pi * rate * tau)))
    if kind == 4:
        rate, deviation = rng.uniform(5.0, 10.0), pitch * rng.uniform(0.04, 0.1)
        return np.sin(2 * np.pi * pitch * tau + deviation / rate * np.sin(2 * np.pi * rate * tau))
    spectrum = np.fft.rfft(rng.standard_normal(len(tau)))  # noise, band-passed to an octave and a bit
    freqs = np.fft.rfftfreq(len(tau), 1 / sample_rate)
    spectrum[(freqs < pitch / 1.5) | (freqs > pitch * 1.5)] = 0.0
    noise = np.fft.irfft(spectrum, len(tau))
    return noise / (np.abs(noise).max() + 1e-12)


def synthesize_sounds(n: int, seed: int = 0, sample_rate: int = 8000,
                      duration: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """n clips of `duration` seconds: waveforms float32 (n, samples) and labels int64 (n,) indexing SOUND_CLASSES,
    the classes in equal shares (shuffled). Each sound lasts 0.2-0.35 s from an onset in [0, duration - length],
    has a pitch log-uniform in 250-2000 Hz (chirps sweep a factor 1.5-3 across it), a peak of 0.3-1 and white
    background noise of standard deviation 0.02-0.3 over the whole clip. The same seed gives the same clips."""
    if not isinstance(n, int) or n <= 0:
        raise ValueError(f"synthesize_sounds: n must be a positive int, got {n!r}")
    if not 0.35 < duration <= 10.0:
        raise ValueError(f"synthesize_sounds: duration must be in (0.35, 10] seconds (a sound lasts up to 0.35 s), "
                         f"got {duration}")
    rng = np.random.default_rng(seed)
    samples = int(duration * sample_rate)
    labels = rng.permutation(np.arange(n) % len(SOUND_CLASSES)).astype(np.int64)
    waves = np.empty((n, samples), dtype=np.float32)
    for i, kind in enumerate(labels):
        length = int(rng.uniform(0.2, 0.35) * sample_rate)
        onset = int(rng.integers(0, samples - length + 1))
        pitch = math.exp(rng.uniform(math.log(250.0), math.log(2000.0)))
        sound = _sound(int(kind), np.arange(length) / sample_rate, pitch, rng, sample_rate)
        clip = rng.standard_normal(samples) * rng.uniform(0.02, 0.3)
        clip[onset:onset + length] += rng.uniform(0.3, 1.0) * sound * _fade(length, sample_rate)
        waves[i] = clip
    return waves, labels
