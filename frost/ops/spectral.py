"""Short-time Fourier transforms (stft, istft) and the window functions that go with them (hann_window,
hamming_window, blackman_window, bartlett_window, kaiser_window), as PyTorch's.

Spectrograms are complex, in Frost's layout for complex numbers (frost.fft: a trailing dimension of (real, imaginary)
pairs): stft returns torch.view_as_real(torch.stft(...)), of shape (batch?, frequencies, frames, 2), and istft
reads that layout. return_complex is accepted for compatibility and changes nothing: there is no complex dtype to
return. Gradients flow to the signal, the spectrogram and the window; framing and overlap-add are one op each, each
the other's backward.
"""
from __future__ import annotations

import math

import numpy as np

from frost import fft
from frost.dtype import default_float_dtype
from frost.ops.shape import scatter_at
from frost.ops.shape import pad
from frost.tensor import Tensor, _resolve, can_read_values, from_op, ones

__all__ = ["stft", "istft", "hann_window", "hamming_window", "blackman_window", "bartlett_window", "kaiser_window"]

_ENVELOPE_MIN = 1e-11  # PyTorch's: below it the window overlap-add cannot be divided out (NOLA fails)


# ---------------------------------------------------------------- windows
def _window(name: str, window_length: int, periodic: bool, dtype, device, requires_grad: bool, cosine_terms=None,
            values=None) -> Tensor:
    """A window of window_length points, computed in float64 on the host: periodic ones are the first
    window_length points of the symmetric window of window_length + 1 (for spectral analysis, as PyTorch's)."""
    if window_length < 0:
        raise RuntimeError(f"{name} requires non-negative window length, got window_length={window_length}")
    dev, dt = _resolve(device, dtype, default_float_dtype())
    if not dt.is_floating_point:
        raise RuntimeError(f"{name} expects a floating point dtype, got {dt}")
    if window_length <= 1:
        w = np.ones(window_length)
    else:
        m = window_length + 1 if periodic else window_length
        phase = 2 * math.pi * np.arange(window_length) / (m - 1)
        w = values(np.arange(window_length), m) if values is not None else \
            sum(c * np.cos(k * phase) for k, c in enumerate(cosine_terms))
    return Tensor(w.astype(dt.np)).to(dev).requires_grad_(requires_grad)


def hann_window(window_length: int, periodic: bool = True, *, dtype=None, device=None,
                requires_grad: bool = False) -> Tensor:
    """0.5 - 0.5 cos(2 pi n / (M - 1))."""
    return _window("hann_window", window_length, periodic, dtype, device, requires_grad, (0.5, -0.5))


def hamming_window(window_length: int, periodic: bool = True, alpha: float = 0.54, beta: float = 0.46, *,
                   dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """alpha - beta cos(2 pi n / (M - 1))."""
    return _window("hamming_window", window_length, periodic, dtype, device, requires_grad, (alpha, -beta))


def blackman_window(window_length: int, periodic: bool = True, *, dtype=None, device=None,
                    requires_grad: bool = False) -> Tensor:
    """0.42 - 0.5 cos(2 pi n / (M - 1)) + 0.08 cos(4 pi n / (M - 1))."""
    return _window("blackman_window", window_length, periodic, dtype, device, requires_grad, (0.42, -0.5, 0.08))


def bartlett_window(window_length: int, periodic: bool = True, *, dtype=None, device=None,
                    requires_grad: bool = False) -> Tensor:
    """The triangle 1 - |2 n / (M - 1) - 1|."""
    return _window("bartlett_window", window_length, periodic, dtype, device, requires_grad,
                   values=lambda n, m: 1 - np.abs(2 * n / (m - 1) - 1))


def kaiser_window(window_length: int, periodic: bool = True, beta: float = 12.0, *, dtype=None, device=None,
                  requires_grad: bool = False) -> Tensor:
    """I0(beta sqrt(1 - (2 n / (M - 1) - 1)^2)) / I0(beta), I0 the modified Bessel function of order 0."""
    return _window("kaiser_window", window_length, periodic, dtype, device, requires_grad,
                   values=lambda n, m: np.i0(beta * np.sqrt(1 - (2 * n / (m - 1) - 1) ** 2)) / np.i0(beta))


# ---------------------------------------------------------------- framing and overlap-add
def _frame_index(xp, frames: int, n_fft: int, hop: int):
    """(frames, n_fft) positions in the signal: frame t covers [t * hop, t * hop + n_fft)."""
    return hop * xp.arange(frames)[:, None] + xp.arange(n_fft)[None, :]


def _overlap_add_array(xp, frames, hop: int, length: int):
    """Sum (batch, frames, n_fft) frames into a (batch, length) signal, frame t starting at t * hop."""
    out = xp.zeros(frames.shape[:1] + (length,), dtype=frames.dtype)
    scatter_at(xp, "add", out, (slice(None), _frame_index(xp, frames.shape[1], frames.shape[2], hop)), frames)
    return out


def _frames(x: Tensor, n_fft: int, hop: int) -> Tensor:
    """(batch, length) -> (batch, frames, n_fft) overlapping frames; backward adds the frames' gradients back."""
    xp = x.xp
    count = 1 + (x.shape[-1] - n_fft) // hop
    out = x.data[:, _frame_index(xp, count, n_fft, hop)]
    return from_op(out, (x,), lambda g: (_overlap_add_array(xp, g, hop, x.shape[-1]),), "stft_frames")


def _overlap_add(frames: Tensor, hop: int) -> Tensor:
    """(batch, frames, n_fft) -> (batch, n_fft + hop * (frames - 1)); backward cuts the gradient into frames."""
    xp = frames.xp
    _, count, n_fft = frames.shape
    out = _overlap_add_array(xp, frames.data, hop, n_fft + hop * (count - 1))
    return from_op(out, (frames,), lambda g: (g[:, _frame_index(xp, count, n_fft, hop)],), "overlap_add")


def _padded_window(window: Tensor | None, n_fft: int, win_length: int, like: Tensor, name: str) -> Tensor:
    """The window (ones when None) as like's dtype, zero-padded on both sides to n_fft points, centered."""
    if window is None:
        window = ones(win_length, dtype=like.dtype, device=like.device)
    elif not isinstance(window, Tensor) or window.ndim != 1 or window.shape[0] != win_length:
        raise RuntimeError(f"{name}: expected a 1D window tensor of size equal to win_length={win_length}, but got "
                           f"{_describe(window)}")
    if window.dtype != like.dtype:
        window = window.to(like.dtype)
    left = (n_fft - win_length) // 2
    return pad(window, (left, n_fft - win_length - left)) if win_length < n_fft else window


def _describe(value) -> str:
    return f"window with size {list(value.shape)}" if isinstance(value, Tensor) else type(value).__name__


def _lengths(n_fft: int, hop_length: int | None, win_length: int | None, name: str) -> tuple[int, int]:
    hop = n_fft // 4 if hop_length is None else hop_length
    win = n_fft if win_length is None else win_length
    if n_fft <= 0:
        raise RuntimeError(f"{name}: expected n_fft > 0, but got n_fft={n_fft}")
    if hop <= 0:
        raise RuntimeError(f"{name}: expected hop_length > 0, but got hop_length={hop}")
    if not 0 < win <= n_fft:
        raise RuntimeError(f"{name}: expected 0 < win_length <= n_fft, but got win_length={win}")
    return hop, win


# ---------------------------------------------------------------- stft / istft
def stft(input: Tensor, n_fft: int, hop_length: int | None = None, win_length: int | None = None,
         window: Tensor | None = None, center: bool = True, pad_mode: str = "reflect", normalized: bool = False,
         onesided: bool | None = None, return_complex: bool | None = None) -> Tensor:
    """The short-time Fourier transform of a real (length,) or (batch, length) signal: frames of n_fft samples
    every hop_length (n_fft // 4), times the window (win_length points, centered; ones when None), transformed.
    center pads n_fft // 2 samples on both sides (pad_mode). Returns (batch?, n_fft // 2 + 1 (onesided, the
    default) or n_fft, frames, 2): torch.view_as_real of PyTorch's result. normalized scales by 1 / sqrt(n_fft)."""
    name = "stft"
    if not isinstance(input, Tensor) or input.ndim not in (1, 2) or not input.dtype.is_floating_point:
        got = f"{input.dtype} of shape {input.shape}" if isinstance(input, Tensor) else type(input).__name__
        raise RuntimeError(f"{name}: expected a real floating 1D or 2D tensor, got {got}")
    hop, win = _lengths(n_fft, hop_length, win_length, name)
    x = input if input.ndim == 2 else input.unsqueeze(0)
    if center:
        x = pad(x, (n_fft // 2, n_fft // 2), mode=pad_mode)
    if not 0 < n_fft <= x.shape[-1]:
        raise RuntimeError(f"{name}: expected 0 < n_fft <= {x.shape[-1]} (the padded length), but got n_fft={n_fft}")
    frames = _frames(x, n_fft, hop) * _padded_window(window, n_fft, win, x, name)
    norm = "ortho" if normalized else "backward"
    spec = fft.rfft(frames, norm=norm) if onesided in (None, True) else fft.fft(fft.complex(frames), norm=norm)
    spec = spec.transpose(1, 2)  # (batch, frames, freqs, 2) -> (batch, freqs, frames, 2)
    return spec if input.ndim == 2 else spec.squeeze(0)


def istft(input: Tensor, n_fft: int, hop_length: int | None = None, win_length: int | None = None,
          window: Tensor | None = None, center: bool = True, normalized: bool = False, onesided: bool | None = None,
          length: int | None = None, return_complex: bool = False) -> Tensor:
    """The inverse of stft (least squares, Griffin-Lim's): the frames' inverse transforms, windowed, overlap-added
    and divided by the overlap-added squared window, which must nowhere be ~0 (PyTorch's NOLA check). input is
    (batch?, freqs, frames, 2) in Frost's complex layout; onesided defaults to freqs != n_fft. With return_complex
    the (two-sided) result stays complex (a trailing pair dimension), else it is real; length crops or zero-pads."""
    name = "istft"
    z = fft._pairs(input, name)
    if z.ndim not in (3, 4):
        raise RuntimeError(f"{name}: expected a (freqs, frames, 2) or (batch, freqs, frames, 2) tensor, got shape "
                           f"{z.shape}")
    hop, win = _lengths(n_fft, hop_length, win_length, name)
    z = z if z.ndim == 4 else z.unsqueeze(0)
    freqs, count = z.shape[1], z.shape[2]
    onesided = freqs != n_fft if onesided is None else onesided
    if return_complex and onesided:
        raise RuntimeError(f"{name}: cannot have onesided output if return_complex=True (freqs {freqs}, n_fft "
                           f"{n_fft})")
    expected = n_fft // 2 + 1 if onesided else n_fft
    if freqs != expected:
        raise RuntimeError(f"{name}: expected the frequency dimension (3rd to the last) of the input tensor to match "
                           f"{'n_fft / 2 + 1 when onesided=True' if onesided else 'n_fft when onesided=False'} "
                           f"({expected}), but got {freqs}")
    if count < 1:
        raise RuntimeError(f"{name}: the input has no frames (shape {input.shape})")
    spectra = z.transpose(1, 2)  # (batch, frames, freqs, 2)
    norm = "ortho" if normalized else "backward"
    if return_complex:
        frames = fft.ifft(spectra, norm=norm)
        signal = fft.complex(*[_overlap_add_windowed(frames[..., part], hop, window, n_fft, win, name)
                               for part in (0, 1)])
    else:
        frames = fft.irfft(spectra if onesided else spectra[:, :, :n_fft // 2 + 1], n=n_fft, norm=norm)
        signal = _overlap_add_windowed(frames, hop, window, n_fft, win, name)
    signal = _trim(signal, n_fft, hop, count, center, length, name, window, win)
    return signal if input.ndim == 4 else signal.squeeze(0)


def _overlap_add_windowed(frames: Tensor, hop: int, window: Tensor | None, n_fft: int, win: int, name: str) -> Tensor:
    return _overlap_add(frames * _padded_window(window, n_fft, win, frames, name), hop)


def _trim(signal: Tensor, n_fft: int, hop: int, count: int, center: bool, length: int | None, name: str,
          window: Tensor | None, win: int) -> Tensor:
    """The overlap-added signal divided by the window's squared overlap-add, cut to the part stft's center padding
    did not add (or to `length`, zero-padded past the end as PyTorch does)."""
    total = n_fft + hop * (count - 1)
    w = _padded_window(window, n_fft, win, signal, name)
    envelope = _overlap_add((w * w).reshape(1, 1, n_fft).expand(1, count, n_fft), hop)  # (1, total)
    start = n_fft // 2 if center else 0
    end = start + length if length is not None else (total - n_fft // 2 if center else total)
    stop = min(end, total)
    envelope = envelope[:, start:stop]
    if can_read_values(envelope) and envelope.numel() and float(envelope.abs().min()) < _ENVELOPE_MIN:
        raise RuntimeError(f"{name}: window overlap add min below {_ENVELOPE_MIN}: the window and hop_length={hop} "
                           f"do not satisfy NOLA (the squared windows must overlap-add to nonzero everywhere)")
    out = signal[..., start:stop] / envelope if signal.ndim == 2 else signal[:, start:stop] / envelope.unsqueeze(-1)
    tail = (0, end - stop) if signal.ndim == 2 else (0, 0, 0, end - stop)  # a complex signal: before its pairs
    return pad(out, tail) if end > stop else out
