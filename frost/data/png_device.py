"""PNG batches decoded on the GPU: a per-image inflater and a PNG unfilter in the kernel language, and a dataset.

Why: on a GIL Python, worker threads cannot decode 60k small PNGs/s (every file read and every Pillow call
hands the GIL over). Here the CPU threads only read the files and cut out the zlib stream (the IDAT bytes);
the GPU does the rest, one thread per image:

    packed, lengths = ...            # (B, stride) uint8 zlib streams, (B,) int32 their lengths
    images, status = decode_png_batch(packed, lengths, height, width, channels)   # (B, H, W, 3) uint8

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
- `status[b]` is 0 for a good image, else one of the STATUS codes (the first error met). Images with a
  nonzero status have undefined pixels.

`DevicePNGList(paths, targets)` is the dataset for the DataLoader: with device="cuda" its workers only read
files and fill (packed streams, lengths, indices, labels) in fixed-shape buffers; the loader copies the batch
to the GPU and calls `finish_on_device`, which decodes it there without a host sync (the statuses come back
asynchronously and are checked by the loader a batch later, so a broken file raises one batch after the batch
that holds it). With any other device the loader asks
`for_device` and gets a plain ImageList (Pillow's C decoder in the worker threads): the simulator would be
far too slow to decode real batches.
"""
from __future__ import annotations

import os
import sys
import threading
from typing import Any, Callable, Sequence

import numpy as np

from frost.backend import cuda
from frost.data.folder import ImageList
from frost.data.png import parse_png, read_file
from frost.kernel import Array, bdx, bx, i32, i64, kernel, local, tx, u8

__all__ = ["STATUS", "MAX_PIXELS", "inflate_kernel", "unfilter_kernel", "decode_png_batch", "png_stream",
           "deflate_bound", "raw_size", "DevicePNGList"]

# status codes (first error wins)
OK = 0
BAD_HEADER = 1          # zlib header: not deflate, window > 32K, bad check bits, or a preset dictionary
BAD_BLOCK_TYPE = 2      # block type 3
BAD_CODE = 3            # bad Huffman code or table: over-subscribed/incomplete, bad counts, invalid symbol
DISTANCE_TOO_FAR = 4    # a match reaches back before the start of the output
OUTPUT_OVERFLOW = 5     # more output than H * (1 + W * channels)
INPUT_EXHAUSTED = 6     # the stream ends before the last block (or before its Adler-32)
WRONG_LENGTH = 7        # the last block ends with less output than expected
BAD_STORED_LENGTH = 8   # a stored block's LEN and NLEN are not complements
BAD_CHECKSUM = 9        # Adler-32 of the output differs from the stream's
BAD_FILTER = 10         # a scanline's filter byte is not 0..4
STATUS = {OK: "ok", BAD_HEADER: "bad zlib header", BAD_BLOCK_TYPE: "bad deflate block type",
          BAD_CODE: "bad Huffman code or code table", DISTANCE_TOO_FAR: "distance too far back",
          OUTPUT_OVERFLOW: "more image data than the image holds", INPUT_EXHAUSTED: "zlib stream truncated",
          WRONG_LENGTH: "less image data than the image needs", BAD_STORED_LENGTH: "stored block length check failed",
          BAD_CHECKSUM: "Adler-32 checksum mismatch", BAD_FILTER: "bad PNG filter type"}

# The largest image (height x width) the GPU decoder takes: Pillow's MAX_IMAGE_PIXELS. A 60-byte PNG may claim
# 30000 x 30000 pixels; its batch buffers (a zlib stream's bound and the decoded image, per sample) would take
# gigabytes before any byte of it was inflated.
MAX_PIXELS = 89_478_485

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
    if left < 0 or (left > 0 and nlen - lencnt[0] != 1):
        fail(st, BAD_CODE)  # an incomplete code is allowed only for a single length
        return
    left = construct(distcnt, distsym, lens, nlen, ndist, offs)
    if left < 0 or (left > 0 and ndist - distcnt[0] != 1):
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


# ---------------------------------------------------------------- launching
def raw_size(height: int, width: int, channels: int) -> int:
    """Bytes of filtered scanlines of an 8-bit image: H * (1 + W * channels)."""
    return height * (1 + width * channels)


def deflate_bound(raw: int) -> int:
    """The longest zlib stream a reasonable encoder writes for `raw` bytes: stored blocks (5 bytes per 65535),
    the 2-byte header and 4-byte Adler-32, plus a margin (zlib's compressBound is smaller), rounded up to 16."""
    stored_blocks = max(1, -(-raw // 65535))
    bound = raw + 5 * stored_blocks + 2 + 4 + 64 + raw // 256
    return -(-bound // 16) * 16


def _inflate_block(n: int) -> int:
    """Threads per block for n images: spread small batches over many SMs (a thread decodes a whole image, so
    a warp of divergent images runs no faster than its slowest), full warps once there are images enough."""
    return int(min(32, max(1, n // 256)))


def decode_png_batch(packed: Any, lengths: Any, height: int, width: int, channels: int) -> tuple[Any, Any]:
    """Decode a batch of PNG zlib streams: (images (B, H, W, 3) uint8, status (B,) int32), on the arrays' side.

    CuPy arrays: both kernels run on the current stream (no host sync). NumPy arrays: the simulator (slow,
    for tests of small images)."""
    if channels not in (1, 3, 4):
        raise ValueError(f"decode_png_batch: {channels} channels; 1 (grey), 3 (RGB) or 4 (RGBA) are supported")
    if packed.ndim != 2 or packed.dtype != np.uint8:
        raise ValueError(f"decode_png_batch: packed must be a (B, stride) uint8 array, got {packed.shape} "
                         f"{packed.dtype}")
    n = packed.shape[0]
    if lengths.shape != (n,):
        raise ValueError(f"decode_png_batch: lengths of shape {lengths.shape} for {n} streams")
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


# ---------------------------------------------------------------- host side
_CHANNELS = {0: 1, 2: 3, 6: 4}


def png_stream(data: bytes, name: str) -> tuple[bytes, tuple[int, int, int]]:
    """A PNG file's zlib stream (its IDAT data joined) and (height, width, channels), for the GPU decoder.

    Takes the same files as frost.data.png's fast CPU path: 8-bit, not interlaced, grey (0), RGB (2) or
    RGBA (6), not animated. Anything else raises ValueError naming `name` (decode it on the CPU instead)."""
    try:
        (width, height, depth, colour, interlace), idat, plain = parse_png(data)
    except ValueError as e:
        raise ValueError(f"png_stream: cannot decode {name}: {e}") from e
    if depth != 8 or interlace != 0 or colour not in _CHANNELS or not plain:
        what = (f"bit depth {depth}" if depth != 8 else "interlaced" if interlace else
                f"colour type {colour}" if colour not in _CHANNELS else "animated")
        raise ValueError(f"png_stream: {name} is a {what} PNG, which the GPU decoder does not take (it takes 8-bit, "
                         f"non-interlaced grey, RGB or RGBA); use decode='cpu' (frost.data.ImageList)")
    if height * width > MAX_PIXELS:
        raise ValueError(f"png_stream: {name} claims {width}x{height} pixels, more than the GPU decoder's limit of "
                         f"{MAX_PIXELS} (frost.data.png_device.MAX_PIXELS; a decompression bomb?)")
    return (bytes(idat[0]) if len(idat) == 1 else b"".join(idat)), (height, width, _CHANNELS[colour])


# Under the GIL every file read releases and re-takes it three times (open, read, close), and threads that read
# at the same time mostly hand the GIL to each other: on the 16-core H200 host plain reads fell from 262k files/s
# in one thread to 68k in 16, and this loader delivered 68.6k images/s with 1 worker but 29.6k with 16. So the
# reads of a batch pass a gate, READERS threads at a time (the other workers sleep on it, costing nothing, and
# pack their batches outside it); on a free-threaded build every worker reads at once.
READERS = 1 if getattr(sys, "_is_gil_enabled", lambda: True)() else (os.cpu_count() or 8)
_read_gate = threading.BoundedSemaphore(READERS)


class DevicePNGList(ImageList):
    """PNG files with integer labels, decoded on the GPU by a DataLoader with device="cuda".

    A separate class rather than a flag on ImageList: its get_batch returns a different record (zlib streams,
    their lengths, the sample indices and the labels; fixed shapes, so the loader's ping-pong buffers work),
    the loader turns that into (images (B, H, W, 3) uint8 on the GPU, labels) with `finish_on_device`, and CPU
    transforms have no place in it. All files must share one (height, width, channels). Items read one at a
    time (`ds[i]`, or a DataLoader on the CPU: see `for_device`) decode on the CPU as ImageList does."""

    def __init__(self, paths: Sequence[str | os.PathLike], targets: Sequence[int]) -> None:
        super().__init__(paths, targets)
        self.shape: tuple[int, int, int] | None = None  # (height, width, channels), from the first file read
        self.stride: int | None = None

    def for_device(self, device) -> ImageList:
        """The dataset a DataLoader on `device` reads: itself on a GPU, else an ImageList of the same files."""
        return self if getattr(device, "type", str(device).split(":")[0]) == "cuda" else ImageList(self.paths,
                                                                                                   self.targets)

    def _set_shape(self, shape: tuple[int, int, int], name: str) -> None:
        if self.shape is None:  # shape last: a worker thread that sees it set finds the stride set too
            self.stride, self.first = deflate_bound(raw_size(*shape)), name
            self.shape = shape
        elif shape != self.shape:
            raise ValueError(f"DevicePNGList: {name} is {shape[0]}x{shape[1]} with {shape[2]} channel(s) but "
                             f"{self.first} is {self.shape[0]}x{self.shape[1]} with {self.shape[2]}; the GPU decoder "
                             f"needs one size (use decode='cpu': frost.data.ImageList with a resizing transform)")

    def get_batch(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(packed zlib streams (B, stride) uint8, their lengths (B,) int32, indices (B,) int64, labels)."""
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) == 0:
            raise ValueError("DevicePNGList.get_batch: no indices")
        paths = self.paths
        with _read_gate:
            files = [(paths[i], _read(paths[i])) for i in indices.tolist()]
        streams = []
        for name, data in files:
            stream, shape = png_stream(data, name)
            if shape != self.shape:
                self._set_shape(shape, name)
            if len(stream) > self.stride:
                raise ValueError(f"DevicePNGList: {name} has a zlib stream of {len(stream)} bytes, more than the "
                                 f"{self.stride} bytes any reasonable encoder needs for its size; use decode='cpu'")
            streams.append(stream)
        packed = np.zeros((len(indices), self.stride), np.uint8)
        lengths = np.empty(len(indices), np.int32)
        for k, stream in enumerate(streams):
            lengths[k] = len(stream)
            packed[k, :len(stream)] = np.frombuffer(stream, np.uint8)
        return packed, lengths, indices, self.targets[indices]

    def finish_on_device(self, fields: list, defer: Callable[[Callable[[], None]], None] | None = None) -> list:
        """Called by the DataLoader on each batch's device arrays: decode on the GPU -> [images, labels].

        The kernels run on the current stream. A broken file raises RuntimeError naming it. Without `defer` the
        (B,) statuses are read at once (a host sync on that stream). With `defer` (the threaded DataLoader passes
        it) nothing waits: the statuses are copied to pinned host memory asynchronously on the current stream and
        `defer(check)` hands the loader the check, which it runs once the stream has passed that copy, at the
        latest when the caller asks for the next batch: the error then surfaces one batch after the batch
        holding the broken file (or at the end of the epoch)."""
        packed, lengths, indices, labels = fields
        height, width, channels = self.shape_for(packed)
        images, status = decode_png_batch(packed, lengths, height, width, channels)
        if defer is None:
            self._check_status(status.get() if hasattr(status, "get") else status, indices)
        else:
            host = _to_host_async(status)
            defer(lambda: self._check_status(host, indices))
        return [images, labels]

    def _check_status(self, host: np.ndarray, indices) -> None:
        """Raise for the first image of a batch whose status (on the host) is not OK, naming its file."""
        if host.any():
            k = int(np.flatnonzero(host)[0])
            index = int(indices[k].get() if hasattr(indices, "get") else indices[k])  # only on failure: a sync
            raise RuntimeError(f"DevicePNGList: cannot decode {self.paths[index]} on the GPU: "
                               f"{STATUS.get(int(host[k]), f'status {int(host[k])}')} (status {int(host[k])})")

    def shape_for(self, packed) -> tuple[int, int, int]:
        if self.shape is None:
            raise RuntimeError("DevicePNGList: finish_on_device before any get_batch (the image size is unknown)")
        return self.shape


def _to_host_async(status) -> np.ndarray:
    """A host copy of a status array, queued on the current stream (CuPy: pinned memory, valid once the stream has
    passed the copy); a NumPy array is its own host copy."""
    if not hasattr(status, "get"):
        return status
    import cupyx
    host = cupyx.empty_pinned(status.shape, status.dtype)
    status.get(out=host, blocking=False)
    return host


def _read(name: str) -> bytes:
    try:
        return read_file(name)
    except OSError as e:
        raise RuntimeError(f"DevicePNGList: cannot read {name}: {type(e).__name__}: {e}") from e
