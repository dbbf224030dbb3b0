"""The compiled hot loops of BPE: incremental merge training and the encoding of unique chunks (Numba).

Why Numba: the trainer's inner loop updates a few pair counters per merged position, tens of millions
of times on a 100 MB corpus; as Python bytecode that is minutes, compiled it is seconds. Numba ships
as wheels (LLVM inside), needs no compiler at install time, and caches the machine code on disk
(`cache=True`), so only the first call on a machine pays the compilation.

Training state (one word = one unique pre-tokenized chunk, its bytes laid out in first-occurrence order):
- per position: `tok` (current token id, -1 once merged away), `nxt`/`prv` (the neighbouring live
  position in the same word, -1 at the word's ends), `weight` (the word's number of occurrences);
- per pair, a row of `pairs` (columns below) and a linked list of the positions where it may occur in
  `nodes` (pos, next); a list may hold stale positions, checked against `tok`/`nxt` when read;
- a max-heap of (count, first position, pair) with lazy invalidation: a pair's entry is the last one
  pushed for it (ENTRY_COUNT/ENTRY_FIRST); its key is never worse than the pair's true key, so a popped
  entry whose key is still exact is the true maximum.
The key orders pairs by count, then by first position: minbpe's rule (`max` over a dict filled in
text order keeps the earliest-seen pair among equals), since positions follow first occurrence.
"""
from __future__ import annotations

import numpy as np
from numba import njit  # the text extra: pip install "frost-dl[text]"

LEFT, RIGHT, COUNT, FIRST, DIRTY, ENTRY_COUNT, ENTRY_FIRST, HEAD, LENGTH, TOUCHED = range(10)
PAIR_COLUMNS = 10
NO_POSITION = np.int64(1) << 62
HASH_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: the product's high bits are well mixed
# counters: the used sizes of the growable tables, and the number of merges done
N_PAIRS, N_NODES, HEAP_SIZE, N_MERGES = range(4)


@njit(cache=True)
def _slot(hkeys, key):
    """The hash slot of `key`: where it is, or the empty slot where it would go."""
    mask = hkeys.size - 1
    i = np.int64((np.uint64(key) * HASH_MULTIPLIER) >> np.uint64(32)) & mask
    while hkeys[i] != key and hkeys[i] != -1:
        i = (i + 1) & mask
    return i


@njit(cache=True)
def _rehash(hkeys, hvals, capacity):
    new_keys = np.full(capacity, -1, np.int64)
    new_vals = np.empty(capacity, np.int64)
    for i in range(hkeys.size):
        if hkeys[i] != -1:
            j = _slot(new_keys, hkeys[i])
            new_keys[j] = hkeys[i]
            new_vals[j] = hvals[i]
    return new_keys, new_vals


@njit(cache=True)
def _grow_rows(table, rows):
    grown = np.empty((rows, table.shape[1]), table.dtype)
    for i in range(table.shape[0]):  # loops, not slice assignment: that costs seconds of compilation
        for j in range(table.shape[1]):
            grown[i, j] = table[i, j]
    return grown


@njit(cache=True)
def _better(count_a, first_a, count_b, first_b):
    return count_a > count_b or (count_a == count_b and first_a < first_b)


@njit(cache=True)
def _heap_push(heap, size, count, first, pair):
    i = size
    while i > 0:
        parent = (i - 1) >> 1
        if not _better(count, first, heap[parent, 0], heap[parent, 1]):
            break
        heap[i, 0], heap[i, 1], heap[i, 2] = heap[parent, 0], heap[parent, 1], heap[parent, 2]
        i = parent
    heap[i, 0], heap[i, 1], heap[i, 2] = count, first, pair
    return size + 1


@njit(cache=True)
def _heap_pop(heap, size):
    """Removes the top entry (read it before); returns the new size."""
    size -= 1
    count, first, pair = heap[size, 0], heap[size, 1], heap[size, 2]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and _better(heap[child + 1, 0], heap[child + 1, 1], heap[child, 0], heap[child, 1]):
            child += 1
        if not _better(heap[child, 0], heap[child, 1], count, first):
            break
        heap[i, 0], heap[i, 1], heap[i, 2] = heap[child, 0], heap[child, 1], heap[child, 2]
        i = child
    heap[i, 0], heap[i, 1], heap[i, 2] = count, first, pair
    return size


@njit(cache=True)
def _pair_id(pairs, hkeys, hvals, counters, left, right):
    """The row of pair (left, right), added if new (the caller has made room in `pairs` and the hash)."""
    key = (np.int64(left) << 32) | np.int64(right)
    i = _slot(hkeys, key)
    if hkeys[i] == key:
        return hvals[i]
    pair = counters[N_PAIRS]
    counters[N_PAIRS] += 1
    hkeys[i] = key
    hvals[i] = pair
    row = pairs[pair]
    row[LEFT], row[RIGHT], row[COUNT], row[FIRST], row[DIRTY] = left, right, 0, NO_POSITION, 0
    row[ENTRY_COUNT], row[ENTRY_FIRST], row[HEAD], row[LENGTH], row[TOUCHED] = -1, NO_POSITION, -1, 0, 0
    return pair


@njit(cache=True)
def _add_occurrence(pairs, nodes, counters, pair, weight, pos):
    row = pairs[pair]
    if row[COUNT] == 0:  # no live occurrence is left: drop the stale list
        row[HEAD], row[LENGTH], row[FIRST], row[DIRTY] = -1, 0, pos, 0
    elif pos < row[FIRST]:  # exact even if the cached first was stale, as the true first was >= it
        row[FIRST], row[DIRTY] = pos, 0
    row[COUNT] += weight
    node = counters[N_NODES]
    counters[N_NODES] += 1
    nodes[node, 0] = pos
    nodes[node, 1] = row[HEAD]
    row[HEAD] = node
    row[LENGTH] += 1


@njit(cache=True)
def _remove_occurrence(pairs, pair, weight, pos):
    row = pairs[pair]
    row[COUNT] -= weight
    if pos == row[FIRST]:
        row[DIRTY] = 1


@njit(cache=True)
def _live_at(tok, nxt, pos, left, right):
    if tok[pos] != left:
        return False
    after = nxt[pos]
    return after != -1 and tok[after] == right


@njit(cache=True)
def _refresh_first(pairs, nodes, tok, nxt, pair):
    """Recomputes a pair's first position exactly, unlinking its stale positions on the way."""
    row = pairs[pair]
    left, right = row[LEFT], row[RIGHT]
    first, length, kept_head, kept_tail = NO_POSITION, 0, -1, -1
    node = row[HEAD]
    while node != -1:
        following = nodes[node, 1]
        pos = nodes[node, 0]
        if _live_at(tok, nxt, pos, left, right):
            if kept_tail == -1:
                kept_head = node
            else:
                nodes[kept_tail, 1] = node
            kept_tail = node
            length += 1
            first = min(first, np.int64(pos))
        node = following
    if kept_tail != -1:
        nodes[kept_tail, 1] = -1
    row[HEAD], row[LENGTH], row[FIRST], row[DIRTY] = kept_head, length, first, 0


@njit(cache=True)
def _push_entry(pairs, heap, counters, pair):
    row = pairs[pair]
    counters[HEAP_SIZE] = _heap_push(heap, counters[HEAP_SIZE], row[COUNT], row[FIRST], pair)
    row[ENTRY_COUNT], row[ENTRY_FIRST] = row[COUNT], row[FIRST]


@njit(cache=True)
def _pop_best(pairs, nodes, heap, counters, tok, nxt):
    """The pair with the most occurrences (earliest first position among equals), or -1 if none is left."""
    while counters[HEAP_SIZE] > 0:
        count, first, pair = heap[0, 0], heap[0, 1], heap[0, 2]
        counters[HEAP_SIZE] = _heap_pop(heap, counters[HEAP_SIZE])
        row = pairs[pair]
        if count != row[ENTRY_COUNT] or first != row[ENTRY_FIRST]:
            continue  # superseded by a later entry
        if row[COUNT] <= 0:
            row[ENTRY_COUNT] = -1
            continue
        if row[DIRTY]:
            _refresh_first(pairs, nodes, tok, nxt, pair)
        if row[COUNT] == count and row[FIRST] == first:
            return pair
        _push_entry(pairs, heap, counters, pair)
    return -1


@njit(cache=True)
def _sift_down(values, root, end):
    while 2 * root + 1 < end:
        child = 2 * root + 1
        if child + 1 < end and values[child + 1] > values[child]:
            child += 1
        if values[root] >= values[child]:
            return
        values[root], values[child] = values[child], values[root]
        root = child


@njit(cache=True)
def _heapsort(values):
    """Sorts in place (np.sort would add seconds to the first compilation)."""
    n = values.size
    for root in range(n // 2 - 1, -1, -1):
        _sift_down(values, root, n)
    for end in range(n - 1, 0, -1):
        values[0], values[end] = values[end], values[0]
        _sift_down(values, 0, end)


@njit(cache=True)
def _live_positions(pairs, nodes, tok, nxt, pair):
    row = pairs[pair]
    positions = np.empty(row[LENGTH], np.int64)
    k = 0
    node = row[HEAD]
    while node != -1:
        pos = nodes[node, 0]
        if _live_at(tok, nxt, pos, row[LEFT], row[RIGHT]):
            positions[k] = pos
            k += 1
        node = nodes[node, 1]
    positions = positions[:k]
    if row[LEFT] == row[RIGHT]:  # only (x, x) can overlap; minbpe merges left to right ("aaa" -> "aa a")
        _heapsort(positions)
    return positions


@njit(cache=True)
def initial_state(tok, nxt, weight):
    """Counts every adjacent pair once; returns (pairs, nodes, hkeys, hvals, heap, counters)."""
    n = tok.size
    pair_capacity = 1024
    hkeys = np.full(2 * pair_capacity, -1, np.int64)
    hvals = np.empty(2 * pair_capacity, np.int64)
    pairs = np.empty((pair_capacity, PAIR_COLUMNS), np.int64)
    nodes = np.empty((max(n + n // 2, 16), 2), np.int64)
    counters = np.zeros(4, np.int64)
    for pos in range(n):
        after = nxt[pos]
        if after == -1:
            continue
        if counters[N_PAIRS] + 1 >= pairs.shape[0]:
            pairs = _grow_rows(pairs, 2 * pairs.shape[0])
            hkeys, hvals = _rehash(hkeys, hvals, 2 * hkeys.size)
        pair = _pair_id(pairs, hkeys, hvals, counters, tok[pos], tok[after])
        _add_occurrence(pairs, nodes, counters, pair, weight[pos], pos)
    heap = np.empty((max(counters[N_PAIRS], 16), 3), np.int64)
    for pair in range(counters[N_PAIRS]):
        _push_entry(pairs, heap, counters, pair)
    return pairs, nodes, hkeys, hvals, heap, counters


@njit(cache=True)
def _add_new_pair(pairs, nodes, hkeys, hvals, counters, touched, n_touched, left, right, weight, pos):
    """Records an occurrence made by a merge; returns the new number of touched pairs (pushed after the merge)."""
    pair = _pair_id(pairs, hkeys, hvals, counters, left, right)
    _add_occurrence(pairs, nodes, counters, pair, weight, pos)
    if pairs[pair, TOUCHED] == 0:
        pairs[pair, TOUCHED] = 1
        touched[n_touched] = pair
        n_touched += 1
    return n_touched


@njit(cache=True)
def merge_steps(tok, nxt, prv, weight, pairs, nodes, hkeys, hvals, heap, counters, merges, first_id, steps):
    """Runs up to `steps` more merges, writing them to `merges`; stops early when no pair is left.

    Returns the (possibly reallocated) growable tables; `counters[N_MERGES]` counts the merges done.
    """
    touched = np.empty(64, np.int64)
    for _ in range(steps):
        done = counters[N_MERGES]
        if done >= merges.shape[0]:
            break
        best = _pop_best(pairs, nodes, heap, counters, tok, nxt)
        if best == -1:
            break
        left, right, new = pairs[best, LEFT], pairs[best, RIGHT], first_id + done
        merges[done, 0], merges[done, 1] = left, right
        counters[N_MERGES] += 1
        positions = _live_positions(pairs, nodes, tok, nxt, best)
        if touched.size < 2 * positions.size:
            touched = np.empty(2 * positions.size, np.int64)
        n_touched = 0
        for pos in positions:
            if not _live_at(tok, nxt, pos, left, right):
                continue  # overlapped by the merge just before it
            # room for two new pairs and two new nodes (the tables only ever grow here)
            if counters[N_PAIRS] + 2 >= pairs.shape[0]:
                pairs = _grow_rows(pairs, 2 * pairs.shape[0])
            if 2 * (counters[N_PAIRS] + 2) >= hkeys.size:
                hkeys, hvals = _rehash(hkeys, hvals, 2 * hkeys.size)
            if counters[N_NODES] + 2 >= nodes.shape[0]:
                nodes = _grow_rows(nodes, 2 * nodes.shape[0])
            after = nxt[pos]
            before, beyond, w = prv[pos], nxt[after], weight[pos]
            if before != -1:
                _remove_occurrence(pairs, _pair_id(pairs, hkeys, hvals, counters, tok[before], left), w, before)
            if beyond != -1:
                _remove_occurrence(pairs, _pair_id(pairs, hkeys, hvals, counters, right, tok[beyond]), w, after)
            pairs[best, COUNT] -= w
            tok[pos], tok[after], nxt[pos] = new, -1, beyond
            if beyond != -1:
                prv[beyond] = pos
            if before != -1:
                n_touched = _add_new_pair(pairs, nodes, hkeys, hvals, counters, touched, n_touched,
                                          tok[before], new, w, before)
            if beyond != -1:
                n_touched = _add_new_pair(pairs, nodes, hkeys, hvals, counters, touched, n_touched,
                                          new, tok[beyond], w, pos)
        row = pairs[best]
        row[COUNT], row[HEAD], row[LENGTH], row[ENTRY_COUNT] = 0, -1, 0, -1
        if counters[HEAP_SIZE] + n_touched >= heap.shape[0]:
            heap = _grow_rows(heap, 2 * (counters[HEAP_SIZE] + n_touched))
        for k in range(n_touched):
            pair = touched[k]
            row = pairs[pair]
            row[TOUCHED] = 0
            if row[COUNT] > 0 and (row[ENTRY_COUNT] < 0 or
                                   _better(row[COUNT], row[FIRST], row[ENTRY_COUNT], row[ENTRY_FIRST])):
                _push_entry(pairs, heap, counters, pair)
    return pairs, nodes, hkeys, hvals, heap


@njit(cache=True)
def merge_table(merges, first_id):
    """An open-addressing hash from pair key (left << 32 | right) to the id its merge makes."""
    capacity = 16
    while capacity < 2 * merges.shape[0] + 2:
        capacity *= 2
    hkeys = np.full(capacity, -1, np.int64)
    hvals = np.empty(capacity, np.int64)
    for i in range(merges.shape[0]):
        key = (np.int64(merges[i, 0]) << 32) | np.int64(merges[i, 1])
        slot = _slot(hkeys, key)
        if hkeys[slot] == -1:  # a repeated pair keeps its first (lowest) id, the one encoding reaches
            hkeys[slot], hvals[slot] = key, first_id + i
    return hkeys, hvals


@njit(cache=True)
def _merge_chunk(ids, length, hkeys, hvals):
    """minbpe's encoding of one chunk in place: merge the lowest-ranked pair everywhere, left to right, until
    none is left. Returns the new length."""
    while length >= 2:
        best, best_key = np.int64(-1), np.int64(-1)
        for i in range(length - 1):
            key = (np.int64(ids[i]) << 32) | np.int64(ids[i + 1])
            slot = _slot(hkeys, key)
            if hkeys[slot] == key and (best == -1 or hvals[slot] < best):
                best, best_key = hvals[slot], key
        if best == -1:
            break
        out, i = 0, 0
        while i < length:
            if i + 1 < length and ((np.int64(ids[i]) << 32) | np.int64(ids[i + 1])) == best_key:
                ids[out] = best
                i += 2
            else:
                ids[out] = ids[i]
                i += 1
            out += 1
        length = out
    return length


@njit(cache=True, nogil=True)
def encode_chunks(data, offsets, byte_ids, hkeys, hvals):
    """Token ids of each chunk data[offsets[k]:offsets[k+1]]: (ids, id offsets per chunk)."""
    n_chunks = offsets.size - 1
    out = np.empty(data.size, np.int64)
    out_offsets = np.zeros(n_chunks + 1, np.int64)
    work = np.empty(0, np.int64)
    written = 0
    for k in range(n_chunks):
        start, end = offsets[k], offsets[k + 1]
        if work.size < end - start:
            work = np.empty(2 * (end - start), np.int64)
        for i in range(end - start):
            work[i] = byte_ids[data[start + i]]
        length = _merge_chunk(work, end - start, hkeys, hvals)
        for i in range(length):
            out[written + i] = work[i]
        written += length
        out_offsets[k + 1] = written
    return out[:written], out_offsets
