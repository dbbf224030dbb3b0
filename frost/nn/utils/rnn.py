"""Sequence batching helpers, as torch.nn.utils.rnn: pad_sequence."""
from __future__ import annotations

from typing import Sequence

from frost.tensor import Tensor, from_op

__all__ = ["pad_sequence"]


def pad_sequence(sequences: Sequence[Tensor], batch_first: bool = False, padding_value: float = 0.0,
                 padding_side: str = "right") -> Tensor:
    """Stack tensors of shapes (L_i, *) into (max L, B, *) (or (B, max L, *) with batch_first), filling the
    rest with padding_value after each sequence (padding_side="right") or before it ("left"); differentiable."""
    sequences = list(sequences)
    _check(sequences, padding_side)
    first = sequences[0]
    xp, trailing = first.xp, first.shape[1:]
    longest = max(s.shape[0] for s in sequences)
    out = xp.full((len(sequences), longest) + trailing, padding_value, dtype=first.data.dtype)
    spans = [slice(0, s.shape[0]) if padding_side == "right" else slice(longest - s.shape[0], longest)
             for s in sequences]
    for i, (s, span) in enumerate(zip(sequences, spans)):
        out[i, span] = s.data
    if not batch_first:
        out = xp.ascontiguousarray(out.swapaxes(0, 1))

    def backward(g):
        g = g if batch_first else g.swapaxes(0, 1)
        return tuple(g[i, span] for i, span in enumerate(spans))
    return from_op(out, tuple(sequences), backward, "pad_sequence")


def _check(sequences: list, padding_side: str) -> None:
    if not sequences:
        raise RuntimeError("pad_sequence: received an empty list of sequences")
    if padding_side not in ("left", "right"):
        raise ValueError(f"pad_sequence: padding_side must be 'left' or 'right', got {padding_side!r}")
    first = sequences[0]
    for i, s in enumerate(sequences):
        if not isinstance(s, Tensor):
            raise TypeError(f"pad_sequence: sequences[{i}] must be a Tensor, got {type(s).__name__}")
        if s.ndim == 0 or s.shape[1:] != first.shape[1:] or s.dtype != first.dtype or s.device != first.device:
            raise RuntimeError(f"pad_sequence: every sequence must be (L, *) with the trailing shape, dtype and "
                               f"device of the first, {first.shape[1:]} {first.dtype.name} {first.device}; "
                               f"sequences[{i}] is {s.shape} {s.dtype.name} {s.device}")
