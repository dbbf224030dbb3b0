"""A JPEG file's size from its frame header, read on the host without decoding (the GPU batch decoder's workers).

A worker must know each image's height and width before the GPU decodes it: the random crop's window is drawn from
them on the CPU (with the batch's generator, as RandomResizedCrop draws it), and a 300-byte file claiming 65,000 x
65,000 pixels must be refused before anything is allocated for it; a cut file must be found before a GPU decoder
fills in its missing part. The walk reads marker segments from SOI to the first scan, taking the first start-of-frame
marker (SOF0-SOF15 except DHT, JPG and DAC, which share the range), as libjpeg does.
"""
from __future__ import annotations

import struct
from typing import NamedTuple

__all__ = ["JPEG_SOI", "JpegFrame", "jpeg_frame", "jpeg_size", "is_jpeg", "ends_whole"]

JPEG_SOI = b"\xff\xd8"
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}   # start of frame, every coding process
_STANDALONE = frozenset(range(0xD0, 0xD8)) | {0x01}          # RSTn and TEM carry no length
_EOI, _SOS = 0xD9, 0xDA
_FRAME = struct.Struct(">HBHHB")                             # length, precision, height, width, components


def is_jpeg(data: bytes) -> bool:
    """Whether the bytes start like a JPEG file (SOI then a marker)."""
    return len(data) >= 3 and data[:2] == JPEG_SOI and data[2] == 0xFF


class JpegFrame(NamedTuple):
    height: int
    width: int
    components: int
    precision: int   # bits per sample: 8 for nearly every JPEG
    scan: int        # where the first scan's header starts (its SOS marker)


def ends_whole(data: bytes, frame: JpegFrame) -> bool:
    """Whether an EOI marker follows the first scan. A cut file lacks it: Pillow refuses such a file ("image file is
    truncated") but the GPU decoders fill in the missing part, so the check is made on the host. (Scan data never
    holds FF D9: an FF byte there is followed by 00 or a restart marker; a thumbnail's EOI comes before the scan.)"""
    return data.find(b"\xff\xd9", frame.scan) >= 0


def jpeg_size(data: bytes, name: str) -> tuple[int, int, int]:
    """(height, width, components) of a JPEG file's frame (see jpeg_frame)."""
    frame = jpeg_frame(data, name)
    return frame.height, frame.width, frame.components


def jpeg_frame(data: bytes, name: str) -> JpegFrame:
    """A JPEG file's frame header and where its first scan starts. Anything that is not a readable JPEG up to its
    first scan (no SOI, a truncated segment, scan data or EOI before the frame, a zero size) raises ValueError naming
    `name`. Stray bytes between segments are skipped, as libjpeg skips them (with a warning)."""
    if not is_jpeg(data):
        raise ValueError(f"jpeg_size: {name} is not a JPEG file (no SOI marker at its start)")
    pos, end, frame = 2, len(data), None
    while pos < end:
        pos = data.find(b"\xff", pos)
        if pos < 0:
            break
        while pos < end and data[pos] == 0xFF:   # fill bytes may pad a marker
            pos += 1
        if pos >= end:
            break
        marker = data[pos]
        pos += 1
        if marker in _STANDALONE or marker == 0:
            continue
        if marker == _EOI or (marker == _SOS and frame is None):
            raise ValueError(f"jpeg_size: {name} has {'its end' if marker == _EOI else 'scan data'} before "
                             f"{'its first scan' if frame else 'a frame header (no SOF marker)'}")
        if marker == _SOS:
            return frame._replace(scan=pos - 2)
        if pos + 2 > end:
            break
        length = data[pos] << 8 | data[pos + 1]
        if length < 2:
            raise ValueError(f"jpeg_size: {name} has a segment (marker 0x{marker:02x}) of length {length} at byte "
                             f"{pos}")
        if pos + length > end:
            break
        if marker in _SOF and frame is None:
            frame = _frame_of(data, pos, length, name)
        pos += length
    raise ValueError(f"jpeg_size: {name} is truncated before its {'first scan' if frame else 'frame header'} "
                     f"({end} bytes)")


def _frame_of(data: bytes, pos: int, length: int, name: str) -> JpegFrame:
    if length < 8:
        raise ValueError(f"jpeg_size: {name} has a frame header of {length} bytes, shorter than its 8")
    _, precision, height, width, components = _FRAME.unpack_from(data, pos)
    if height == 0 or width == 0 or components == 0:
        raise ValueError(f"jpeg_size: {name} claims {width} x {height} pixels with {components} component(s) (a "
                         f"height given later by a DNL marker is not supported)")
    return JpegFrame(height, width, components, precision, -1)
