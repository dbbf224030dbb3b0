"""Tests for frost/data/png.py: the fast PNG path against Pillow, its fallbacks, and broken files."""
import struct
import threading
import warnings
import zlib

import numpy as np
import pytest
from PIL import Image

from frost.data import DataLoader, ImageList, decode_image
from frost.data import png
from frost.data.png import PNG_SIGNATURE, decode_png, read_png

SIZES = [(1, 1), (32, 32), (17, 33), (64, 64)]  # (height, width)


def pillow_rgb(path):
    with Image.open(path) as img:
        return np.array(img.convert("RGB"))


def random_image(rng, h, w, c=3):
    return rng.integers(0, 256, (h, w, c) if c > 1 else (h, w), dtype=np.uint8)


def smooth_image(h, w, c=3):
    """Gradients and waves: Pillow's adaptive filtering then picks Sub, Up, Average and Paeth rows."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    channels = [(x * 3 + y * 2) % 256, 128 + 100 * np.sin(x / 5.0) * np.cos(y / 7.0), (x * y) % 256,
                255 - (x + y) % 256][:c]
    return np.stack(channels, axis=-1).astype(np.uint8) if c > 1 else channels[0].astype(np.uint8)


def averaged_image(rng, h, w, c=3):
    """Random first row and column, then each pixel the mean of its left and upper neighbours: Average rows."""
    img = random_image(rng, h, w, c).astype(np.int64).reshape(h, w, -1)
    for y in range(1, h):
        for x in range(1, w):
            img[y, x] = (img[y, x - 1] + img[y - 1, x]) // 2
    return img.astype(np.uint8).reshape((h, w, c) if c > 1 else (h, w))


def chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def chunks_of(data: bytes):
    """[(kind, payload)] of a PNG file."""
    pos, out = 8, []
    while pos < len(data):
        length, kind = struct.unpack_from(">I4s", data, pos)
        out.append((kind, data[pos + 8:pos + 8 + length]))
        pos += 12 + length
    return out


def build(chunks) -> bytes:
    return PNG_SIGNATURE + b"".join(chunk(k, p) for k, p in chunks)


def ihdr(w, h, depth=8, colour=2, interlace=0) -> bytes:
    return struct.pack(">IIBBBBB", w, h, depth, colour, 0, 0, interlace)


def filter_bytes(data: bytes) -> set:
    """The filter type byte of every row of a non-interlaced PNG."""
    (kind, header), *rest = chunks_of(data)
    w, h, depth, colour = struct.unpack(">IIBB", header[:10])
    raw = zlib.decompress(b"".join(p for k, p in rest if k == b"IDAT"))
    row = 1 + w * {0: 1, 2: 3, 4: 2, 6: 4}[colour] * depth // 8
    return {raw[y * row] for y in range(h)}


def count_fast_calls(monkeypatch):
    png._pillow_core()  # the one-time probe of Pillow's API decodes too
    calls = []
    real = png._decode_fast
    monkeypatch.setattr(png, "_decode_fast", lambda *a: calls.append(a) or real(*a))
    return calls


# ---------------------------------------------------------------- the fast path equals Pillow
def test_rgb_grey_rgba_match_pillow_and_use_every_filter(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    calls = count_fast_calls(monkeypatch)
    filters, n = set(), 0
    for h, w in SIZES:
        for c, colour in ((3, 2), (1, 0), (4, 6)):
            for kind, img in (("random", random_image(rng, h, w, c)), ("smooth", smooth_image(h, w, c)),
                              ("averaged", averaged_image(rng, h, w, c))):
                path = tmp_path / f"{kind}_{h}x{w}_{c}.png"
                Image.fromarray(img).save(path, optimize=kind == "averaged")  # Pillow tries Average only then
                data = path.read_bytes()
                assert data[25] == colour  # the colour type we meant to test
                filters |= filter_bytes(data)
                got = read_png(path)
                expected = pillow_rgb(path)
                assert got.dtype == np.uint8 and got.shape == (h, w, 3) and got.flags.writeable
                np.testing.assert_array_equal(got, expected)
                np.testing.assert_array_equal(decode_image(path), expected)
                np.testing.assert_array_equal(got, img[..., :3] if c > 1 else np.repeat(img[..., None], 3, 2))
                n += 1
    assert filters == {0, 1, 2, 3, 4}  # None, Sub, Up, Average, Paeth all decoded
    assert len(calls) == 2 * n  # every one of them on the fast path (read_png and decode_image)


def test_every_filter_type_by_hand():
    """One row per filter type, filtered here (not by Pillow), so each unfilter rule is checked on its own."""
    img = smooth_image(5, 7)
    for f in range(5):
        rows = b"".join(bytes([f]) + png._filter_row(img, y, f) for y in range(5))
        data = build([(b"IHDR", ihdr(7, 5)), (b"IDAT", zlib.compress(rows)), (b"IEND", b"")])
        np.testing.assert_array_equal(decode_png(data, "f.png"), img)


def test_multiple_idat_chunks(tmp_path, monkeypatch):
    img = random_image(np.random.default_rng(1), 33, 17)
    Image.fromarray(img).save(tmp_path / "one.png")
    parts = chunks_of((tmp_path / "one.png").read_bytes())
    stream = b"".join(p for k, p in parts if k == b"IDAT")
    pieces = [stream[i:i + 100] for i in range(0, len(stream), 100)] + [b""]  # an empty IDAT is allowed
    data = build([parts[0]] + [(b"IDAT", p) for p in pieces] + [(b"IEND", b"")])
    (tmp_path / "many.png").write_bytes(data)
    calls = count_fast_calls(monkeypatch)
    np.testing.assert_array_equal(read_png(tmp_path / "many.png"), pillow_rgb(tmp_path / "many.png"))
    np.testing.assert_array_equal(read_png(tmp_path / "many.png"), img)
    assert len(calls) == 2 and len(calls[0][4]) == len(stream)  # the joined IDAT data went to the decoder


def test_ancillary_chunks_and_transparency_are_ignored_like_pillow(tmp_path):
    img = random_image(np.random.default_rng(2), 6, 5)
    Image.fromarray(img).save(tmp_path / "a.png")
    parts = chunks_of((tmp_path / "a.png").read_bytes())
    data = build([parts[0], (b"tRNS", b"\x00\x01\x00\x02\x00\x03"), (b"tEXt", b"Comment\x00hello")]
                 + parts[1:-1] + [(b"zzZz", b"private"), (b"IEND", b"")])
    (tmp_path / "b.png").write_bytes(data)
    np.testing.assert_array_equal(read_png(tmp_path / "b.png"), pillow_rgb(tmp_path / "b.png"))
    grey = smooth_image(4, 9, 1)
    Image.fromarray(grey).save(tmp_path / "g.png", transparency=7)
    np.testing.assert_array_equal(read_png(tmp_path / "g.png"), pillow_rgb(tmp_path / "g.png"))


def test_threads_share_nothing(tmp_path):
    rng = np.random.default_rng(3)
    paths, images = [], []
    for i in range(24):
        h, w = SIZES[i % 4]
        images.append(random_image(rng, h, w, (3, 4, 1)[i % 3]))
        paths.append(tmp_path / f"{i}.png")
        Image.fromarray(images[-1]).save(paths[-1])
    expected = [pillow_rgb(p) for p in paths]
    errors = []

    def work():
        for _ in range(5):
            for p, e in zip(paths, expected):
                if not np.array_equal(read_png(p), e):
                    errors.append(p)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_image_list_and_loader_use_it(tmp_path, monkeypatch):
    rng = np.random.default_rng(4)
    images = [random_image(rng, 32, 32) for _ in range(10)]
    for i, img in enumerate(images):
        Image.fromarray(img).save(tmp_path / f"{i}.png")
    calls = count_fast_calls(monkeypatch)
    ds = ImageList([tmp_path / f"{i}.png" for i in range(10)], list(range(10)))
    (x, y), = [(x.numpy().copy(), y.numpy().copy()) for x, y in DataLoader(ds, batch_size=10, num_workers=3)]
    np.testing.assert_array_equal(x, np.stack(images))
    assert y.tolist() == list(range(10)) and len(calls) == 10


# ---------------------------------------------------------------- fallbacks: same output as Pillow
def adam7(img: np.ndarray, colour: int = 2) -> bytes:
    """An interlaced (Adam7) PNG written by hand, rows unfiltered."""
    h, w = img.shape[:2]
    passes = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]
    raw = b""
    for x0, y0, dx, dy in passes:
        sub = img[y0::dy, x0::dx]
        if sub.size:
            raw += b"".join(b"\x00" + row.tobytes() for row in sub)
    return build([(b"IHDR", ihdr(w, h, colour=colour, interlace=1)), (b"IDAT", zlib.compress(raw)),
                  (b"IEND", b"")])


def test_fallbacks_match_pillow(tmp_path, monkeypatch):
    rng = np.random.default_rng(5)
    img = random_image(rng, 13, 11)
    files = {}
    Image.fromarray(img).quantize(16).save(tmp_path / "palette.png")
    files["palette"] = 3
    Image.fromarray(smooth_image(9, 10, 1).astype(np.uint16) * 257).save(tmp_path / "grey16.png")
    files["grey16"] = 0
    rgb16 = rng.integers(0, 65536, (5, 6, 3), dtype=np.uint16)
    rows = b"".join(b"\x00" + row.astype(">u2").tobytes() for row in rgb16)
    (tmp_path / "rgb16.png").write_bytes(build([(b"IHDR", ihdr(6, 5, depth=16)), (b"IDAT", zlib.compress(rows)),
                                                (b"IEND", b"")]))
    files["rgb16"] = 2
    Image.fromarray(random_image(rng, 7, 8, 4)).convert("LA").save(tmp_path / "la.png")
    files["la"] = 4
    Image.fromarray(img[..., 0]).convert("1").save(tmp_path / "bits.png")
    files["bits"] = 0
    (tmp_path / "adam7.png").write_bytes(adam7(img))
    files["adam7"] = 2
    calls = count_fast_calls(monkeypatch)
    for name, colour in files.items():
        path = tmp_path / f"{name}.png"
        assert path.read_bytes()[25] == colour
        got = read_png(path)
        assert got.shape[2] == 3 and got.dtype == np.uint8
        np.testing.assert_array_equal(got, pillow_rgb(path), err_msg=name)
        np.testing.assert_array_equal(decode_image(path), pillow_rgb(path), err_msg=name)
    np.testing.assert_array_equal(read_png(tmp_path / "adam7.png"), img)  # the hand-made interlacing is right
    assert calls == []


def test_without_pillows_private_api_it_uses_image_open(tmp_path, monkeypatch):
    img = smooth_image(8, 9, 4)
    Image.fromarray(img).save(tmp_path / "a.png")
    monkeypatch.setattr(png._Pillow, "core", None)
    monkeypatch.setattr(png._Pillow, "checked", True)
    calls = count_fast_calls(monkeypatch)
    np.testing.assert_array_equal(read_png(tmp_path / "a.png"), img[..., :3])
    assert calls == []
    monkeypatch.setattr(png._Pillow, "checked", False)  # the probe finds this Pillow's API usable
    assert png._pillow_core() is not None


def test_huge_images_keep_pillows_decompression_bomb_check(tmp_path, monkeypatch):
    Image.fromarray(smooth_image(20, 20)).save(tmp_path / "big.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 150)
    with pytest.raises(RuntimeError, match=r"big\.png: DecompressionBombError"):
        read_png(tmp_path / "big.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 300)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        np.testing.assert_array_equal(read_png(tmp_path / "big.png"), smooth_image(20, 20))
    assert any(issubclass(w.category, Image.DecompressionBombWarning) for w in caught)


# ---------------------------------------------------------------- broken files name the file
@pytest.fixture
def good(tmp_path):
    Image.fromarray(random_image(np.random.default_rng(6), 32, 32)).save(tmp_path / "good.png")
    return (tmp_path / "good.png").read_bytes()


def check_broken(tmp_path, data, match):
    path = tmp_path / "broken.png"
    path.write_bytes(data)
    with pytest.raises(RuntimeError, match=r"decode_png: cannot decode .*broken\.png: .*" + match):
        read_png(path)
    with pytest.raises(RuntimeError, match=r"decode_image: cannot decode .*broken\.png: .*" + match):
        decode_image(path)


def test_truncated_files_raise_naming_the_file(tmp_path, good):
    idat_start = good.index(b"IDAT") + 4
    for cut, match in [(20, "too short"), (len(good) // 2, "truncated: chunk b'IDAT'"),
                       (len(good) - 12, "without an IEND chunk"), (idat_start + 10, "truncated")]:
        check_broken(tmp_path, good[:cut], match)
    # an IDAT stream cut short but wrapped in well-formed chunks
    parts = chunks_of(good)
    stream = parts[1][1]
    check_broken(tmp_path, build([parts[0], (b"IDAT", stream[:len(stream) // 2]), (b"IEND", b"")]),
                 "truncated image data")
    check_broken(tmp_path, build([parts[0], (b"IEND", b"")]), "no IDAT chunk")


def test_corrupt_files_raise_naming_the_file(tmp_path, good):
    bad_crc = bytearray(good)
    bad_crc[29] ^= 0xFF  # IHDR's CRC
    check_broken(tmp_path, bytes(bad_crc), "bad CRC in the IHDR chunk")
    parts = chunks_of(good)
    garbage = np.random.default_rng(7).integers(0, 256, len(parts[1][1]), dtype=np.uint8).tobytes()
    check_broken(tmp_path, build([parts[0], (b"IDAT", garbage), (b"IEND", b"")]), "corrupt image data")
    bad_adler = bytearray(parts[1][1])
    bad_adler[-1] ^= 0xFF  # the zlib stream's own checksum: what stands in for IDAT's unchecked CRC
    check_broken(tmp_path, build([parts[0], (b"IDAT", bytes(bad_adler)), (b"IEND", b"")]), "corrupt image data")
    check_broken(tmp_path, build([(b"IDAT", parts[1][1]), (b"IEND", b"")]), "not a 13-byte IHDR")
    check_broken(tmp_path, build([(b"IHDR", ihdr(0, 4)), parts[1], (b"IEND", b"")]), "bad IHDR: 0x4")
    check_broken(tmp_path, good[:33] + b"\x7f\xff\xff\xff" + good[37:], r"IDAT' at byte 33 needs 2147483647 bytes")
    bad_filter = build([(b"IHDR", ihdr(2, 1)), (b"IDAT", zlib.compress(b"\x09" + bytes(6))), (b"IEND", b"")])
    check_broken(tmp_path, bad_filter, "corrupt image data")
    path = tmp_path / "noise.png"
    path.write_bytes(b"definitely not an image")
    with pytest.raises(RuntimeError, match=r"decode_image: cannot decode .*noise\.png: UnidentifiedImageError"):
        decode_image(path)
    with pytest.raises(RuntimeError, match=r"decode_png: cannot decode .*noise\.png: .*bad signature"):
        read_png(path)
    with pytest.raises(RuntimeError, match=r"read_png: cannot decode .*missing\.png: FileNotFoundError"):
        read_png(tmp_path / "missing.png")
    with pytest.raises(RuntimeError, match=r"decode_image: cannot decode .*missing\.png: FileNotFoundError"):
        decode_image(tmp_path / "missing.png")


# ---------------------------------------------------------------- ImageList.get_batch (the loader's per-batch path)
def test_image_list_get_batch_matches_getitem(tmp_path):
    rng = np.random.default_rng(8)
    paths = []
    for i in range(6):
        paths.append(tmp_path / f"{i}.png")
        Image.fromarray(random_image(rng, 9, 7, (3, 4, 1)[i % 3])).save(paths[-1])
    Image.fromarray(random_image(rng, 9, 7)).save(tmp_path / "j.jpg")
    paths.append(tmp_path / "j.jpg")
    for transform in (None, lambda x: x[2:, ::-1]):
        ds = ImageList(paths, [3, 1, 4, 1, 5, 9, 2], transform=transform)
        idx = np.array([6, 0, 5, 5, 2])
        x, y = ds.get_batch(idx)
        np.testing.assert_array_equal(x, np.stack([ds[i][0] for i in idx]))
        assert x.dtype == np.uint8 and y.tolist() == [2, 3, 9, 9, 4]
        for w in (0, 2):
            got = [(a.numpy().copy(), b.numpy().copy()) for a, b in DataLoader(ds, batch_size=3, num_workers=w)]
            np.testing.assert_array_equal(np.concatenate([a for a, _ in got]), np.stack([ds[i][0] for i in range(7)]))


def test_image_list_get_batch_needs_one_size(tmp_path):
    rng = np.random.default_rng(9)
    Image.fromarray(random_image(rng, 4, 4)).save(tmp_path / "a.png")
    Image.fromarray(random_image(rng, 5, 4)).save(tmp_path / "b.png")
    ds = ImageList([tmp_path / "a.png", tmp_path / "b.png"], [0, 1])
    with pytest.raises(ValueError, match=r"b\.png gives an image of shape \(5, 4, 3\) but .*a\.png one of \(4, 4, 3\)"):
        ds.get_batch(np.array([0, 1]))
    batch, = DataLoader(ds, batch_size=2, collate_fn=lambda s: [a for a, _ in s])  # per sample, any sizes
    assert [a.shape for a in batch] == [(4, 4, 3), (5, 4, 3)]
