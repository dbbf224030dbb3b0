"""Tests for frost/data/jpeg.py: the frame-header walk against Pillow's sizes, and the errors that name the file."""
import io
import struct

import numpy as np
import pytest
from PIL import Image

from frost.data.jpeg import ends_whole, is_jpeg, jpeg_frame, jpeg_size


def jpeg_bytes(array, **options) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, format="JPEG", **options)
    return out.getvalue()


@pytest.mark.parametrize("options", [{}, {"progressive": True}, {"quality": 30, "optimize": True},
                                     {"exif": b"Exif\x00\x00" + b"\x00" * 40}])
@pytest.mark.parametrize("shape", [(1, 1, 3), (17, 5, 3), (240, 320, 3), (33, 47)])
def test_size_is_pillows(shape, options):
    array = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    data = jpeg_bytes(array, **options)
    with Image.open(io.BytesIO(data)) as image:
        assert jpeg_size(data, "x.jpg") == (image.height, image.width, len(image.getbands()))


def test_cmyk_and_fill_bytes():
    cmyk = io.BytesIO()
    Image.new("CMYK", (11, 9), (1, 2, 3, 4)).save(cmyk, format="JPEG")
    assert jpeg_size(cmyk.getvalue(), "c.jpg") == (9, 11, 4)
    data = jpeg_bytes(np.zeros((6, 7, 3), np.uint8))
    padded = data[:2] + b"\xff\xff\xff" + data[2:]   # fill bytes before a marker are legal
    assert jpeg_size(padded, "p.jpg") == (6, 7, 3)
    assert is_jpeg(data) and not is_jpeg(b"\x89PNG\r\n\x1a\n") and not is_jpeg(b"\xff\xd8")


def test_broken_headers_raise_naming_the_file():
    data = jpeg_bytes(np.zeros((6, 7, 3), np.uint8))
    sof = data.index(b"\xff\xc0")
    with pytest.raises(ValueError, match=r"a\.png is not a JPEG file"):
        jpeg_size(b"\x89PNG\r\n\x1a\n" + data, "a.png")
    with pytest.raises(ValueError, match=r"t\.jpg is truncated before its frame header \(\d+ bytes\)"):
        jpeg_size(data[:sof + 4], "t.jpg")
    with pytest.raises(ValueError, match=r"e\.jpg has its end before a frame header"):
        jpeg_size(b"\xff\xd8\xff\xd9", "e.jpg")
    with pytest.raises(ValueError, match=r"s\.jpg has scan data before a frame header"):
        jpeg_size(b"\xff\xd8\xff\xda\x00\x08" + b"\x00" * 6, "s.jpg")
    zero = bytearray(data)
    zero[sof + 5:sof + 7] = b"\x00\x00"   # height 0 (a DNL marker would give it later)
    with pytest.raises(ValueError, match=r"z\.jpg claims 7 x 0 pixels"):
        jpeg_size(bytes(zero), "z.jpg")
    app0 = data.index(b"\xff\xe0")
    end = app0 + 2 + struct.unpack_from(">H", data, app0 + 2)[0]   # the first segment's end
    junk = data[:end] + b"\x00\x17" + data[end:]   # stray bytes between segments: skipped, as libjpeg does
    assert jpeg_size(junk, "j.jpg") == (6, 7, 3)
    bad = data[:app0 + 2] + b"\x00\x01" + data[app0 + 4:]
    with pytest.raises(ValueError, match=r"b\.jpg has a segment \(marker 0xe0\) of length 1"):
        jpeg_size(bad, "b.jpg")
    short = data[:sof + 2] + struct.pack(">H", 5) + data[sof + 4:]
    with pytest.raises(ValueError, match=r"f\.jpg has a frame header of 5 bytes"):
        jpeg_size(short, "f.jpg")


def test_the_end_marker_is_looked_for_after_the_scan():
    image = np.random.default_rng(1).integers(0, 256, (40, 50, 3), dtype=np.uint8)
    data = jpeg_bytes(image)
    frame = jpeg_frame(data, "x.jpg")
    assert data[frame.scan:frame.scan + 2] == b"\xff\xda" and frame.precision == 8
    assert ends_whole(data, frame)
    cut = data[:frame.scan + 100]
    assert not ends_whole(cut, jpeg_frame(cut, "cut.jpg"))
    # a thumbnail's end marker (in an APP segment before the scan) does not make a cut file whole
    thumb = io.BytesIO()
    Image.fromarray(image[:8, :8]).save(thumb, format="JPEG")
    app = b"\xff\xe1" + struct.pack(">H", len(thumb.getvalue()) + 2) + thumb.getvalue()
    with_thumb = data[:2] + app + data[2:]
    frame = jpeg_frame(with_thumb, "t.jpg")
    assert ends_whole(with_thumb, frame) and not ends_whole(with_thumb[:frame.scan + 100], frame)
    assert ends_whole(data + b"\x00" * 5000, jpeg_frame(data, "x.jpg"))   # data appended after the image
