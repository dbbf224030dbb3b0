"""PNG decoding built for worker threads: one file read, a small chunk parser and one GIL-free Pillow call.

`Image.open(path)` + `np.array(img)` spends most of its time in Python (plugin detection, chunk reads
through buffered files, many short GIL releases), so threads decoding PNGs queue on the GIL. Here a
file is read with one os.read, its chunks are parsed with struct, and the concatenated IDAT data goes
to Pillow's C zip decoder in a single `decode` call, which inflates and unfilters with the GIL released
and writes straight into NumPy memory (a Pillow image mapped onto an array). Anything off the fast
path (palette, bit depths other than 8, interlacing, grey + alpha, animation, huge images, a Pillow
without the private decoder API) goes through Pillow's ordinary path with the same result as
`np.array(Image.open(path).convert("RGB"))`.

Integrity: a signature, IHDR (with its CRC), chunk lengths, the IDAT data and IEND are checked; IDAT
CRCs are not (zlib checks its own stream), the same as Pillow.
"""
from __future__ import annotations

import io
import os
import struct
import threading
import zlib

import numpy as np

__all__ = ["PNG_SIGNATURE", "parse_png", "decode_png", "read_png", "read_file", "decode_bytes", "decode_with_pillow"]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_LENGTH_TYPE = struct.Struct(">I4s")
_IHDR = struct.Struct(">IIBBBBB")
_CRC = struct.Struct(">I")
_IEND_CHUNK = b"\x00\x00\x00\x00IEND\xaeB`\x82"
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_BINARY", 0)  # O_BINARY: Windows
_READ_SIZE = 1 << 16  # one read gets a typical small image whole; larger files loop
# colour type -> (mode of the target image mapped onto NumPy memory, PNG raw mode, channels of that memory)
_FAST_COLOURS = {0: ("L", "L", 1), 2: ("RGBX", "RGB", 4), 6: ("RGBA", "RGBA", 4)}
# chunks after which the fast path does not give Pillow's answer (animation: Pillow's frame 0 rules)
_PILLOW_CHUNKS = (b"acTL", b"fcTL", b"fdAT")
_DECODER_ERRORS = {-1: "image buffer overrun", -2: "broken image data (zlib or filter error)",
                   -3: "unknown error", -8: "bad configuration", -9: "out of memory"}


# ---------------------------------------------------------------- file and Pillow fallback
def read_file(path: str | os.PathLike) -> bytes:
    """The bytes of a file: os.open, one os.read for files up to 64 KiB, os.close (few GIL releases)."""
    fd = os.open(path, _OPEN_FLAGS)
    try:
        data = os.read(fd, _READ_SIZE)
        if len(data) == _READ_SIZE:
            parts = [data]
            while chunk := os.read(fd, 1 << 20):
                parts.append(chunk)
            data = b"".join(parts)
        return data
    finally:
        os.close(fd)


def decode_with_pillow(data: bytes) -> np.ndarray:
    """Any image Pillow reads, as a uint8 RGB array (H, W, 3): what decode_image always did."""
    from PIL import Image
    with Image.open(io.BytesIO(data)) as img:
        if img.mode != "RGB":
            img = img.convert("RGB")
        return np.array(img)


# ---------------------------------------------------------------- Pillow's private decoder API
class _Pillow:
    """Pillow's C core when its zip decoder and map_buffer work as this module expects, else None."""
    core = None
    checked = False
    image_module = None  # PIL.Image, for MAX_IMAGE_PIXELS (users may change it)


def _pillow_core():
    if not _Pillow.checked:
        _Pillow.core, _Pillow.checked = _probe_pillow(), True
    return _Pillow.core


def _probe_pillow():
    """Decode a hand-made PNG (all five filter types) on the fast path; None if that API is not usable."""
    try:
        from PIL import Image
        core = Image.core
        _Pillow.image_module = Image
        expected = np.arange(5 * 3 * 3, dtype=np.uint8).reshape(5, 3, 3) * 5
        rows = [bytes([f]) + _filter_row(expected, y, f) for y, f in enumerate(range(5))]
        got = _decode_fast(core, 3, 5, 2, zlib.compress(b"".join(rows)))
        return core if np.array_equal(got, expected) else None
    except Exception:  # noqa: BLE001 - any failure means "use Pillow's public path"
        return None


def _filter_row(image: np.ndarray, y: int, kind: int) -> bytes:
    """Row y of an RGB image filtered with PNG filter `kind` (for the self-test and the tests)."""
    row = image[y].reshape(-1).astype(np.int64)
    up = image[y - 1].reshape(-1).astype(np.int64) if y > 0 else np.zeros_like(row)
    left = np.concatenate([np.zeros(3, np.int64), row[:-3]])
    upleft = np.concatenate([np.zeros(3, np.int64), up[:-3]])
    if kind == 0:
        pred = np.zeros_like(row)
    elif kind == 1:
        pred = left
    elif kind == 2:
        pred = up
    elif kind == 3:
        pred = (left + up) // 2
    else:
        p = left + up - upleft
        pa, pb, pc = abs(p - left), abs(p - up), abs(p - upleft)
        pred = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, up, upleft))
    return ((row - pred) % 256).astype(np.uint8).tobytes()


# ---------------------------------------------------------------- the fast path
_scratch = threading.local()  # per thread: the last (mode, w, h) -> (array, Pillow image mapped onto it)


def _target(core, mode: str, width: int, height: int, channels: int):
    """A per-thread array with a Pillow image mapped onto it, reused while the size and mode repeat."""
    key = (mode, width, height)
    cached = getattr(_scratch, "entry", None)
    if cached is not None and cached[0] == key:
        return cached[1], cached[2]
    shape = (height, width, channels) if channels > 1 else (height, width)
    array = np.empty(shape, np.uint8)
    image = core.map_buffer(array, (width, height), "raw", 0, (mode, 0, 1))
    _scratch.entry = (key, array, image)
    return array, image


def _decode_fast(core, width: int, height: int, colour: int, idat) -> np.ndarray:
    """Inflate + unfilter in one GIL-released Pillow call into mapped NumPy memory, then copy out RGB."""
    mode, rawmode, channels = _FAST_COLOURS[colour]
    array, image = _target(core, mode, width, height, channels)
    decoder = core.zip_decoder(mode, rawmode, 0)
    try:
        decoder.setimage(image, (0, 0, width, height))
        status, error = decoder.decode(idat)
    finally:
        decoder.cleanup()  # frees zlib's state (Pillow's own loader does the same)
    if error < 0:
        raise ValueError(f"corrupt image data: {_DECODER_ERRORS.get(error, f'decoder error {error}')}")
    if status >= 0:
        raise ValueError(f"truncated image data: {len(idat)} bytes of IDAT end before the image is complete")
    out = np.empty((height, width, 3), np.uint8)
    if channels == 1:
        out[...] = array[:, :, None]
    else:
        np.copyto(out, array[:, :, :3])  # one strided copy (GIL released inside NumPy)
    return out


def _walk_chunks(data: bytes, view: memoryview) -> tuple[list, bool]:
    """The IDAT payloads after IHDR up to IEND, and whether no chunk asks for Pillow (animation)."""
    size, pos, idat, plain = len(data), 33, [], True
    while True:
        if pos + 8 > size:
            raise ValueError(f"truncated: the file ends at byte {size} without an IEND chunk")
        length, kind = _LENGTH_TYPE.unpack_from(data, pos)
        end = pos + 12 + length
        if kind == b"IEND":
            return idat, plain
        if end > size:
            raise ValueError(f"truncated: chunk {kind!r} at byte {pos} needs {length} bytes, the file ends at {size}")
        if kind == b"IDAT":
            idat.append(view[pos + 8:end - 4])
        elif kind in _PILLOW_CHUNKS:
            plain = False
        pos = end


def parse_png(data: bytes) -> tuple[tuple[int, int, int, int, int], list, bool]:
    """PNG bytes -> ((width, height, bit depth, colour type, interlace), IDAT payloads, plain).

    `plain` is False when a chunk asks for Pillow's rules (animation). Raises ValueError for a broken file."""
    if data[:8] != PNG_SIGNATURE:
        raise ValueError("not a PNG file (bad signature)")
    if len(data) < 33:
        raise ValueError(f"truncated: {len(data)} bytes, too short for a PNG header")
    length, kind = _LENGTH_TYPE.unpack_from(data, 8)
    if kind != b"IHDR" or length != 13:
        raise ValueError(f"the first chunk is {kind!r} of {length} bytes, not a 13-byte IHDR")
    if zlib.crc32(data[12:29]) != _CRC.unpack_from(data, 29)[0]:
        raise ValueError("bad CRC in the IHDR chunk")
    width, height, depth, colour, compression, filtering, interlace = _IHDR.unpack_from(data, 16)
    if width == 0 or height == 0 or compression != 0 or filtering != 0:
        raise ValueError(f"bad IHDR: {width}x{height}, compression {compression}, filter method {filtering}")
    view, size = memoryview(data), len(data)
    length, kind = _LENGTH_TYPE.unpack_from(data, 33) if size >= 41 else (0, b"")
    if kind == b"IDAT" and data[45 + length:] == _IEND_CHUNK:  # the usual layout: IHDR, one IDAT, IEND
        idat, plain = [view[41:41 + length]], True
    else:
        idat, plain = _walk_chunks(data, view)
    if not idat:
        raise ValueError("no IDAT chunk")
    return (width, height, depth, colour, interlace), idat, plain


def _decode(data: bytes) -> np.ndarray:
    """PNG bytes -> uint8 RGB (H, W, 3); raises ValueError for a broken file."""
    (width, height, depth, colour, interlace), idat, plain = parse_png(data)
    core = _pillow_core()
    limit = core is not None and _Pillow.image_module.MAX_IMAGE_PIXELS
    if (core is None or not plain or depth != 8 or interlace != 0 or colour not in _FAST_COLOURS
            or (limit and width * height > limit)):
        return decode_with_pillow(data)  # same result (and Pillow's own checks) for everything else
    return _decode_fast(core, width, height, colour, idat[0] if len(idat) == 1 else b"".join(idat))


def decode_bytes(data: bytes) -> np.ndarray:
    """An image file's bytes as uint8 RGB (H, W, 3): PNGs through this module, anything else through Pillow.

    Errors are not wrapped (callers name the file)."""
    return _decode(data) if data[:8] == PNG_SIGNATURE else decode_with_pillow(data)


def decode_png(data: bytes, name: str) -> np.ndarray:
    """PNG bytes as a uint8 RGB array (H, W, 3), equal to np.array(Image.open(f).convert("RGB")).

    A broken file raises RuntimeError naming `name` (the file the bytes came from)."""
    try:
        return _decode(data)
    except Exception as e:  # noqa: BLE001 - struct, zlib, Pillow and our own checks all raise
        raise RuntimeError(f"decode_png: cannot decode {name}: {type(e).__name__}: {e}") from e


def read_png(path: str | os.PathLike) -> np.ndarray:
    """Read and decode a PNG file (see decode_png); a missing or broken file raises naming it."""
    name = os.fspath(path)
    try:
        data = read_file(name)
    except OSError as e:
        raise RuntimeError(f"read_png: cannot decode {name}: {type(e).__name__}: {e}") from e
    return decode_png(data, name)
