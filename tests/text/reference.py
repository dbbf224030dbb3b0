"""The oracle: minbpe's RegexTokenizer (Karpathy), written out plainly, for documents split as frost.text splits them.

Training recounts every adjacent pair of every chunk occurrence at each step (quadratic, fine for small texts)
and merges `max(stats, key=stats.get)`: among equal counts the pair first inserted in the dict, which is the
pair seen first in text order. Encoding merges the lowest-ranked pair present, everywhere, until none is left.
"""
import regex


def chunk_bytes(documents, pattern, special_tokens=()):
    """Every chunk occurrence as a list of byte values, in text order; chunks stop at specials and documents."""
    compiled = regex.compile(pattern) if pattern is not None else None
    splitter = (regex.compile("|".join(regex.escape(s) for s in sorted(special_tokens, key=len, reverse=True)))
                if special_tokens else None)
    chunks = []
    for document in documents:
        for part in (splitter.split(document) if splitter else [document]):
            pieces = compiled.findall(part) if compiled else ([part] if part else [])
            chunks += [list(piece.encode("utf-8", errors="surrogateescape")) for piece in pieces]
    return chunks


def get_stats(ids, counts):
    for pair in zip(ids, ids[1:]):
        counts[pair] = counts.get(pair, 0) + 1


def merge(ids, pair, idx):
    out, i = [], 0
    while i < len(ids):
        if i < len(ids) - 1 and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(idx)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def train(documents, num_merges, pattern, special_tokens=()):
    """minbpe's merges (stops early when no pair is left, where minbpe would fail on an empty max)."""
    chunks = chunk_bytes(documents, pattern, special_tokens)
    merges = []
    for i in range(num_merges):
        stats = {}
        for ids in chunks:
            get_stats(ids, stats)
        if not stats:
            break
        pair = max(stats, key=stats.get)
        chunks = [merge(ids, pair, 256 + i) for ids in chunks]
        merges.append(pair)
    return merges


def encode(text, merges, pattern):
    """minbpe's encode_ordinary."""
    ranks = {pair: 256 + i for i, pair in enumerate(merges)}
    ids = []
    for chunk in chunk_bytes([text], pattern):
        while len(chunk) >= 2:
            stats = {}
            get_stats(chunk, stats)
            pair = min(stats, key=lambda p: ranks.get(p, float("inf")))
            if pair not in ranks:
                break
            chunk = merge(chunk, pair, ranks[pair])
        ids += chunk
    return ids
