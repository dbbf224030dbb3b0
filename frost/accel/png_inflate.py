"""The GPU PNG decoder's kernels: a per-image inflater and a PNG unfilter in the kernel language, registered with
frost.dispatch as `decode_png` for CuPy arrays (frost.data.png_device.decode_png_batch asks; its host reference
decodes NumPy arrays, and every array without this layer).

Why: on a GIL Python, worker threads cannot decode 60k small PNGs/s (every file read and every Pillow call
hands the GIL over). DevicePNGList's threads only read the files and cut out the zlib stream (the IDAT bytes);
the GPU does the rest, one thread per image:

- `inflate_kernel` (one thread per image) is a compact canonical-Huffman inflater in the style of Mark
  Adler's puff.c (zlib's contrib/puff): stored, fixed and dynamic blocks; each block's code tables (counts
  per code length and symbols in canonical order) are built in the thread's local arrays and a symbol is
  decoded one bit at a time by code length. The length and distance base / extra-bit tables are closed-form
  functions of the symbol (`length_base`, ... below; the tests check them against RFC 1951's tables): the
  kernel language has no global constant arrays, and a formula costs a few integer operations and no memory.
  The zlib header and the Adler-32 checksum of the output are checked (a pass over output the thread just
  wrote: cheap next to inflating it).
- `unfilter_kernel` undoes PNG's per-row filters (None, Sub, Up, Average, Paeth; bpp = channels for 8-bit
  images) with one thread per (image, output channel): a byte depends only on bytes of its own channel
  (left, up, up-left), so the channels of an image are independent lanes, each walking the rows in order.
  Grey images give three equal channels; RGBA drops alpha (no thread is spent on it).
- `status[b]` is 0 for a good image, else one of frost.data.png_device's STATUS codes (the first error met).
  Images with a nonzero status have undefined pixels.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from frost import dispatch
from frost.backend import cuda
from frost.data.png_device import (BAD_BLOCK_TYPE, BAD_CHECKSUM, BAD_CODE, BAD_FILTER, BAD_HEADER, BAD_STORED_LENGTH,
                                   DISTANCE_TOO_FAR, INPUT_EXHAUSTED, OUTPUT_OVERFLOW, WRONG_LENGTH, raw_size)
from frost.kernel import Array, bdx, bx, i32, i64, kernel, local, tx, u8

__all__ = ["inflate_kernel", "unfilter_kernel", "decode_batch"]


# indices into the per-thread state array
POS = 0      # next input byte
BUF = 1      # bit buffer (bits not yet used, low bit first)
CNT = 2      # bits in BUF
ERR = 3      # status
OUT = 4      # output bytes written


# ---------------------------------------------------------------- inflate, one thread per image
@kernel.device
def fail(st, code: i32):
    if st[ERR] == 0:
        st[ERR] = code


@kernel.device
def getbits(src, b: i32, inlen: i32, st, need: i32) -> i32:
    """`need` bits of the stream (LSB first); past the end: 0 and INPUT_EXHAUSTED."""
    buf = st[BUF]
    cnt = st[CNT]
    while cnt < need:
        if st[POS] >= inlen:
            fail(st, INPUT_EXHAUSTED)
            st[BUF] = 0
            st[CNT] = 0
            return 0
        buf = buf | (i32(src[b, st[POS]]) << cnt)
        st[POS] += 1
        cnt += 8
    st[BUF] = buf >> need
    st[CNT] = cnt - need
    return buf & ((1 << need) - 1)


@kernel.device
def decode(src, b: i32, inlen: i32, st, counts, symbols) -> i32:
    """One symbol of a canonical code (puff's decode: a bit at a time, codes of each length in order)."""
    code = 0
    first = 0
    index = 0
    for length in range(1, 16):
        code = code | getbits(src, b, inlen, st, 1)
        count = counts[length]
        if code - count < first:
            return symbols[index + (code - first)]
        index += count
        first += count
        first = first << 1
        code = code << 1
    fail(st, BAD_CODE)
    return -1


@kernel.device
def construct(counts, symbols, lengths, start: i32, n: i32, offs) -> i32:
    """Canonical code tables from code lengths lengths[start:start+n]: 0 complete, > 0 incomplete, < 0 over."""
    for length in range(16):
        counts[length] = 0
    for s in range(n):
        counts[lengths[start + s]] += 1
    if counts[0] == n:
        return 0
    left = 1
    for length in range(1, 16):
        left = left << 1
        left -= counts[length]
        if left < 0:
            return left
    offs[1] = 0
    for length in range(1, 15):
        offs[length + 1] = offs[length] + counts[length]
    for s in range(n):
        ln = i32(lengths[start + s])
        if ln != 0:
            symbols[offs[ln]] = s
            offs[ln] += 1
    return left


@kernel.device
def length_base(s: i32) -> i32:
    """Base match length of length symbol 257 + s (RFC 1951 3.2.5)."""
    if s < 8:
        return s + 3
    if s == 28:
        return 258
    return ((4 + (s & 3)) << ((s - 4) >> 2)) + 3


@kernel.device
def length_extra(s: i32) -> i32:
    if s < 8 or s == 28:
        return 0
    return (s - 4) >> 2


@kernel.device
def dist_base(s: i32) -> i32:
    if s < 4:
        return s + 1
    return ((2 + (s & 1)) << ((s - 2) >> 1)) + 1


@kernel.device
def dist_extra(s: i32) -> i32:
    if s < 4:
        return 0
    return (s - 2) >> 1


@kernel.device
def code_length_order(i: i32) -> i32:
    """The order code-length code lengths are sent in: 16 17 18 0 8 7 9 6 10 5 11 4 12 3 13 2 14 1 15."""
    if i < 3:
        return 16 + i
    if i == 3:
        return 0
    if (i & 1) == 0:
        return 8 + ((i - 4) >> 1)
    return 7 - ((i - 5) >> 1)


@kernel.device
def stored(src, b: i32, inlen: i32, st, out, outlen: i32):
    st[BUF] = 0  # a stored block starts at the next byte boundary
    st[CNT] = 0
    pos = st[POS]
    if pos + 4 > inlen:
        fail(st, INPUT_EXHAUSTED)
        return
    n = i32(src[b, pos]) | (i32(src[b, pos + 1]) << 8)
    check = i32(src[b, pos + 2]) | (i32(src[b, pos + 3]) << 8)
    if n + check != 65535:
        fail(st, BAD_STORED_LENGTH)
        return
    pos += 4
    if pos + n > inlen:
        fail(st, INPUT_EXHAUSTED)
        return
    o = st[OUT]
    if o + n > outlen:
        fail(st, OUTPUT_OVERFLOW)
        return
    for k in range(n):
        out[b, o + k] = src[b, pos + k]
    st[POS] = pos + n
    st[OUT] = o + n


@kernel.device
def codes(src, b: i32, inlen: i32, st, out, outlen: i32, lencnt, lensym, distcnt, distsym):
    """Literals and matches of one block until its end-of-block symbol."""
    while st[ERR] == 0:
        sym = decode(src, b, inlen, st, lencnt, lensym)
        if sym < 0:
            break
        if sym < 256:
            o = st[OUT]
            if o >= outlen:
                fail(st, OUTPUT_OVERFLOW)
                break
            out[b, o] = u8(sym)
            st[OUT] = o + 1
        elif sym == 256:
            break
        else:
            sym -= 257
            if sym >= 29:
                fail(st, BAD_CODE)
                break
            length = length_base(sym) + getbits(src, b, inlen, st, length_extra(sym))
            dsym = decode(src, b, inlen, st, distcnt, distsym)
            if dsym < 0:
                break
            if dsym >= 30:
                fail(st, BAD_CODE)
                break
            dist = dist_base(dsym) + getbits(src, b, inlen, st, dist_extra(dsym))
            o = st[OUT]
            if st[ERR] != 0:
                break
            if dist > o:
                fail(st, DISTANCE_TOO_FAR)
                break
            if o + length > outlen:
                fail(st, OUTPUT_OVERFLOW)
                break
            for k in range(length):
                out[b, o + k] = out[b, o + k - dist]
            st[OUT] = o + length


@kernel.device
def fixed_tables(lens, lencnt, lensym, distcnt, distsym, offs):
    for s in range(288):
        ln = 8
        if s >= 144 and s < 256:
            ln = 9
        elif s >= 256 and s < 280:
            ln = 7
        lens[s] = u8(ln)
    construct(lencnt, lensym, lens, 0, 288, offs)
    for s in range(30):
        lens[s] = u8(5)
    construct(distcnt, distsym, lens, 0, 30, offs)


@kernel.device
def dynamic_tables(src, b: i32, inlen: i32, st, lens, lencnt, lensym, distcnt, distsym, offs):
    """Read a dynamic block's code lengths and build its tables (puff's dynamic() checks, as BAD_CODE)."""
    nlen = getbits(src, b, inlen, st, 5) + 257
    ndist = getbits(src, b, inlen, st, 5) + 1
    ncode = getbits(src, b, inlen, st, 4) + 4
    if nlen > 286 or ndist > 30:
        fail(st, BAD_CODE)
        return
    for k in range(19):
        lens[k] = u8(0)
    for k in range(ncode):
        lens[code_length_order(k)] = u8(getbits(src, b, inlen, st, 3))
    if construct(lencnt, lensym, lens, 0, 19, offs) != 0:
        fail(st, BAD_CODE)  # the code-length code must be complete
        return
    total = nlen + ndist
    index = 0
    while index < total and st[ERR] == 0:
        sym = decode(src, b, inlen, st, lencnt, lensym)
        if sym < 0:
            break
        if sym < 16:
            lens[index] = u8(sym)
            index += 1
        else:
            ln = 0
            rep = 0
            if sym == 16:
                if index == 0:
                    fail(st, BAD_CODE)  # repeat with no previous length
                    break
                ln = i32(lens[index - 1])
                rep = 3 + getbits(src, b, inlen, st, 2)
            elif sym == 17:
                rep = 3 + getbits(src, b, inlen, st, 3)
            else:
                rep = 11 + getbits(src, b, inlen, st, 7)
            if index + rep > total:
                fail(st, BAD_CODE)  # too many lengths
                break
            for k in range(rep):
                lens[index + k] = u8(ln)
            index += rep
    if st[ERR] != 0:
        return
    if lens[256] == 0:
        fail(st, BAD_CODE)  # no end-of-block code
        return
    left = construct(lencnt, lensym, lens, 0, nlen, offs)
    if left < 0 or (left > 0 and nlen != lencnt[0] + lencnt[1]):
        fail(st, BAD_CODE)  # an incomplete code is allowed only as one code of one bit (puff, zlib)
        return
    left = construct(distcnt, distsym, lens, nlen, ndist, offs)
    if left < 0 or (left > 0 and ndist != distcnt[0] + distcnt[1]):
        fail(st, BAD_CODE)


@kernel.device
def adler_check(src, b: i32, inlen: i32, st, out, outlen: i32):
    """Compare the Adler-32 after the last block (at the next byte boundary) with the output's."""
    pos = st[POS]
    if pos + 4 > inlen:
        fail(st, INPUT_EXHAUSTED)
        return
    a: i64 = 1
    s2: i64 = 0
    for k in range(outlen):
        a += i64(out[b, k])
        s2 += a
        if (k & 4095) == 4095:  # s2 < 2^63 long before this; reduce to keep it small
            a = a % 65521
            s2 = s2 % 65521
    a = a % 65521
    s2 = s2 % 65521
    want = ((i64(src[b, pos]) << 24) | (i64(src[b, pos + 1]) << 16) | (i64(src[b, pos + 2]) << 8)
            | i64(src[b, pos + 3]))
    if want != ((s2 << 16) | a):
        fail(st, BAD_CHECKSUM)


@kernel
def inflate_kernel(src: Array[u8, 2], lengths: Array[i32], out: Array[u8, 2], status: Array[i32], n: i32):
    b = bx * bdx + tx
    if b >= n:
        return
    inlen = min(lengths[b], src.shape[1])
    outlen = out.shape[1]
    st = local(i32, 5)
    lencnt = local(i32, 16)
    lensym = local(i32, 288)
    distcnt = local(i32, 16)
    distsym = local(i32, 30)
    offs = local(i32, 16)
    lens = local(u8, 320)
    st[POS] = 2
    st[BUF] = 0
    st[CNT] = 0
    st[ERR] = 0
    st[OUT] = 0
    if inlen < 2:
        fail(st, INPUT_EXHAUSTED)
    else:
        cmf = i32(src[b, 0])
        flg = i32(src[b, 1])
        if (cmf & 15) != 8 or (cmf >> 4) > 7 or (cmf * 256 + flg) % 31 != 0 or (flg & 32) != 0:
            fail(st, BAD_HEADER)
    last = 0
    while last == 0 and st[ERR] == 0:
        last = getbits(src, b, inlen, st, 1)
        kind = getbits(src, b, inlen, st, 2)
        if st[ERR] != 0:
            break
        if kind == 0:
            stored(src, b, inlen, st, out, outlen)
        elif kind == 1:
            fixed_tables(lens, lencnt, lensym, distcnt, distsym, offs)
            codes(src, b, inlen, st, out, outlen, lencnt, lensym, distcnt, distsym)
        elif kind == 2:
            dynamic_tables(src, b, inlen, st, lens, lencnt, lensym, distcnt, distsym, offs)
            if st[ERR] == 0:
                codes(src, b, inlen, st, out, outlen, lencnt, lensym, distcnt, distsym)
        else:
            fail(st, BAD_BLOCK_TYPE)
    if st[ERR] == 0 and st[OUT] != outlen:
        fail(st, WRONG_LENGTH)
    if st[ERR] == 0:
        adler_check(src, b, inlen, st, out, outlen)
    status[b] = st[ERR]


# ---------------------------------------------------------------- unfilter, one thread per (image, channel)
@kernel
def unfilter_kernel(raw: Array[u8, 2], out: Array[u8, 2], status: Array[i32], n: i32, height: i32, width: i32,
                    channels: i32, lanes: i32):
    i = bx * bdx + tx
    b = i // lanes
    c = i % lanes
    if b >= n:
        return
    if status[b] != 0:
        return
    rowlen = 1 + width * channels
    above = width * 3
    for y in range(height):
        r = y * rowlen
        f = i32(raw[b, r])
        if f > 4:
            status[b] = BAD_FILTER
            return
        left = 0
        upleft = 0
        for x in range(width):
            v = i32(raw[b, r + 1 + x * channels + c])
            o = (y * width + x) * 3 + c
            up = 0
            if y > 0:
                up = i32(out[b, o - above])
            if f == 1:
                v += left
            elif f == 2:
                v += up
            elif f == 3:
                v += (left + up) >> 1
            elif f == 4:
                p = left + up - upleft
                pa = abs(p - left)
                pb = abs(p - up)
                pc = abs(p - upleft)
                if pa <= pb and pa <= pc:
                    v += left
                elif pb <= pc:
                    v += up
                else:
                    v += upleft
            v = v & 255
            out[b, o] = u8(v)
            if channels == 1:
                out[b, o + 1] = u8(v)
                out[b, o + 2] = u8(v)
            left = v
            upleft = up


def _inflate_block(n: int) -> int:
    """Threads per block for n images: spread small batches over many SMs (a thread decodes a whole image, so
    a warp of divergent images runs no faster than its slowest), full warps once there are images enough."""
    return int(min(32, max(1, n // 256)))


@dispatch.register("decode_png", device="cuda", dtypes=("uint8",))
def decode_batch(packed: Any, lengths: Any, height: int, width: int, channels: int) -> tuple[Any, Any]:
    """Decode a batch of PNG zlib streams: (images (B, H, W, 3) uint8, status (B,) int32), on the arrays' side.

    CuPy arrays: both kernels run on the current stream (no host sync). NumPy arrays: the simulator (slow,
    for tests of small images). The arguments are checked by frost.data.png_device.decode_png_batch."""
    n = packed.shape[0]
    on_gpu = not isinstance(packed, np.ndarray)
    xp = np
    if on_gpu:
        xp = cuda.cupy()
    lengths = xp.asarray(lengths, dtype=xp.int32)
    raw = xp.zeros((n, raw_size(height, width, channels)), dtype=xp.uint8)
    status = xp.zeros(n, dtype=xp.int32)
    images = xp.zeros((n, height, width, 3), dtype=xp.uint8)
    if n == 0:
        return images, status
    lanes = min(channels, 3)
    per = _inflate_block(n)
    inflate = inflate_kernel if on_gpu else inflate_kernel.simulate
    unfilter = unfilter_kernel if on_gpu else unfilter_kernel.simulate
    inflate[-(-n // per), per](packed, lengths, raw, status, n)
    threads = n * lanes
    block = 128 if on_gpu else min(threads, 32)
    unfilter[-(-threads // block), block](raw, images.reshape(n, -1), status, n, height, width, channels, lanes)
    return images, status
