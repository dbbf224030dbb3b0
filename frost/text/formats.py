"""BPE files: Frost's own text format (docs/text.md), tiktoken's rank files, Hugging Face tokenizer.json."""
from __future__ import annotations

import base64
import binascii
import json
import os
import tempfile
from typing import Protocol

from frost.io import expand_path


class Tokenizer(Protocol):
    """What the writers read of a frost.text.BPE (named here, not imported: bpe.py imports this module)."""
    pattern: str | None
    byte_ids: list[int]
    special_tokens: dict[str, int]
    merges: list[tuple[int, int]]
    vocab: dict[int, bytes]

MAGIC = "frost-bpe 1"


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Writes `text` to a temporary file beside `path`, then renames it over `path`: readers never see half."""
    path = expand_path(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


# ---- Frost's format ---------------------------------------------------------------------------------------

def write_frost(path: str | os.PathLike, tok: Tokenizer) -> None:
    lines = [MAGIC, "pattern " + json.dumps(tok.pattern)]
    identity = tok.byte_ids == list(range(256))
    lines.append("bytes identity" if identity else "bytes " + " ".join(map(str, tok.byte_ids)))
    lines.append(f"special {len(tok.special_tokens)}")
    lines += [f"{json.dumps(name)} {token}" for name, token in tok.special_tokens.items()]
    lines.append(f"merges {len(tok.merges)}")
    lines += [f"{left} {right}" for left, right in tok.merges]
    write_atomic(path, "\n".join(lines) + "\n")


class _Lines:
    """A file's lines with their numbers, for errors that say where the file is wrong."""

    def __init__(self, path: str) -> None:
        self.path = path
        with open(path, encoding="utf-8") as f:
            self.lines = f.read().split("\n")
        self.number = 0

    def error(self, what: str) -> ValueError:
        return ValueError(f"BPE.load: {self.path}, line {self.number}: {what}")

    def next(self, keyword: str) -> str:
        """The rest of the next line, which must start with `keyword`."""
        self.number += 1
        line = self.lines[self.number - 1] if self.number <= len(self.lines) else ""
        head, _, rest = line.partition(" ")
        if head != keyword:
            raise self.error(f"expected {keyword!r}, found {line[:40]!r}")
        return rest

    def count(self, keyword: str) -> int:
        rest = self.next(keyword)
        if not rest.isdigit():
            raise self.error(f"{keyword} needs a count, found {rest!r}")
        return int(rest)

    def raw(self) -> str:
        self.number += 1
        if self.number > len(self.lines):
            raise self.error("the file ends early")
        return self.lines[self.number - 1]


def _parse_json_line(lines: _Lines, line: str, what: str):
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        raise lines.error(f"{what} must be JSON, found {line[:40]!r}") from None


def read_frost(path: str | os.PathLike) -> dict:
    """The keyword arguments of BPE(...) stored in a Frost BPE file."""
    lines = _Lines(expand_path(path))
    if lines.raw() != MAGIC:
        raise lines.error(f"not a Frost BPE file (the first line must be {MAGIC!r})")
    pattern = _parse_json_line(lines, lines.next("pattern"), "the pattern")
    byte_field = lines.next("bytes")
    try:
        byte_ids = None if byte_field == "identity" else [int(i) for i in byte_field.split()]
    except ValueError:
        raise lines.error("bytes must be 'identity' or 256 ids") from None
    special_tokens = {}
    for _ in range(lines.count("special")):
        name, _, token = lines.raw().rpartition(" ")
        if not token.isdigit():
            raise lines.error("a special token line is '<json string> <id>'")
        special_tokens[_parse_json_line(lines, name, "a special token")] = int(token)
    merges = []
    for _ in range(lines.count("merges")):
        fields = lines.raw().split(" ")
        if len(fields) != 2 or not all(f.isdigit() for f in fields):
            raise lines.error("a merge line is '<left id> <right id>'")
        merges.append((int(fields[0]), int(fields[1])))
    return {"merges": merges, "pattern": pattern, "special_tokens": special_tokens, "byte_ids": byte_ids}


# ---- tiktoken ---------------------------------------------------------------------------------------------

def _unique_token_bytes(tok: Tokenizer, exporter: str) -> list[bytes]:
    pieces = [tok.vocab[i] for i in range(256 + len(tok.merges))]
    if len(set(pieces)) != len(pieces):
        seen: dict[bytes, int] = {}
        for token, piece in enumerate(pieces):
            if piece in seen:
                raise ValueError(f"{exporter}: tokens {seen[piece]} and {token} have the same bytes {piece!r}; "
                                 f"the format maps bytes to one id")
            seen[piece] = token
    return pieces


def write_tiktoken(path: str | os.PathLike, tok: Tokenizer) -> None:
    pieces = _unique_token_bytes(tok, "BPE.save_tiktoken")
    write_atomic(path, "".join(f"{base64.b64encode(piece).decode()} {rank}\n" for rank, piece in enumerate(pieces)))


def read_tiktoken_ranks(path: str) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                encoded, rank = line.split()
                ranks[base64.b64decode(encoded, validate=True)] = int(rank)
            except (ValueError, binascii.Error):
                raise ValueError(f"BPE.from_tiktoken: {path}, line {number}: expected '<base64> <rank>', "
                                 f"found {line[:40]!r}") from None
    return ranks


def _split_in_two(piece: bytes, ranks: dict[bytes, int], rank: int) -> list[bytes]:
    """tiktoken's merging of `piece` with the tokens ranked below `rank`: a BPE token ends in two parts."""
    parts = [piece[i:i + 1] for i in range(len(piece))]
    while len(parts) > 2:
        best, best_rank = -1, rank
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best_rank:
                best, best_rank = i, r
        if best == -1:
            break
        parts[best:best + 2] = [parts[best] + parts[best + 1]]
    return parts


def read_tiktoken(path: str | os.PathLike) -> tuple[list[tuple[int, int]], list[int]]:
    """(merges, byte_ids) recovered from a rank file, as minbpe does for GPT-4's ranks."""
    path = expand_path(path)
    ranks = read_tiktoken_ranks(path)
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"BPE.from_tiktoken: {path}: the ranks must be 0..{len(ranks) - 1}, each once")
    by_rank = sorted(ranks, key=ranks.get)
    if len(by_rank) < 256 or any(len(piece) != 1 for piece in by_rank[:256]):
        raise ValueError(f"BPE.from_tiktoken: {path}: ranks 0..255 must be the 256 single bytes")
    byte_ids = [ranks[bytes([b])] for b in range(256)]
    merges = []
    for rank in range(256, len(by_rank)):
        parts = _split_in_two(by_rank[rank], ranks, rank)
        if len(parts) != 2:
            raise ValueError(f"BPE.from_tiktoken: {path}: token {rank} {by_rank[rank]!r} is not a merge of two "
                             f"lower-ranked tokens")
        merges.append((ranks[parts[0]], ranks[parts[1]]))
    return merges, byte_ids


# ---- Hugging Face tokenizers ------------------------------------------------------------------------------

def byte_to_unicode() -> dict[int, str]:
    """GPT-2's map from bytes to printable characters, which byte-level tokenizer.json files spell tokens in."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = dict(zip(printable, printable))
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return {b: chr(c) for b, c in chars.items()}


def write_huggingface(path: str | os.PathLike, tok: Tokenizer) -> None:
    pieces = _unique_token_bytes(tok, "BPE.save_huggingface")
    mapping = byte_to_unicode()
    spelled = ["".join(mapping[b] for b in piece) for piece in pieces]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    if tok.pattern is None:
        pre_tokenizer = byte_level
    else:
        split = {"type": "Split", "pattern": {"Regex": tok.pattern}, "behavior": "Isolated", "invert": False}
        pre_tokenizer = {"type": "Sequence", "pretokenizers": [split, byte_level]}
    added = [{"id": token, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for name, token in sorted(tok.special_tokens.items(),
                                                                              key=lambda item: item[1])]
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
             "vocab": {s: token for token, s in enumerate(spelled)},
             "merges": [f"{spelled[left]} {spelled[right]}" for left, right in tok.merges]}
    document = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
                "pre_tokenizer": pre_tokenizer, "post_processor": None,
                "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
                "model": model}
    write_atomic(path, json.dumps(document, ensure_ascii=False, indent=1) + "\n")
