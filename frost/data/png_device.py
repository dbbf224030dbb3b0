"""PNG batches decoded on the GPU: the dataset, the status codes and the host's reference decode.

Why: on a GIL Python, worker threads cannot decode 60k small PNGs/s (every file read and every Pillow call
hands the GIL over). Here the CPU threads only read the files and cut out the zlib stream (the IDAT bytes);
the GPU does the rest (frost/accel/png_inflate.py: one thread per image inflates, then unfilters):

    packed, lengths = ...            # (B, stride) uint8 zlib streams, (B,) int32 their lengths
    images, status = decode_png_batch(packed, lengths, height, width, channels)   # (B, H, W, 3) uint8

`status[b]` is 0 for a good image, else one of the STATUS codes (the first error met); images with a nonzero
status have undefined pixels. decode_png_batch asks frost.dispatch for the acceleration layer's kernels
(`decode_png`, CuPy arrays); NumPy arrays, and every array when the layer is absent, take `decode_on_host`: zlib
and Pillow, with the same status codes.

`DevicePNGList(paths, targets)` is the dataset for the DataLoader: with device="cuda" its workers only read
files and fill (packed streams, lengths, indices, labels) in fixed-shape buffers; the loader copies the batch
to the GPU and calls `finish_on_device`, which decodes it there without a host sync (the statuses come back
asynchronously and are checked by the loader a batch later, so a broken file raises one batch after the batch
that holds it). With any other device the loader asks `for_device` and gets a plain ImageList (Pillow's C
decoder in the worker threads).
"""
from __future__ import annotations

import os
import struct
import sys
import threading
import zlib
from typing import Any, Callable, Sequence

import numpy as np

from frost import dispatch
from frost.backend import cuda
from frost.data.folder import ImageList
from frost.data.png import PNG_SIGNATURE, decode_bytes, parse_png, read_file

__all__ = ["STATUS", "MAX_PIXELS", "MAX_BATCH_BYTES", "decode_png_batch", "decode_on_host", "stream_status",
           "png_stream", "deflate_bound", "raw_size", "DevicePNGList"]

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
# The most bytes of zlib streams one batch may ask for (its packed buffer; the decoded images on the GPU take as much
# again): a 69-byte PNG claiming 9459 x 9459 RGBA is under MAX_PIXELS but would need 92 GB for a batch of 256.
MAX_BATCH_BYTES = 2 << 30

# ---------------------------------------------------------------- sizes and the decode
def raw_size(height: int, width: int, channels: int) -> int:
    """Bytes of filtered scanlines of an 8-bit image: H * (1 + W * channels)."""
    return height * (1 + width * channels)


def deflate_bound(raw: int) -> int:
    """The longest zlib stream a reasonable encoder writes for `raw` bytes: stored blocks (5 bytes per 65535),
    the 2-byte header and 4-byte Adler-32, plus a margin (zlib's compressBound is smaller), rounded up to 16."""
    stored_blocks = max(1, -(-raw // 65535))
    bound = raw + 5 * stored_blocks + 2 + 4 + 64 + raw // 256
    return -(-bound // 16) * 16



def decode_png_batch(packed: Any, lengths: Any, height: int, width: int, channels: int) -> tuple[Any, Any]:
    """Decode a batch of PNG zlib streams: (images (B, H, W, 3) uint8, status (B,) int32), on the arrays' side.

    CuPy arrays: the acceleration layer's kernels on the current stream (no host sync). Otherwise (NumPy arrays,
    or Frost without the layer) decode_on_host."""
    if channels not in (1, 3, 4):
        raise ValueError(f"decode_png_batch: {channels} channels; 1 (grey), 3 (RGB) or 4 (RGBA) are supported")
    if packed.ndim != 2 or packed.dtype != np.uint8:
        raise ValueError(f"decode_png_batch: packed must be a (B, stride) uint8 array, got {packed.shape} "
                         f"{packed.dtype}")
    n = packed.shape[0]
    if lengths.shape != (n,):
        raise ValueError(f"decode_png_batch: lengths of shape {lengths.shape} for {n} streams")
    fast = dispatch.lookup("decode_png", packed)
    if fast is not None:
        return fast(packed, lengths, height, width, channels)
    if isinstance(packed, np.ndarray):
        return decode_on_host(packed, np.asarray(lengths), height, width, channels)
    images, status = decode_on_host(cuda.to_host(packed), np.asarray(cuda.to_host(lengths)), height, width, channels)
    return cuda.cupy().asarray(images), cuda.cupy().asarray(status)


# zlib's messages and the status codes the GPU inflater gives for the same faults
_ZLIB_ERRORS = (("invalid block type", BAD_BLOCK_TYPE), ("invalid stored block lengths", BAD_STORED_LENGTH),
                ("too far back", DISTANCE_TOO_FAR))
_COLOUR_OF = {1: 0, 3: 2, 4: 6}   # channels -> PNG colour type


def decode_on_host(packed: np.ndarray, lengths: np.ndarray, height: int, width: int,
                   channels: int) -> tuple[np.ndarray, np.ndarray]:
    """decode_png_batch's reference: zlib checks each stream (its output bounded by the image's size) and gives
    the GPU inflater's status codes, then Pillow decodes the good ones."""
    n, raw = len(packed), raw_size(height, width, channels)
    images, status = np.zeros((n, height, width, 3), np.uint8), np.zeros(n, np.int32)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, _COLOUR_OF[channels], 0, 0, 0)
    for b in range(n):
        stream = packed[b, :max(0, int(lengths[b]))].tobytes()
        status[b] = stream_status(stream, raw, 1 + width * channels)
        if status[b] == OK:
            images[b] = decode_bytes(png_file(ihdr, stream))
    return images, status


def stream_status(stream: bytes, raw: int, row: int) -> int:
    """The status the GPU inflater and unfilter give a zlib stream of `raw` bytes of scanlines `row` bytes long: in
    their order (the output's length before its Adler-32), so the deflate data is inflated raw and checked here."""
    if len(stream) < 2:
        return INPUT_EXHAUSTED
    if stream[0] & 0x0F != 8 or stream[0] >> 4 > 7 or (stream[0] << 8 | stream[1]) % 31 or stream[1] & 0x20:
        return BAD_HEADER
    inflater = zlib.decompressobj(-15)
    try:
        out = inflater.decompress(stream[2:], raw + 1)
    except zlib.error as e:
        return next((code for text, code in _ZLIB_ERRORS if text in str(e)), BAD_CODE)
    if len(out) > raw:
        return OUTPUT_OVERFLOW
    if not inflater.eof:
        return INPUT_EXHAUSTED
    if len(out) < raw:
        return WRONG_LENGTH
    if len(inflater.unused_data) < 4:
        return INPUT_EXHAUSTED
    if inflater.unused_data[:4] != struct.pack(">I", zlib.adler32(out)):
        return BAD_CHECKSUM
    return BAD_FILTER if max(out[::row]) > 4 else OK


def png_file(ihdr: bytes, stream: bytes) -> bytes:
    """A PNG file of one IHDR (its 13 bytes of data) and one IDAT."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return PNG_SIGNATURE + chunk(b"IHDR", ihdr) + chunk(b"IDAT", stream) + chunk(b"IEND", b"")


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
        if len(indices) * self.stride > MAX_BATCH_BYTES:
            raise ValueError(f"DevicePNGList: a batch of {len(indices)} images of {self.shape[1]}x{self.shape[0]} "
                             f"({self.first} sets the size) needs {len(indices) * self.stride} bytes of stream "
                             f"buffer, more than frost.data.png_device.MAX_BATCH_BYTES ({MAX_BATCH_BYTES}); use a "
                             f"smaller batch")
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
