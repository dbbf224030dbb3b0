"""Text: a byte-level BPE tokenizer that trains on your own text (frost.text.BPE). See docs/text.md."""
try:  # the text extra's packages: say how to get them rather than a bare ModuleNotFoundError
    import numba  # noqa: F401
    import regex  # noqa: F401
except ImportError as missing:
    raise ImportError(f"frost.text needs {missing.name}, from the text extra: "
                      f"pip install \"frost-dl[text]\"") from missing

from frost.text.bpe import BPE
from frost.text.pretokenize import GPT2_PATTERN, GPT4_PATTERN

__all__ = ["BPE", "GPT2_PATTERN", "GPT4_PATTERN"]
