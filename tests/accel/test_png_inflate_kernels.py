"""Tests for frost/accel/png_inflate.py: the GPU PNG decoder's kernels (simulated) against zlib, the NumPy twins,
Pillow and the host's reference decode (frost.data.png_device.decode_on_host)."""
import struct
import zlib

import numpy as np
import pytest

from frost.accel import png_inflate
from frost.data import png, png_device as pd
from frost.kernel import Array, i32, kernel, tx
from png_streams import (LEVELS, RAW, Bits, C, H, W, as_rgb, averaged_image, block_type, corrupt_streams, filters_of,
                         inflate_numpy, pack, png_bytes, png_from_stream, random_image, real_looking, smooth_image,
                         unfilter_numpy)


def simulate(streams, h, w, c, stride=None):
    """Run both kernels in the simulator; (filtered scanlines, images, status)."""
    packed, lengths = pack(streams, stride)
    n, raw = len(streams), pd.raw_size(h, w, c)
    filtered, status = np.zeros((n, raw), np.uint8), np.zeros(n, np.int32)
    png_inflate.inflate_kernel.simulate[n, 1](packed, lengths, filtered, status, n)
    images, status2 = png_inflate.decode_batch(packed, lengths, h, w, c)
    return filtered, status, images, status2


# ---------------------------------------------------------------- bit-exact against the twins
CASES = [((1, 1), 3), ((5, 3), 3), ((8, 8), 4), ((16, 16), 1), ((16, 16), 3), ((8, 8), 1), ((5, 3), 4)]


@pytest.mark.parametrize("hw,c", CASES)
def test_simulated_kernels_match_zlib_numpy_and_pillow(hw, c):
    h, w = hw
    rng = np.random.default_rng(h * 100 + w * 10 + c)
    images = [random_image(rng, h, w, c), smooth_image(h, w, c), averaged_image(rng, h, w, c)]
    streams, expected = [], []
    for k, img in enumerate(images):
        for level in LEVELS:
            stream, shape = pd.png_stream(png_bytes(img, level), f"img{k}")
            assert shape == (h, w, c)
            streams.append(stream)
            expected.append(as_rgb(img))
    filtered, status, out, status2 = simulate(streams, h, w, c)
    assert not status.any() and not status2.any()
    twin, twin_status = inflate_numpy(*pack(streams), pd.raw_size(h, w, c))
    assert not twin_status.any()
    np.testing.assert_array_equal(filtered, twin)
    np.testing.assert_array_equal(out, unfilter_numpy(twin, h, w, c))
    np.testing.assert_array_equal(out, np.stack(expected))
    assert 0 in {block_type(s) for s in streams}  # level 0: stored blocks


def test_all_filters_and_block_types_occur_and_decode():
    """A 32x32 set where Pillow's encoder uses all five filters and stored, fixed and dynamic blocks."""
    rng = np.random.default_rng(7)
    h = w = 32
    imgs = [smooth_image(h, w, 3), averaged_image(rng, h, w, 3), random_image(rng, h, w, 3)]
    streams = [pd.png_stream(png_bytes(img, level), "x")[0] for img, level in zip(imgs, (9, 6, 0))]
    mixed = random_image(rng, h, w, 3)  # every filter by hand too: row y uses filter y % 5
    imgs.append(mixed)
    streams.append(zlib.compress(b"".join(bytes([y % 5]) + png._filter_row(mixed, y, y % 5) for y in range(h))))
    tiny = np.full((2, 2, 3), 7, np.uint8)  # tiny images get fixed codes
    tiny_stream = pd.png_stream(png_bytes(tiny, 9), "tiny")[0]
    assert block_type(tiny_stream) == 1
    assert block_type(streams[0]) == 2 and block_type(streams[2]) == 0
    assert set().union(*(filters_of(s, h, w, 3) for s in streams)) == {0, 1, 2, 3, 4}
    _, status, out, _ = simulate(streams, h, w, 3)
    assert not status.any()
    np.testing.assert_array_equal(out, np.stack(imgs))
    _, status, out, _ = simulate([tiny_stream], 2, 2, 3)
    assert status[0] == 0
    np.testing.assert_array_equal(out[0], tiny)


def test_zlib_stream_split_over_several_idat_chunks():
    img = smooth_image(8, 8, 3)
    stream = zlib.compress(zlib.decompress(pd.png_stream(png_bytes(img), "x")[0]), 9)
    data = png_from_stream(8, 8, 2, stream, pieces=4)
    assert data.count(b"IDAT") == 4
    joined, shape = pd.png_stream(data, "split.png")
    assert joined == stream and shape == (8, 8, 3)
    np.testing.assert_array_equal(simulate([joined], 8, 8, 3)[2][0], img)


def test_length_and_distance_tables_match_rfc1951():
    @kernel
    def tables(lb: Array[i32], le: Array[i32], db: Array[i32], de: Array[i32], order: Array[i32]):
        s = tx
        if s < 29:
            lb[s] = png_inflate.length_base(s)
            le[s] = png_inflate.length_extra(s)
        if s < 30:
            db[s] = png_inflate.dist_base(s)
            de[s] = png_inflate.dist_extra(s)
        if s < 19:
            order[s] = png_inflate.code_length_order(s)
    out = [np.zeros(n, np.int32) for n in (29, 29, 30, 30, 19)]
    tables.simulate[1, 32](*out)
    assert out[0].tolist() == [3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99,
                               115, 131, 163, 195, 227, 258]
    assert out[1].tolist() == [0] * 8 + [1] * 4 + [2] * 4 + [3] * 4 + [4] * 4 + [5] * 4 + [0]
    assert out[2].tolist() == [1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025,
                               1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577]
    assert out[3].tolist() == [0, 0, 0, 0] + [k // 2 for k in range(2, 28)]
    assert out[4].tolist() == [16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15]


def test_each_error_gives_its_status():
    cases = corrupt_streams()
    # an over-subscribed code-length code (four codes of length 1) is a bad table too
    cases_list = list(cases.items()) + [(pd.BAD_CODE, Bits().put(1, 1).put(2, 2).put(0, 5).put(0, 5).put(0, 4)
                                         .put(1, 3).put(1, 3).put(1, 3).put(1, 3).stream())]
    want = [code for code, _ in cases_list]
    images, status = png_inflate.decode_batch(*pack([s for _, s in cases_list]), H, W, C)
    assert status.tolist() == want
    assert len(set(cases)) == len(pd.STATUS) and all(pd.STATUS[c] for c in cases)
    assert images[0].reshape(-1).tolist() == [1, 2, 3, 4, 5, 6, 9, 9, 9, 18, 18, 18]  # row 1: Sub
    np.testing.assert_array_equal(images[0], unfilter_numpy(np.frombuffer(RAW, np.uint8)[None], H, W, C)[0])


def single_code_block_then_stored(eob_length: int, data: bytes) -> bytes:
    """A zlib stream: a dynamic block whose literal/length code is the one end-of-block code, eob_length bits long
    (its distance code empty), then a last stored block of data with its Adler-32."""
    bits = Bits().put(0, 1).put(2, 2).put(0, 5).put(0, 5).put(18 - 4, 4)   # 257 lengths, 1 distance, 18 code lengths
    for symbol in (16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1):
        bits.put(1 if symbol in (0, eob_length) else 0, 3)   # code-length symbols 0 and eob_length: codes 0 and 1
    for k in range(257):
        bits.code(1 if k == 256 else 0, 1)
    bits.code(0, 1).code(0, eob_length)       # the distance length (0), then the block's end-of-block symbol
    bits.put(1, 1).put(0, 2)                  # the last block: stored, from the next byte
    head = bits.acc.to_bytes((bits.n + 7) // 8, "little")
    return (b"\x78\x01" + head + struct.pack("<HH", len(data), len(data) ^ 0xFFFF) + data
            + struct.pack(">I", zlib.adler32(data)))


def test_an_incomplete_code_is_taken_only_as_one_code_of_one_bit():
    """As zlib and puff: a literal/length (or distance) code may be incomplete only if it is a single 1-bit code;
    the kernel took a single code of any length, decoding streams that zlib and Pillow refuse."""
    streams = [single_code_block_then_stored(1, RAW), single_code_block_then_stored(3, RAW)]
    assert zlib.decompress(streams[0]) == RAW
    with pytest.raises(zlib.error, match="invalid literal/lengths set"):
        zlib.decompress(streams[1])
    packed, lengths = pack(streams)
    for decode in (png_inflate.decode_batch, pd.decode_on_host):
        images, status = decode(packed, lengths, H, W, C)
        assert status.tolist() == [pd.OK, pd.BAD_CODE], decode.__name__
        np.testing.assert_array_equal(images[0], unfilter_numpy(np.frombuffer(RAW, np.uint8)[None], H, W, C)[0])


def test_the_host_reference_gives_the_kernels_statuses_and_images():
    """frost.data.png_device.decode_on_host (zlib, then Pillow) is what NumPy arrays and Frost without this layer
    get: every fault gives the kernels' status code, and good streams the kernels' pixels."""
    streams = list(corrupt_streams().values())
    packed, lengths = pack(streams)
    images, status = png_inflate.decode_batch(packed, lengths, H, W, C)
    host_images, host_status = pd.decode_on_host(packed, lengths, H, W, C)
    assert host_status.tolist() == status.tolist() == list(corrupt_streams())
    np.testing.assert_array_equal(host_images[0], images[0])
    good, short = zlib.compress(RAW, 9), zlib.compress(RAW[:-1], 9)
    edges = [(b"", 0, pd.INPUT_EXHAUSTED), (b"\x78", 1, pd.INPUT_EXHAUSTED),
             (short[:-1] + bytes([short[-1] ^ 0x55]), None, pd.WRONG_LENGTH),  # the length before the Adler-32
             (short[:-4], None, pd.WRONG_LENGTH), (good[:-2], None, pd.INPUT_EXHAUSTED),
             (good + b"garbage!", None, pd.OK), (good, -8, pd.INPUT_EXHAUSTED)]   # a negative length: no stream
    packed, _ = pack([stream or b"\0" for stream, _, _ in edges])
    lengths = np.array([len(stream) if n is None else n for stream, n, _ in edges], np.int32)
    want = [code for _, _, code in edges]
    for decode in (png_inflate.decode_batch, pd.decode_on_host):
        assert decode(packed, lengths, H, W, C)[1].tolist() == want, decode.__name__
    rng = np.random.default_rng(8)
    for c in (1, 3, 4):
        imgs = [random_image(rng, 5, 7, c), smooth_image(5, 7, c)]
        packed, lengths = pack([pd.png_stream(png_bytes(img, 6), "x")[0] for img in imgs])
        kernel_images, kernel_status = png_inflate.decode_batch(packed, lengths, 5, 7, c)
        host_images, host_status = pd.decode_on_host(packed, lengths, 5, 7, c)
        assert not kernel_status.any() and not host_status.any()
        np.testing.assert_array_equal(host_images, kernel_images)
        np.testing.assert_array_equal(host_images, np.stack([as_rgb(img) for img in imgs]))


def test_lengths_past_the_stride_are_clipped():
    good = zlib.compress(RAW, 9)
    packed, _ = pack([good])
    _, status = png_inflate.decode_batch(packed, np.array([10_000], np.int32), H, W, C)
    assert status[0] == 0


def test_both_kernels_compile_for_sm90(tmp_path, monkeypatch):
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    assert png_inflate.inflate_kernel.compile("sm_90")[:4] == b"\x7fELF"
    assert png_inflate.unfilter_kernel.compile("sm_90")[:4] == b"\x7fELF"


@pytest.mark.cuda
def test_gpu_decode_matches_pillow_on_1000_images():
    """Through frost.data.png_device.decode_png_batch, which finds this layer's kernels for CuPy arrays."""
    import cupy as cp
    imgs = real_looking(1000)
    streams = [pd.png_stream(png_bytes(img, (0, 1, 6, 9)[k % 4]), str(k))[0] for k, img in enumerate(imgs)]
    packed, lengths = pack(streams, pd.deflate_bound(pd.raw_size(32, 32, 3)))
    images, status = pd.decode_png_batch(cp.asarray(packed), cp.asarray(lengths), 32, 32, 3)
    assert not status.get().any()
    np.testing.assert_array_equal(images.get(), np.stack(imgs))
    bad = [s for _, s in corrupt_streams().items()]
    _, st = pd.decode_png_batch(cp.asarray(pack(bad)[0]), cp.asarray(pack(bad)[1]), H, W, C)
    assert st.get().tolist() == list(corrupt_streams())
