"""PNG images, files and zlib streams for the tests of the GPU PNG decoder (tests/accel/test_png_inflate_kernels.py)
and of its dataset (tests/data/test_png_device.py); the kernels' NumPy / zlib twins."""
import io
import struct
import zlib

import numpy as np
from PIL import Image

from frost.data import png_device as pd

LEVELS = (0, 1, 6, 9)


# ---------------------------------------------------------------- images and streams
def random_image(rng, h, w, c):
    return rng.integers(0, 256, (h, w, c), dtype=np.uint8)


def smooth_image(h, w, c):
    """Gradients and waves: Pillow's adaptive filtering picks Sub, Up, Average and Paeth rows."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    channels = [(x * 3 + y * 2) % 256, 128 + 100 * np.sin(x / 5.0) * np.cos(y / 7.0), (x * y) % 256,
                255 - (x + y) % 256]
    return np.stack(channels[:c], axis=-1).astype(np.uint8)


def averaged_image(rng, h, w, c):
    """Each pixel the mean of its left and upper neighbours: Average rows."""
    img = random_image(rng, h, w, c).astype(np.int64)
    for y in range(1, h):
        for x in range(1, w):
            img[y, x] = (img[y, x - 1] + img[y - 1, x]) // 2
    return img.astype(np.uint8)


def png_bytes(img: np.ndarray, level: int = 6) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img[..., 0] if img.shape[2] == 1 else img).save(buf, format="PNG", compress_level=level)
    return buf.getvalue()


def as_rgb(img: np.ndarray) -> np.ndarray:
    return np.repeat(img, 3, axis=2) if img.shape[2] == 1 else img[..., :3]


def pack(streams, stride=None):
    stride = stride or max(len(s) for s in streams)
    packed = np.zeros((len(streams), stride), np.uint8)
    for k, s in enumerate(streams):
        packed[k, :len(s)] = np.frombuffer(s, np.uint8)
    return packed, np.array([len(s) for s in streams], np.int32)


def chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def png_from_stream(h: int, w: int, colour: int, stream: bytes, pieces: int = 1) -> bytes:
    cut = [len(stream) * k // pieces for k in range(pieces + 1)]
    idats = b"".join(chunk(b"IDAT", stream[a:b]) for a, b in zip(cut, cut[1:]))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, colour, 0, 0, 0)) + idats
            + chunk(b"IEND", b""))


def block_type(stream: bytes) -> int:
    return (stream[2] >> 1) & 3


def filters_of(stream: bytes, h: int, w: int, c: int) -> set:
    raw = zlib.decompress(stream)
    return {raw[y * (1 + w * c)] for y in range(h)}


def real_looking(n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        if k % 3 == 0:
            out.append(random_image(rng, 32, 32, 3))
        elif k % 3 == 1:
            out.append(averaged_image(rng, 32, 32, 3))
        else:
            base = smooth_image(32, 32, 3).astype(np.int64) + rng.integers(-8, 9, (32, 32, 3))
            out.append(np.clip(base, 0, 255).astype(np.uint8))
    return out


# ---------------------------------------------------------------- the kernels' NumPy / zlib twins
def inflate_numpy(packed: np.ndarray, lengths: np.ndarray, raw: int) -> tuple[np.ndarray, np.ndarray]:
    """The twin of inflate_kernel through zlib: (filtered scanlines (B, raw), status: 0 or -1 for any error)."""
    out = np.zeros((len(packed), raw), np.uint8)
    status = np.zeros(len(packed), np.int32)
    for b, (row, n) in enumerate(zip(packed, lengths)):
        try:
            data = zlib.decompress(row[:n].tobytes())
        except zlib.error:
            status[b] = -1
            continue
        if len(data) != raw:
            status[b] = -1
            continue
        out[b] = np.frombuffer(data, np.uint8)
    return out, status


def unfilter_numpy(filtered: np.ndarray, height: int, width: int, channels: int) -> np.ndarray:
    """The twin of unfilter_kernel: (B, raw) filtered scanlines -> (B, H, W, 3) uint8 (raises on a bad filter)."""
    n = len(filtered)
    rows = filtered.reshape(n, height, 1 + width * channels)
    img = np.zeros((n, height, width * channels), np.int64)
    for b in range(n):
        prev = np.zeros(width * channels, np.int64)
        for y in range(height):
            f, line = rows[b, y, 0], rows[b, y, 1:].astype(np.int64)
            cur = np.zeros_like(line)
            for x in range(width * channels):
                a = cur[x - channels] if x >= channels else 0
                up = prev[x]
                c = prev[x - channels] if x >= channels else 0
                if f == 0:
                    pred = 0
                elif f == 1:
                    pred = a
                elif f == 2:
                    pred = up
                elif f == 3:
                    pred = (a + up) // 2
                elif f == 4:
                    p = a + up - c
                    pa, pb, pc = abs(p - a), abs(p - up), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else (up if pb <= pc else c)
                else:
                    raise ValueError(f"unfilter_numpy: bad filter type {f} in row {y} of image {b}")
                cur[x] = (line[x] + pred) % 256
            img[b, y] = cur
            prev = cur
    img = img.reshape(n, height, width, channels).astype(np.uint8)
    if channels == 1:
        return np.repeat(img, 3, axis=3)
    return np.ascontiguousarray(img[..., :3])


# ---------------------------------------------------------------- error statuses
class Bits:
    """A deflate bit writer: fields LSB first, Huffman codes MSB first."""

    def __init__(self) -> None:
        self.acc, self.n = 0, 0

    def put(self, value: int, count: int) -> "Bits":
        self.acc |= value << self.n
        self.n += count
        return self

    def code(self, value: int, length: int) -> "Bits":
        for k in reversed(range(length)):
            self.put((value >> k) & 1, 1)
        return self

    def stream(self) -> bytes:
        return b"\x78\x01" + self.acc.to_bytes((self.n + 7) // 8, "little") + b"\0\0\0\0"


H, W, C = 2, 2, 3  # raw = 14 bytes
RAW = bytes([0, 1, 2, 3, 4, 5, 6, 1, 9, 9, 9, 9, 9, 9])


def corrupt_streams() -> dict:
    good = zlib.compress(RAW, 9)
    stored = zlib.compress(RAW, 0)
    return {
        pd.OK: good,
        pd.BAD_HEADER: bytes([good[0] + 1]) + good[1:],  # compression method 9
        pd.BAD_BLOCK_TYPE: Bits().put(1, 1).put(3, 2).stream(),
        pd.BAD_CODE: Bits().put(1, 1).put(1, 2).code(0xC0 + 6, 8).stream(),  # fixed literal/length symbol 286
        pd.DISTANCE_TOO_FAR: Bits().put(1, 1).put(1, 2).code(0x30 + 65, 8).code(1, 7).code(1, 5).stream(),
        pd.OUTPUT_OVERFLOW: zlib.compress(RAW + b"\0\0"),
        pd.INPUT_EXHAUSTED: good[:len(good) // 2],
        pd.WRONG_LENGTH: zlib.compress(RAW[:-1]),
        pd.BAD_STORED_LENGTH: stored[:5] + bytes([stored[5] ^ 1]) + stored[6:],
        pd.BAD_CHECKSUM: good[:-1] + bytes([good[-1] ^ 0x55]),
        pd.BAD_FILTER: zlib.compress(bytes([5]) + RAW[1:]),
    }
