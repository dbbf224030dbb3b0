"""Byte-level BPE: train on your own text, encode, decode, save, and trade files with tiktoken and HF tokenizers."""
from __future__ import annotations

import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from itertools import chain
from typing import AbstractSet, Collection, Iterable, Sequence

import numpy as np
import regex
from tqdm import tqdm

from frost.io import expand_path
from frost.text import formats, kernels
from frost.text.pretokenize import blocks, clean_text, count_chunks, read_document, resolve_pattern, special_splitter

MERGES_PER_CALL = 256  # merges per compiled call between progress updates
PARALLEL_MIN_SIZE = 1 << 24  # below 16 MB of text, starting worker processes costs more than it saves
CACHE_LIMIT = 1 << 20  # chunks kept by the encoding cache before it starts over


def available_cores() -> int:
    """The cores this process may run on (a container's share, not the host's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _is_path(item) -> bool:
    return isinstance(item, (str, os.PathLike))


def documents_of(text_or_files) -> tuple[Iterable[str], int, str]:
    """(documents, total characters or bytes for the progress bar, what they are) for train's first argument.

    A str is the text itself, bytes are raw text (kept byte for byte), a path or a list of paths are files.
    """
    if isinstance(text_or_files, str):
        return [clean_text(text_or_files)], len(text_or_files), "text"
    if isinstance(text_or_files, (bytes, bytearray)):
        return [bytes(text_or_files).decode("utf-8", errors="surrogateescape")], len(text_or_files), "text"
    files = [text_or_files] if isinstance(text_or_files, os.PathLike) else list(text_or_files)
    if not all(_is_path(f) for f in files):
        raise TypeError("BPE.train: text_or_files must be a str, bytes, a path or a list of paths")
    paths = [expand_path(f) for f in files]
    for path in paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"BPE.train: no such file {path!r}")
    return (read_document(path) for path in paths), sum(os.path.getsize(p) for p in paths), "files"


def word_arrays(counts: dict[str, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The unique chunks of >= 2 bytes laid end to end: (tok, nxt, prv, weight) per byte position."""
    words = [(chunk.encode("utf-8", errors="surrogateescape"), n) for chunk, n in counts.items()]
    words = [(b, n) for b, n in words if len(b) >= 2]  # a single byte has no pair to merge
    data = b"".join(b for b, _ in words)
    lengths = np.fromiter((len(b) for b, _ in words), np.int64, len(words))
    ends = np.cumsum(lengths)
    tok = np.frombuffer(data, np.uint8).astype(np.int64)
    positions = np.arange(len(data), dtype=np.int64)
    nxt, prv = positions + 1, positions - 1
    nxt[ends - 1] = -1
    prv[ends - lengths] = -1
    weight = np.repeat(np.fromiter((n for _, n in words), np.int64, len(words)), lengths)
    return tok, nxt, prv, weight


def train_merges(counts: dict[str, int], num_merges: int, progress: bool) -> list[tuple[int, int]]:
    tok, nxt, prv, weight = word_arrays(counts)
    pairs, nodes, hkeys, hvals, heap, counters = kernels.initial_state(tok, nxt, weight)
    merges = np.zeros((num_merges, 2), np.int64)
    with tqdm(total=num_merges, desc="BPE merges", disable=not progress, unit="merge") as bar:
        while counters[kernels.N_MERGES] < num_merges:
            before = counters[kernels.N_MERGES]
            pairs, nodes, hkeys, hvals, heap = kernels.merge_steps(
                tok, nxt, prv, weight, pairs, nodes, hkeys, hvals, heap, counters, merges, 256, MERGES_PER_CALL)
            bar.update(int(counters[kernels.N_MERGES] - before))
            if counters[kernels.N_MERGES] - before < MERGES_PER_CALL:
                break
    return [(int(a), int(b)) for a, b in merges[:counters[kernels.N_MERGES]]]


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_train_arguments(vocab_size, specials: list, num_workers) -> None:
    if not all(isinstance(s, str) and s for s in specials):
        raise ValueError(f"BPE.train: special_tokens must be non-empty strings, got {specials!r}")
    if not _is_int(vocab_size) or vocab_size < 256 + len(specials):
        raise ValueError(f"BPE.train: vocab_size must be an int >= 256 + {len(specials)} special tokens, "
                         f"got {vocab_size!r}")
    if num_workers is not None and (not _is_int(num_workers) or num_workers < 1):
        raise ValueError(f"BPE.train: num_workers must be a positive int or None, got {num_workers!r}")


def _special_sets(allowed_special, disallowed_special, specials: AbstractSet[str]) -> tuple[set, set]:
    """tiktoken's rules, plus minbpe's names: "none_raise" allows none and raises on any, "none" allows none
    and encodes them as ordinary text."""
    if allowed_special == "none_raise":
        allowed_special = set()
    elif allowed_special == "none":
        allowed_special, disallowed_special = set(), ()
    elif allowed_special == "all":
        allowed_special = set(specials)
    elif isinstance(allowed_special, str) or not isinstance(allowed_special, Collection):
        raise ValueError(f"BPE.encode: allowed_special must be 'none_raise', 'none', 'all' or a set of special "
                         f"tokens, got {allowed_special!r}")
    allowed = set(allowed_special)
    if unknown := allowed - specials:
        raise ValueError(f"BPE.encode: allowed_special names tokens that are not special tokens: {sorted(unknown)}")
    disallowed = specials - allowed if disallowed_special == "all" else set(disallowed_special)
    return allowed, disallowed


class BPE:
    """A byte-level BPE tokenizer: 256 byte tokens, merges (left, right) -> new id in order, special tokens.

    Build one with `BPE.train`, `BPE.load`, or `BPE.from_tiktoken`. `byte_ids[b]` is byte b's token id
    (b itself for a trained tokenizer; a permutation of 0..255 for tiktoken files such as cl100k);
    the i-th merge makes token 256 + i.
    """

    def __init__(self, merges: Sequence[tuple[int, int]] = (), pattern: str | None = "gpt4",
                 special_tokens: dict[str, int] | None = None, byte_ids: Sequence[int] | None = None) -> None:
        self.pattern = resolve_pattern(pattern)
        self.byte_ids = list(range(256)) if byte_ids is None else [int(i) for i in byte_ids]
        if sorted(self.byte_ids) != list(range(256)):
            raise ValueError("BPE: byte_ids must be a permutation of 0..255")
        self.merges = [(int(a), int(b)) for a, b in merges]
        token_bytes: list[bytes] = [b""] * (256 + len(self.merges))
        for byte, token in enumerate(self.byte_ids):
            token_bytes[token] = bytes([byte])
        for i, (left, right) in enumerate(self.merges):
            if not (0 <= left < 256 + i and 0 <= right < 256 + i):
                raise ValueError(f"BPE: merge {i} ({left}, {right}) uses a token not made before it")
            token_bytes[256 + i] = token_bytes[left] + token_bytes[right]
        self.special_tokens = dict(special_tokens or {})
        for name, token in self.special_tokens.items():
            if not isinstance(name, str) or not name or not _is_int(token) or token < len(token_bytes):
                raise ValueError(f"BPE: special token {name!r} -> {token!r} must be a non-empty str with an id "
                                 f"past the {len(token_bytes)} merged tokens")
        if len(set(self.special_tokens.values())) != len(self.special_tokens):
            raise ValueError("BPE: two special tokens share an id")
        self.vocab = dict(enumerate(token_bytes))
        self.vocab.update({token: name.encode("utf-8") for name, token in self.special_tokens.items()})
        self._decode_table: list[bytes | None] = [None] * self.n_vocab
        for token, piece in self.vocab.items():
            self._decode_table[token] = piece
        self._regex = regex.compile(self.pattern) if self.pattern is not None else None
        self._special_names = frozenset(self.special_tokens)
        self._byte_ids = np.array(self.byte_ids, np.int64)
        self._merge_keys, self._merge_ids = kernels.merge_table(np.array(self.merges, np.int64).reshape(-1, 2), 256)
        self._cache: dict[str, tuple[int, ...]] = {}

    # ---- construction ------------------------------------------------------------------------------------

    @classmethod
    def train(cls, text_or_files, vocab_size: int, pattern: str | None = "gpt4",
              special_tokens: Iterable[str] | None = None, progress: bool = True,
              num_workers: int | None = None) -> "BPE":
        """Learns vocab_size - 256 - len(special_tokens) merges from a str, bytes, a file path or a list of them.

        Each step merges the most frequent adjacent pair counted within chunks; among equals the pair that
        occurs first in the text wins (minbpe's rule). Chunks never cross a special token or a file boundary.
        Special tokens take the ids after the merges. If the text runs out of pairs first, the vocabulary
        is smaller than vocab_size (with a warning). The text is split into chunks by `num_workers`
        processes (default: one per core from 16 MB of text on, else 1); the merges run on one core.
        """
        specials = list(dict.fromkeys(special_tokens or ()))
        _check_train_arguments(vocab_size, specials, num_workers)
        resolved = resolve_pattern(pattern)
        documents, size, kind = documents_of(text_or_files)
        if num_workers is None:
            num_workers = available_cores() if size >= PARALLEL_MIN_SIZE else 1
        num_merges = vocab_size - 256 - len(specials)
        with tqdm(total=size, desc="BPE chunks", disable=not progress, unit="B" if kind == "files" else "char",
                  unit_scale=True) as bar:
            counts = count_chunks(documents, resolved, specials, progress=bar.update if progress else None,
                                  workers=num_workers)
        merges = train_merges(counts, num_merges, progress)
        if len(merges) < num_merges:
            warnings.warn(f"BPE.train: the text has only {len(merges)} merges to give, not {num_merges}; the "
                          f"vocabulary has {256 + len(merges) + len(specials)} tokens instead of {vocab_size}",
                          stacklevel=2)
        first_special = 256 + len(merges)
        return cls(merges, resolved, {s: first_special + i for i, s in enumerate(specials)})

    @classmethod
    def load(cls, path: str | os.PathLike) -> "BPE":
        """A tokenizer written by `save`."""
        return cls(**formats.read_frost(path))

    @classmethod
    def from_tiktoken(cls, path: str | os.PathLike, pattern: str | None = "gpt4",
                      special_tokens: dict[str, int] | None = None) -> "BPE":
        """A tokenizer from a tiktoken rank file ("<base64 bytes> <rank>" per line), e.g. cl100k_base.tiktoken.

        The rank file holds neither the split pattern nor the special tokens: pass them (cl100k: "gpt4",
        {"<|endoftext|>": 100257, ...}).
        """
        merges, byte_ids = formats.read_tiktoken(path)
        return cls(merges, pattern, special_tokens, byte_ids)

    def save(self, path: str | os.PathLike) -> None:
        """Writes the tokenizer in Frost's text format (docs/text.md), atomically."""
        formats.write_frost(path, self)

    def save_tiktoken(self, path: str | os.PathLike) -> None:
        """Writes tiktoken's rank file: tiktoken.Encoding(name, pat_str=tok.pattern, mergeable_ranks=
        tiktoken.load.load_tiktoken_bpe(path), special_tokens=tok.special_tokens) then encodes as `tok`."""
        formats.write_tiktoken(path, self)

    def save_huggingface(self, path: str | os.PathLike) -> None:
        """Writes a Hugging Face tokenizer.json: tokenizers.Tokenizer.from_file(path) then encodes as `tok`
        (special tokens always allowed there)."""
        formats.write_huggingface(path, self)

    # ---- encoding and decoding ---------------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        """One past the largest token id (the embedding size a model needs)."""
        return max(self.vocab) + 1

    def __repr__(self) -> str:
        return f"BPE(n_vocab={self.n_vocab}, merges={len(self.merges)}, special_tokens={len(self.special_tokens)})"

    def encode(self, text: str, allowed_special="none_raise", disallowed_special="all") -> list[int]:
        """Token ids of `text`. Special tokens, as in tiktoken: "none_raise" (the default) encodes none and
        raises ValueError if the text contains one; "none" encodes them as ordinary text; "all" or a set
        encodes those as their ids (others raise, unless `disallowed_special=()`)."""
        if not isinstance(text, str):
            raise TypeError(f"BPE.encode: text must be a str, got {type(text).__name__}")
        allowed, disallowed = _special_sets(allowed_special, disallowed_special, self._special_names)
        if disallowed and (found := special_splitter(disallowed).search(text)):
            raise ValueError(f"BPE.encode: the text contains the special token {found.group()!r}; pass "
                             f"allowed_special to encode it as a special token, or allowed_special='none' to "
                             f"encode it as ordinary text")
        text = clean_text(text)
        splitter = special_splitter(allowed)
        if splitter is None:
            return self._encode_clean(text)
        ids: list[int] = []
        for i, part in enumerate(splitter.split(text)):
            if i % 2:
                ids.append(self.special_tokens[part])
            elif part:
                ids.extend(self._encode_clean(part))
        return ids

    def encode_ordinary(self, text: str) -> list[int]:
        """Token ids of `text`, special tokens' strings encoded as ordinary text."""
        if not isinstance(text, str):
            raise TypeError(f"BPE.encode_ordinary: text must be a str, got {type(text).__name__}")
        return self._encode_clean(clean_text(text))

    def _encode_clean(self, text: str) -> list[int]:
        ids: list[int] = []
        for block in blocks(text, self.pattern):
            chunks = self._regex.findall(block) if self._regex is not None else [block]
            ids.extend(self._lookup(chunks))
        return ids

    def encode_batch(self, texts: Sequence[str], num_threads: int | None = None, allowed_special="none_raise",
                     disallowed_special="all") -> list[list[int]]:
        """`encode` of each text, on `num_threads` threads (default: the cores available)."""
        workers = available_cores() if num_threads is None else num_threads
        if not _is_int(workers) or workers < 1:
            raise ValueError(f"BPE.encode_batch: num_threads must be positive, got {num_threads}")
        encode = lambda text: self.encode(text, allowed_special, disallowed_special)  # noqa: E731
        if workers == 1 or len(texts) < 2:
            return [encode(t) for t in texts]
        with ThreadPoolExecutor(workers, thread_name_prefix="frost-bpe") as pool:
            return list(pool.map(encode, texts))

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The bytes of `ids`, joined."""
        ids = ids.tolist() if isinstance(ids, np.ndarray) else list(ids)
        try:
            if ids and min(ids) < 0:  # a negative index would read the table from its end
                raise IndexError
            return b"".join([self._decode_table[i] for i in ids])
        except (IndexError, TypeError):
            bad = next(i for i in ids if not (isinstance(i, (int, np.integer)) and 0 <= i < self.n_vocab)
                       or self._decode_table[i] is None)
            raise ValueError(f"BPE.decode: {bad!r} is not a token id of this tokenizer "
                             f"(ids are 0..{self.n_vocab - 1})") from None

    def decode(self, ids: Iterable[int], errors: str = "replace") -> str:
        """The text of `ids`; bytes that are not valid UTF-8 become U+FFFD (as tiktoken)."""
        return self.decode_bytes(ids).decode("utf-8", errors=errors)

    def _lookup(self, chunks: list[str]) -> list[int]:
        cache = self._cache
        while True:
            try:
                return list(chain.from_iterable(map(cache.__getitem__, chunks)))
            except KeyError:
                self._fill_cache(chunks)

    def _fill_cache(self, chunks: list[str]) -> None:
        missing = [c for c in dict.fromkeys(chunks) if c not in self._cache]
        if len(self._cache) + len(missing) > CACHE_LIMIT:
            self._cache.clear()
        encoded = [c.encode("utf-8") for c in missing]
        offsets = np.zeros(len(encoded) + 1, np.int64)
        np.cumsum([len(b) for b in encoded], out=offsets[1:])
        data = np.frombuffer(b"".join(encoded), np.uint8)
        ids, id_offsets = kernels.encode_chunks(data, offsets, self._byte_ids, self._merge_keys, self._merge_ids)
        ids, id_offsets = ids.tolist(), id_offsets.tolist()
        self._cache.update({chunk: tuple(ids[id_offsets[k]:id_offsets[k + 1]]) for k, chunk in enumerate(missing)})
