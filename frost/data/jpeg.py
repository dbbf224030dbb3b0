"""A JPEG file's size from its frame header, read on the host without decoding (the GPU batch decoder's workers).

A worker must know each image's height and width before the GPU decodes it: the random crop's window is drawn from
them on the CPU (with the batch's generator, as RandomResizedCrop draws it), and a 300-byte file claiming 65,000 x
65,000 pixels must be refused before anything is allocated for it. The walk reads marker segments from SOI up to
the first start-of-frame marker (SOF0-SOF15 except DHT, JPG and DAC, which share the range), as libjpeg does.
"""
from __future__ import annotations

import struct

__all__ = ["JPEG_SOI", "jpeg_size", "is_jpeg", "ends_whole"]

JPEG_SOI = b"\xff\xd8"
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}   # start of frame, every coding process
_STANDALONE = frozenset(range(0xD0, 0xD8)) | {0x01}          # RSTn and TEM carry no length
_EOI, _SOS = 0xD9, 0xDA
_FRAME = struct.Struct(">HBHHB")                             # length, precision, height, width, components


def is_jpeg(data: bytes) -> bool:
    """Whether the bytes start like a JPEG file (SOI then a marker)."""
    return len(data) >= 3 and data[:2] == JPEG_SOI and data[2] == 0xFF


def ends_whole(data: bytes) -> bool:
    """Whether an EOI marker lies in the file's last KiB. A cut file lacks it: Pillow refuses such a file
    ("image file is truncated") but the GPU decoders fill in the missing part, so the check is made on the host.
    (Scan data never holds FF D9: an FF byte there is followed by 00 or a restart marker.)"""
    return data.rfind(b"\xff\xd9", max(0, len(data) - 1024)) >= 0


def jpeg_size(data: bytes, name: str) -> tuple[int, int, int]:
    """(height, width, components) of a JPEG file's frame. Anything that is not a readable JPEG frame header
    (no SOI, a truncated segment, scan data or EOI before the frame, a zero size) raises ValueError naming `name`."""
    if not is_jpeg(data):
        raise ValueError(f"jpeg_size: {name} is not a JPEG file (no SOI marker at its start)")
    pos, end = 2, len(data)
    while pos < end:
        if data[pos] != 0xFF:
            raise ValueError(f"jpeg_size: {name}: expected a marker at byte {pos}, found 0x{data[pos]:02x}")
        while pos < end and data[pos] == 0xFF:   # fill bytes may pad a marker
            pos += 1
        if pos >= end:
            break
        marker = data[pos]
        pos += 1
        if marker in _STANDALONE:
            continue
        if marker in (_EOI, _SOS):
            raise ValueError(f"jpeg_size: {name} has {'its end' if marker == _EOI else 'scan data'} before a frame "
                             f"header (no SOF marker)")
        if pos + 2 > end:
            break
        length = data[pos] << 8 | data[pos + 1]
        if length < 2 or pos + length > end:
            break
        if marker in _SOF:
            if length < 8:
                raise ValueError(f"jpeg_size: {name} has a frame header of {length} bytes, shorter than its 8")
            _, _, height, width, components = _FRAME.unpack_from(data, pos)
            if height == 0 or width == 0 or components == 0:
                raise ValueError(f"jpeg_size: {name} claims {width} x {height} pixels with {components} "
                                 f"component(s) (a height given later by a DNL marker is not supported)")
            return height, width, components
        pos += length
    raise ValueError(f"jpeg_size: {name} is truncated before its frame header ({end} bytes)")
