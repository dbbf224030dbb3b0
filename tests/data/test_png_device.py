"""Tests for frost/data/png_device.py: the GPU PNG decoder's kernels (simulated) against zlib/NumPy/Pillow."""
import io
import struct
import tracemalloc
import zlib

import numpy as np
import pytest
from PIL import Image

import frost
from frost.data import DataLoader, DataLoaderWorkerError, DevicePNGList, ImageList, decode_image
from frost.data import png, png_device as pd
from frost.kernel import Array, i32, kernel, tx

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


def simulate(streams, h, w, c, stride=None):
    """Run both kernels in the simulator; (filtered scanlines, images, status)."""
    packed, lengths = pack(streams, stride)
    n, raw = len(streams), pd.raw_size(h, w, c)
    filtered, status = np.zeros((n, raw), np.uint8), np.zeros(n, np.int32)
    pd.inflate_kernel.simulate[n, 1](packed, lengths, filtered, status, n)
    images, status2 = pd.decode_png_batch(packed, lengths, h, w, c)
    return filtered, status, images, status2


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
            lb[s] = pd.length_base(s)
            le[s] = pd.length_extra(s)
        if s < 30:
            db[s] = pd.dist_base(s)
            de[s] = pd.dist_extra(s)
        if s < 19:
            order[s] = pd.code_length_order(s)
    out = [np.zeros(n, np.int32) for n in (29, 29, 30, 30, 19)]
    tables.simulate[1, 32](*out)
    assert out[0].tolist() == [3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99,
                               115, 131, 163, 195, 227, 258]
    assert out[1].tolist() == [0] * 8 + [1] * 4 + [2] * 4 + [3] * 4 + [4] * 4 + [5] * 4 + [0]
    assert out[2].tolist() == [1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025,
                               1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577]
    assert out[3].tolist() == [0, 0, 0, 0] + [k // 2 for k in range(2, 28)]
    assert out[4].tolist() == [16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15]


def test_deflate_bound_holds_stored_streams():
    for raw in (1, 14, 3104, 65535, 65536, 200_000):
        data = np.random.default_rng(raw).integers(0, 256, raw, dtype=np.uint8).tobytes()
        assert len(zlib.compress(data, 0)) <= pd.deflate_bound(raw)
        assert len(zlib.compress(data, 9)) <= pd.deflate_bound(raw)
        assert pd.deflate_bound(raw) % 16 == 0


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


def test_each_error_gives_its_status():
    cases = corrupt_streams()
    # an over-subscribed code-length code (four codes of length 1) is a bad table too
    cases_list = list(cases.items()) + [(pd.BAD_CODE, Bits().put(1, 1).put(2, 2).put(0, 5).put(0, 5).put(0, 4)
                                         .put(1, 3).put(1, 3).put(1, 3).put(1, 3).stream())]
    want = [code for code, _ in cases_list]
    images, status = pd.decode_png_batch(*pack([s for _, s in cases_list]), H, W, C)
    assert status.tolist() == want
    assert len(set(cases)) == len(pd.STATUS) and all(pd.STATUS[c] for c in cases)
    assert images[0].reshape(-1).tolist() == [1, 2, 3, 4, 5, 6, 9, 9, 9, 18, 18, 18]  # row 1: Sub
    np.testing.assert_array_equal(images[0], unfilter_numpy(np.frombuffer(RAW, np.uint8)[None], H, W, C)[0])


def test_lengths_past_the_stride_are_clipped():
    good = zlib.compress(RAW, 9)
    packed, _ = pack([good])
    _, status = pd.decode_png_batch(packed, np.array([10_000], np.int32), H, W, C)
    assert status[0] == 0


def write_folder(tmp_path, n=6, size=(4, 5), colour_c=3, level=6):
    rng = np.random.default_rng(3)
    paths, imgs = [], []
    for k in range(n):
        img = random_image(rng, *size, colour_c) if k % 2 else smooth_image(*size, colour_c)
        p = tmp_path / f"{k}.png"
        p.write_bytes(png_bytes(img, level))
        paths.append(p)
        imgs.append(as_rgb(img))
    return paths, imgs


def test_dataset_decodes_on_device_and_names_a_broken_file(tmp_path):
    paths, imgs = write_folder(tmp_path)
    ds = DevicePNGList(paths, list(range(len(paths))))
    fields = ds.get_batch(np.array([4, 1, 2]))
    packed, lengths, indices, labels = fields
    assert packed.shape == (3, pd.deflate_bound(pd.raw_size(4, 5, 3))) and packed.dtype == np.uint8
    assert lengths.dtype == np.int32 and indices.tolist() == [4, 1, 2] and labels.tolist() == [4, 1, 2]
    images, labels = ds.finish_on_device(list(fields))  # NumPy arrays: the simulator
    np.testing.assert_array_equal(images, np.stack([imgs[4], imgs[1], imgs[2]]))
    # flip a byte of the zlib data (PNG chunk CRCs are not checked, as on the CPU path)
    data = bytearray(paths[2].read_bytes())
    stream, _ = pd.png_stream(bytes(data), "x")
    at = bytes(data).index(stream) + len(stream) - 2
    data[at] ^= 0xFF
    paths[2].write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match=rf"cannot decode {paths[2]} on the GPU: Adler-32"):
        ds.finish_on_device(list(ds.get_batch(np.array([1, 2]))))


def test_dataset_rejects_what_the_gpu_cannot_take(tmp_path):
    paths, _ = write_folder(tmp_path, n=2)
    pal = tmp_path / "palette.png"
    Image.fromarray(smooth_image(4, 5, 3)).convert("P").save(pal)
    other = tmp_path / "other.png"
    other.write_bytes(png_bytes(smooth_image(6, 5, 3)))
    ds = DevicePNGList([*paths, pal, other], [0, 1, 2, 3])
    with pytest.raises(ValueError, match=rf"{pal} is a colour type 3 PNG.*decode='cpu'"):
        ds.get_batch(np.array([0, 2]))
    with pytest.raises(ValueError, match=rf"{other} is 6x5 with 3 channel\(s\) but {paths[0]} is 4x5"):
        ds.get_batch(np.array([0, 3]))
    notpng = tmp_path / "x.png"
    notpng.write_bytes(b"GIF89a....")
    with pytest.raises(ValueError, match=rf"cannot decode {notpng}: not a PNG"):
        DevicePNGList([notpng], [0]).get_batch(np.array([0]))


def test_a_small_file_claiming_a_huge_image_is_refused_before_any_buffer(tmp_path):
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(png_from_stream(30000, 30000, 2, zlib.compress(b"\0" * 97, 9)))
    assert bomb.stat().st_size < 100
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=rf"{bomb} claims 30000x30000 pixels, more than the GPU decoder's limit"):
            DevicePNGList([bomb], [0]).get_batch(np.array([0]))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_loader_on_the_cpu_decodes_on_the_cpu(tmp_path):
    paths, imgs = write_folder(tmp_path, n=7)
    ds = DevicePNGList(paths, list(range(7)))
    for workers in (0, 2):
        loader = DataLoader(ds, batch_size=3, shuffle=True, seed=1, num_workers=workers)
        assert type(loader.dataset) is ImageList
        seen = []
        for x, y in loader:
            for img, label in zip(x.numpy(), y.numpy()):
                np.testing.assert_array_equal(img, decode_image(paths[int(label)]))
                seen.append(int(label))
        assert sorted(seen) == list(range(7))


def test_both_kernels_compile_for_sm90(tmp_path, monkeypatch):
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    assert pd.inflate_kernel.compile("sm_90")[:4] == b"\x7fELF"
    assert pd.unfilter_kernel.compile("sm_90")[:4] == b"\x7fELF"


# ---------------------------------------------------------------- on the GPU (run by the lead)
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


@pytest.mark.cuda
def test_gpu_decode_matches_pillow_on_1000_images():
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


@pytest.mark.cuda
def test_gpu_loader_yields_every_sample_once_with_the_cpu_images(tmp_path):
    paths = []
    for k, img in enumerate(real_looking(300, seed=1)):
        p = tmp_path / f"{k}.png"
        p.write_bytes(png_bytes(img, (1, 6, 9)[k % 3]))
        paths.append(p)
    ds = DevicePNGList(paths, list(range(len(paths))))
    for workers in (0, 3):
        seen = []
        for x, y in DataLoader(ds, batch_size=64, shuffle=True, seed=2, num_workers=workers, device="cuda"):
            assert x.device == "cuda:0" and x.shape[1:] == (32, 32, 3) and x.dtype == frost.uint8
            for img, label in zip(x.numpy(), y.numpy()):
                np.testing.assert_array_equal(img, decode_image(paths[int(label)]))
                seen.append(int(label))
        assert sorted(seen) == list(range(len(paths)))


@pytest.mark.cuda
def test_gpu_loader_names_a_corrupt_file(tmp_path):
    paths = []
    for k, img in enumerate(real_looking(40, seed=2)):
        p = tmp_path / f"{k}.png"
        p.write_bytes(png_bytes(img, 6))
        paths.append(p)
    data = bytearray(paths[17].read_bytes())
    stream, _ = pd.png_stream(bytes(data), "x")
    data[bytes(data).index(stream) + len(stream) - 1] ^= 0xFF  # the Adler-32
    paths[17].write_bytes(bytes(data))
    for workers in (0, 2):
        with pytest.raises(RuntimeError, match=rf"cannot decode {paths[17]} on the GPU"):
            for _ in DataLoader(DevicePNGList(paths, [0] * 40), batch_size=8, num_workers=workers, device="cuda"):
                pass


def test_threaded_gpu_loader_path_with_a_fake_cupy(tmp_path, monkeypatch):
    """The DataLoader's device path on the CPU: copies into fake device arrays (NumPy), finish_on_device runs
    on the copy stream after the copies (here through the simulator), and a corrupt file is named."""
    import sys
    import types
    from test_loader import FakeCupy
    from frost.backend import cuda
    fake = FakeCupy()
    monkeypatch.setattr(cuda, "cupy", lambda: fake)
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "cupyx", types.SimpleNamespace(empty_pinned=np.empty))
    paths, imgs = write_folder(tmp_path, n=7, size=(3, 4))
    ds = DevicePNGList(paths, list(range(7)))
    loader = DataLoader(ds, batch_size=3, shuffle=True, seed=1, num_workers=2, device="cuda")
    assert loader.dataset is ds
    seen = []
    for x, y in loader:
        assert x.shape[1:] == (3, 4, 3)
        for img, label in zip(x.numpy(), y.numpy()):
            np.testing.assert_array_equal(img, imgs[int(label)])
            seen.append(int(label))
    assert sorted(seen) == list(range(7)) and fake.log.count("copy") == 3 * 4
    data = bytearray(paths[5].read_bytes())
    stream, _ = pd.png_stream(bytes(data), "x")
    data[bytes(data).index(stream)] ^= 0x01  # the zlib header
    paths[5].write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match=rf"cannot decode {paths[5]} on the GPU: bad zlib header"):
        list(DataLoader(ds, batch_size=3, num_workers=2, device="cuda"))


def test_file_reads_pass_the_gate_one_batch_at_a_time(tmp_path, monkeypatch):
    """Under the GIL the reads of concurrent get_batch calls are serialized (READERS = 1): many readers at once
    only hand the GIL back and forth. The rest of get_batch runs outside the gate."""
    import threading
    import time
    paths, _ = write_folder(tmp_path)
    ds = DevicePNGList(paths, list(range(len(paths))))
    inside, most = [0], [0]
    lock = threading.Lock()
    original = pd.read_file

    def counting_read(name):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.002)  # sleeping releases the GIL: without the gate the other threads would come in
        with lock:
            inside[0] -= 1
        return original(name)

    monkeypatch.setattr(pd, "read_file", counting_read)
    errors = []

    def work():
        try:
            ds.get_batch(np.arange(len(paths)))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors and most[0] == pd.READERS


def corrupt(path):
    """Flip the last byte of a PNG's zlib stream (its Adler-32): the file still parses, the decode fails."""
    data = bytearray(path.read_bytes())
    stream, _ = pd.png_stream(bytes(data), "x")
    data[bytes(data).index(stream) + len(stream) - 1] ^= 0xFF
    path.write_bytes(bytes(data))


def test_finish_on_device_defers_the_status_check(tmp_path):
    paths, imgs = write_folder(tmp_path)
    corrupt(paths[2])
    ds = DevicePNGList(paths, list(range(len(paths))))
    checks = []
    images, labels = ds.finish_on_device(list(ds.get_batch(np.array([0, 1]))), defer=checks.append)
    np.testing.assert_array_equal(images, np.stack([imgs[0], imgs[1]]))
    assert len(checks) == 1
    checks.pop()()  # a good batch: the check passes
    ds.finish_on_device(list(ds.get_batch(np.array([1, 2]))), defer=checks.append)  # no error yet
    with pytest.raises(RuntimeError, match=rf"cannot decode {paths[2]} on the GPU: Adler-32 checksum mismatch"):
        checks.pop()()


@pytest.mark.parametrize("prefetch", [1, 3])
def test_loader_with_a_fake_cupy_names_a_corrupt_file_one_batch_later(tmp_path, monkeypatch, prefetch):
    from test_loader import fake_cupy
    fake_cupy(monkeypatch)
    paths, imgs = write_folder(tmp_path, n=12, size=(3, 4))
    ds = DevicePNGList(paths, list(range(12)))
    got = [(x.numpy().copy(), y.numpy().copy()) for x, y in
           DataLoader(ds, batch_size=2, num_workers=2, device="cuda", prefetch_to_device=prefetch)]
    assert [y.tolist() for _, y in got] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]
    for x, y in got:
        np.testing.assert_array_equal(x, np.stack([imgs[k] for k in y]))
    corrupt(paths[7])  # in batch 3
    handed = []
    with pytest.raises(RuntimeError, match=rf"cannot decode {paths[7]} on the GPU: Adler-32"):
        for _, y in DataLoader(ds, batch_size=2, num_workers=2, device="cuda", prefetch_to_device=prefetch):
            handed.append(y.numpy().tolist())
    assert handed == [[0, 1], [2, 3], [4, 5], [6, 7]]  # raised when batch 4 was asked for
    corrupt(paths[7])  # repaired (the flip undone); now break the file of the last batch
    corrupt(paths[11])
    with pytest.raises(RuntimeError, match=rf"cannot decode {paths[11]}"):
        list(DataLoader(ds, batch_size=2, num_workers=3, device="cuda", prefetch_to_device=prefetch))
    it = iter(DataLoader(ds, batch_size=2, num_workers=1, device="cuda", prefetch_to_device=prefetch))
    for _ in range(6):
        next(it)
    with pytest.raises(RuntimeError, match=rf"cannot decode {paths[11]}"):
        it.close()  # the last batch handed out is checked when the iterator is closed


def _png_files(folder, images, levels) -> list:
    """Each image written as folder/k.png, compressed at zlib level levels[k % len(levels)]."""
    paths = []
    for k, img in enumerate(images):
        p = folder / f"{k}.png"
        p.write_bytes(png_bytes(img, levels[k % len(levels)]))
        paths.append(p)
    return paths


@pytest.mark.cuda
@pytest.mark.parametrize("prefetch", [1, 3])
def test_gpu_loader_lookahead_matches_the_cpu_loader_in_order(tmp_path, prefetch):
    paths = _png_files(tmp_path, real_looking(200, seed=3), levels=(1, 6, 9))
    ds = DevicePNGList(paths, list(range(len(paths))))
    cpu = [(x.numpy().copy(), y.numpy().copy())
           for x, y in DataLoader(ds, batch_size=16, shuffle=True, seed=5, num_workers=2)]
    for workers in (1, 3):
        n = 0
        for (x, y), (cx, cy) in zip(DataLoader(ds, batch_size=16, shuffle=True, seed=5, num_workers=workers,
                                               device="cuda", prefetch_to_device=prefetch), cpu):
            assert x.device == "cuda:0"
            np.testing.assert_array_equal(x.numpy(), cx)
            np.testing.assert_array_equal(y.numpy(), cy)
            n += 1
        assert n == len(cpu) == 13


@pytest.mark.cuda
@pytest.mark.parametrize("prefetch", [1, 3])
def test_gpu_loader_lookahead_names_a_corrupt_file_within_one_batch(tmp_path, prefetch):
    paths = _png_files(tmp_path, real_looking(48, seed=4), levels=(6,))
    corrupt(paths[21])  # batch 2 of 8-image batches
    for workers in (1, 3):
        handed = 0
        with pytest.raises(RuntimeError, match=rf"cannot decode {paths[21]} on the GPU"):
            for _ in DataLoader(DevicePNGList(paths, [0] * 48), batch_size=8, num_workers=workers, device="cuda",
                                prefetch_to_device=prefetch):
                handed += 1
        assert handed == 3  # batches 0, 1 and the broken batch 2; raised when batch 3 was asked for


@pytest.mark.cuda
def test_gpu_loader_names_a_zlib_bomb_and_writes_no_byte_past_the_image(tmp_path):
    """A stream of 2 MB of zeros compressed into a 32x32 image's buffer: the inflater stops at the image's size
    (run under compute-sanitizer's memcheck by benchmarks/gpu_sanitize.sh) and names the file."""
    paths = _png_files(tmp_path, real_looking(24, seed=5), levels=(6,))
    stream = zlib.compress(b"\0" * 2_000_000, 9)
    assert len(stream) <= pd.deflate_bound(pd.raw_size(32, 32, 3))
    paths[13].write_bytes(png_from_stream(32, 32, 2, stream))
    for workers in (0, 2):
        with pytest.raises(RuntimeError, match=rf"cannot decode {paths[13]} on the GPU: more image data than"):
            for _ in DataLoader(DevicePNGList(paths, [0] * 24), batch_size=8, num_workers=workers, device="cuda"):
                pass


@pytest.mark.cuda
def test_gpu_loader_names_a_file_that_a_worker_cannot_read(tmp_path):
    paths = _png_files(tmp_path, real_looking(24, seed=6), levels=(6,))
    ds = DevicePNGList(paths, [0] * 24)
    next(iter(DataLoader(ds, batch_size=8, device="cuda")))  # the first batch sets the dataset's shape
    paths[19].unlink()
    for workers, error in ((0, RuntimeError), (2, DataLoaderWorkerError)):
        with pytest.raises(error, match=rf"cannot read {paths[19]}: FileNotFoundError"):
            for _ in DataLoader(ds, batch_size=8, num_workers=workers, device="cuda"):
                pass
