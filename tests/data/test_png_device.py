"""Tests for frost/data/png_device.py: DevicePNGList through the DataLoader (the host's reference decode on the
CPU, the acceleration layer's kernels on the GPU), the reference decode against Pillow and zlib, and the limits on
what a file may ask for."""
import tracemalloc
import zlib

import numpy as np
import pytest
from PIL import Image

import frost
from frost import dispatch
from frost.accel import png_inflate
from frost.data import DataLoader, DataLoaderWorkerError, DevicePNGList, ImageList, decode_image
from frost.data import png_device as pd
from png_streams import as_rgb, png_bytes, png_from_stream, random_image, real_looking, smooth_image


def test_deflate_bound_holds_stored_streams():
    for raw in (1, 14, 3104, 65535, 65536, 200_000):
        data = np.random.default_rng(raw).integers(0, 256, raw, dtype=np.uint8).tobytes()
        assert len(zlib.compress(data, 0)) <= pd.deflate_bound(raw)
        assert len(zlib.compress(data, 9)) <= pd.deflate_bound(raw)
        assert pd.deflate_bound(raw) % 16 == 0


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
    images, labels = ds.finish_on_device(list(fields))  # NumPy arrays: the host decodes
    np.testing.assert_array_equal(images, np.stack([imgs[4], imgs[1], imgs[2]]))
    # flip a byte of the zlib data (PNG chunk CRCs are not checked, as on the CPU path)
    data = bytearray(paths[2].read_bytes())
    stream, _ = pd.png_stream(bytes(data), "x")
    at = bytes(data).index(stream) + len(stream) - 2
    data[at] ^= 0xFF
    paths[2].write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match=rf"cannot decode {paths[2]} on the GPU: Adler-32"):
        ds.finish_on_device(list(ds.get_batch(np.array([1, 2]))))


def test_cuda_arrays_are_decoded_by_the_layer_and_the_rest_on_the_host(tmp_path, monkeypatch):
    """decode_png_batch asks frost.dispatch: the acceleration layer's kernels answer for CUDA arrays (here NumPy
    arrays taken for CUDA ones, which the layer's launcher then simulates); without a fast path, the host decodes."""
    found, lookup = [], dispatch.lookup
    monkeypatch.setattr(dispatch, "lookup", lambda *args, **kw: found.append(fast := lookup(*args, **kw)) or fast)
    paths, imgs = write_folder(tmp_path, n=3)
    ds = DevicePNGList(paths, [0, 1, 2])
    for device, want in (("cpu", None), ("cuda", png_inflate.decode_batch)):
        found.clear()
        monkeypatch.setattr(dispatch, "device_of", lambda array: device)
        images, _ = ds.finish_on_device(list(ds.get_batch(np.array([2, 0]))))
        np.testing.assert_array_equal(images, np.stack([imgs[2], imgs[0]]))
        assert found == [want]
    with pytest.raises(ValueError, match="decode_png_batch: 2 channels; 1 \\(grey\\), 3 \\(RGB\\) or 4"):
        pd.decode_png_batch(np.zeros((1, 8), np.uint8), np.ones(1, np.int32), 2, 2, 2)


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


def test_a_batch_of_small_files_claiming_large_images_is_refused_before_its_buffer(tmp_path, monkeypatch):
    bomb = tmp_path / "wide.png"
    bomb.write_bytes(png_from_stream(9459, 9459, 6, zlib.compress(b"\0" * 97, 9)))   # under MAX_PIXELS
    monkeypatch.setattr(pd, "_read", lambda name: bomb.read_bytes())
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=rf"a batch of 256 images of 9459x9459 \({bomb} sets the size\) needs "
                                             r"\d+ bytes of stream buffer, more than .*MAX_BATCH_BYTES"):
            DevicePNGList([bomb] * 256, [0] * 256).get_batch(np.arange(256))
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
    on the copy stream after the copies (here by the host reference decode), and a corrupt file is named."""
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
