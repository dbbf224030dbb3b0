"""Pre-tokenization: split text into chunks with a regex (as tiktoken does) and count the unique chunks.

Chunks never cross a special token or a document (file) boundary. Counting keeps first-occurrence
order, which the trainer's tie rule needs. Long texts are cut into blocks at points where the built-in
patterns can never match across (see SAFE_SPLITS), so a block's chunks are exactly the whole text's
chunks there and memory stays bounded; a custom pattern is applied to each document whole.
"""
from __future__ import annotations

import multiprocessing
import os
import sys
from collections import Counter, deque
from concurrent.futures import ProcessPoolExecutor
from functools import lru_cache
from typing import Callable, Iterable, Iterator

import regex

# tiktoken's cl100k_base pattern (GPT-4) and r50k_base pattern (GPT-2), as tiktoken writes them today
GPT4_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
                r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s""")
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
PATTERNS = {"gpt4": GPT4_PATTERN, "gpt2": GPT2_PATTERN}

# Where each built-in pattern always ends a chunk and starts a fresh one, whatever follows: GPT-4's
# whitespace runs end at their last line break, GPT-2's one character before the run's end (the last
# one joins the next word). A block cut there chunks exactly as the whole text (tests fuzz this).
SAFE_SPLITS = {
    GPT4_PATTERN: regex.compile(r"[\r\n](?=[^\S\r\n]*\S)"),
    GPT2_PATTERN: regex.compile(r"(?<=\s)(?=\s\S)"),
}
BLOCK_CHARS = 1 << 20
TASK_CHARS = 1 << 23  # text per task sent to a worker process: large enough to dwarf the pickling
CAN_FORK = sys.platform.startswith("linux")  # fork is unsafe with macOS's system libraries, absent on Windows


def resolve_pattern(pattern: str | None) -> str | None:
    """"gpt4"/"gpt2" -> that pattern; None -> None (no split); any other string is the pattern itself."""
    if pattern is None:
        return None
    if not isinstance(pattern, str):
        raise TypeError(f"BPE: pattern must be 'gpt4', 'gpt2', None or a regex string, got {type(pattern).__name__}")
    resolved = PATTERNS.get(pattern, pattern)
    try:
        regex.compile(resolved)
    except regex.error as error:
        raise ValueError(f"BPE: pattern {pattern!r} is not a valid regex: {error}") from None
    return resolved


def blocks(text: str, pattern: str | None, block_chars: int | None = None) -> Iterator[str]:
    """`text` in pieces of about `block_chars` (default BLOCK_CHARS) that `pattern` chunks as the whole text
    does (one piece if it can't)."""
    block_chars = block_chars or BLOCK_CHARS
    safe = SAFE_SPLITS.get(pattern)
    if safe is None or len(text) <= block_chars:
        yield text
        return
    start = 0
    while len(text) - start > block_chars:
        cut = safe.search(text, start + block_chars)
        if cut is None:
            break
        end = cut.end() if pattern == GPT4_PATTERN else cut.start()
        yield text[start:end]
        start = end
    yield text[start:]


def special_splitter(special_tokens: Iterable[str]) -> regex.Pattern | None:
    """A regex matching any of the special tokens (longest first), capturing it; None if there are none."""
    ordered = sorted(set(special_tokens), key=lambda s: (-len(s), s))
    if not ordered:
        return None
    return regex.compile("(" + "|".join(regex.escape(s) for s in ordered) + ")")


def split_specials(text: str, splitter: regex.Pattern | None) -> list[str]:
    """The ordinary text between special tokens (the specials themselves dropped)."""
    if splitter is None:
        return [text]
    return splitter.split(text)[::2]


def chunks_of(text: str, compiled: regex.Pattern | None) -> list[str]:
    if compiled is None:
        return [text] if text else []
    return compiled.findall(text)


def count_chunks(documents: Iterable[str], pattern: str | None, special_tokens: Iterable[str] = (),
                 progress: Callable[[int], object] | None = None, workers: int = 1) -> Counter:
    """Occurrences of each chunk over all documents, keys in order of first occurrence.

    With workers > 1 (and where processes can fork: Linux), blocks are counted in that many processes (the
    regex holds the GIL) and the counts merged in text order. `progress`, if given, is called with the
    number of characters done.
    """
    tasks = _tasks(documents, pattern, special_splitter(special_tokens))
    if workers <= 1 or not CAN_FORK:
        counts: Counter = Counter()
        for task in tasks:
            counts.update(_count_task(pattern, task))
            if progress is not None:
                progress(sum(map(len, task)))
        return counts
    return _count_in_processes(tasks, pattern, progress, workers)


def _tasks(documents: Iterable[str], pattern: str | None, splitter: regex.Pattern | None) -> Iterator[list[str]]:
    """The documents' ordinary text as lists of blocks of about TASK_CHARS characters, in text order."""
    batch: list[str] = []
    size = 0
    for document in documents:
        for part in split_specials(document, splitter):
            for block in blocks(part, pattern):
                batch.append(block)
                size += len(block)
                if size >= TASK_CHARS:
                    yield batch
                    batch, size = [], 0
    if batch:
        yield batch


@lru_cache(maxsize=8)
def _compiled(pattern: str | None) -> regex.Pattern | None:
    return regex.compile(pattern) if pattern is not None else None


def _count_task(pattern: str | None, texts: list[str]) -> Counter:
    compiled = _compiled(pattern)
    counts: Counter = Counter()
    for text in texts:
        counts.update(chunks_of(text, compiled))
    return counts


def _count_in_processes(tasks: Iterator[list[str]], pattern: str | None, progress, workers: int) -> Counter:
    # fork: a worker starts at once with this module loaded and runs only the regex and a Counter, which take
    # no lock another thread could hold. spawn and forkserver would re-run the caller's script in every
    # worker (so a script without `if __name__ == "__main__":` would fail) and import frost again.
    context = multiprocessing.get_context("fork")
    counts: Counter = Counter()
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        pending: deque = deque()
        for task in tasks:
            pending.append((pool.submit(_count_task, pattern, task), sum(map(len, task))))
            while len(pending) > 2 * workers:  # bounded memory: a few tasks in flight per worker
                _merge(counts, pending.popleft(), progress)
        while pending:
            _merge(counts, pending.popleft(), progress)
    return counts


def _merge(counts: Counter, done: tuple, progress) -> None:
    future, size = done
    counts.update(future.result())
    if progress is not None:
        progress(size)


def read_document(path: str | os.PathLike) -> str:
    """A file's text; bytes that are not UTF-8 are kept as lone surrogates and trained on as raw bytes."""
    with open(path, "rb") as f:
        return f.read().decode("utf-8", errors="surrogateescape")


def clean_text(text: str) -> str:
    """Text tiktoken would encode: lone surrogates (not UTF-8 encodable) become U+FFFD, as tiktoken does."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
