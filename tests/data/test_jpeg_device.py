"""Tests for frost/data/jpeg_device.py: DeviceJPEGList's batches against the CPU pipeline (ImageList with
RandomResizedCrop and RandomHorizontalFlip: the same draws, Pillow's decode and resize), through the DataLoader
with a fake CuPy (only the labels are copied, the file bytes stay on the host until the batch's work is done) and
on the GPU (nvImageCodec where installed), and the limits and errors that name the file."""
import io
import sys
import types

import numpy as np
import pytest
from PIL import Image

import frost
from frost import dispatch
from frost.accel import jpeg_decode
from frost.backend import cpu
from frost.data import DataLoader, DeviceJPEGList, ImageList
from frost.data import jpeg_device as jd
from frost.data import png_device as pd


def write_jpegs(folder, n=10, classes=("cat", "dog"), seed=0):
    """n JPEGs of varied sizes (smooth content, as photos are) under folder/<class>/, and their paths and labels."""
    rng = np.random.default_rng(seed)
    paths, labels = [], []
    for k in range(n):
        h, w = int(rng.integers(20, 70)), int(rng.integers(20, 70))
        y, x = np.mgrid[0:h, 0:w]
        image = np.stack([(x * 255 // w), (y * 255 // h), (x + y) * 127 // (h + w)], -1).astype(np.uint8)
        image = np.clip(image.astype(int) + rng.integers(-20, 20, image.shape), 0, 255).astype(np.uint8)
        label = k % len(classes)
        (folder / classes[label]).mkdir(parents=True, exist_ok=True)
        path = folder / classes[label] / f"{k}.jpg"
        Image.fromarray(image).save(path, quality=90, progressive=bool(k % 3 == 0))
        paths.append(path)
        labels.append(label)
    return paths, labels


def bogus_huffman_table(data: bytes) -> bytes:
    """The file with its first Huffman table's code counts over-subscribed: every segment and marker in place (the
    worker's checks pass), but no decoder can build the table (libjpeg: "Bogus Huffman table definition")."""
    dht = data.index(b"\xff\xc4")
    return data[:dht + 5] + b"\xff" * 16 + data[dht + 21:]


def reference_batch(ds, indices, seed):
    """The CPU pipeline's batch under a generator: ImageList + the same transforms."""
    with cpu.use_generator(np.random.default_rng(seed)):
        return ds.for_device("cpu").get_batch(np.asarray(indices))


def test_a_batch_is_the_cpu_pipelines_batch_bit_for_bit_on_the_host(tmp_path):
    paths, labels = write_jpegs(tmp_path)
    ds = DeviceJPEGList(paths, labels, size=24, scale=(0.2, 1.0))
    indices = [3, 0, 7, 9, 1]
    with cpu.use_generator(np.random.default_rng(5)):
        fields = ds.get_batch(np.asarray(indices))
    images, got_labels = ds.finish_on_device(list(fields))   # NumPy labels: Pillow's decode and resize
    ref_images, ref_labels = reference_batch(ds, indices, 5)
    assert images.shape == (5, 24, 24, 3) and images.dtype == np.uint8
    np.testing.assert_array_equal(images, ref_images)
    np.testing.assert_array_equal(got_labels, ref_labels)
    packed, offsets, lengths, sizes, windows, on_gpu, flips, idx, _ = fields
    assert on_gpu.tolist() == [1] * 5
    for k, i in enumerate(indices):   # the bytes back to back, each file whole
        assert packed.reshape(-1)[offsets[k]:offsets[k] + lengths[k]].tobytes() == paths[i].read_bytes()
        with Image.open(paths[i]) as image:
            assert tuple(sizes[k]) == (image.height, image.width)
    assert packed.shape[0] == 5 and (packed.shape[1] & (packed.shape[1] - 1)) == 0   # a power of two
    assert packed.size < 2 * lengths.sum() + 5 * 64


def test_folder_and_cpu_loader(tmp_path):
    write_jpegs(tmp_path / "train", n=8)
    ds = DeviceJPEGList.folder(tmp_path / "train", size=(16, 12))
    assert ds.classes == ["cat", "dog"] and ds.class_to_idx == {"cat": 0, "dog": 1} and len(ds) == 8
    loader = DataLoader(ds, batch_size=3, shuffle=True, seed=4, num_workers=2)   # on the CPU: ImageList + Pillow
    assert type(loader.dataset) is ImageList
    batches = [(x.numpy(), y.numpy()) for x, y in loader]
    assert [b[0].shape for b in batches] == [(3, 16, 12, 3), (3, 16, 12, 3), (2, 16, 12, 3)]
    image, label = ds[2]   # one item: decoded on the CPU with the transforms
    assert image.shape == (16, 12, 3) and label == ds.targets[2]


class RecordingJPEGList(DeviceJPEGList):
    """Records what finish_on_device receives (in the main process: a worker process gets a pickled copy)."""
    seen: list = []

    def finish_on_device(self, fields, defer=None):
        RecordingJPEGList.seen.append([type(f).__name__ for f in fields])
        return super().finish_on_device(fields, defer=defer)


def fake_device(monkeypatch):
    from test_loader import FakeCupy
    from frost.backend import cuda
    fake = FakeCupy()
    monkeypatch.setattr(cuda, "cupy", lambda: fake)
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "_kept_streams", {})
    monkeypatch.setitem(sys.modules, "cupyx", types.SimpleNamespace(empty_pinned=np.empty))
    return fake


@pytest.mark.parametrize("workers,worker_type", [(1, "thread"), (2, "thread"), (2, "process")])
def test_loader_keeps_the_files_on_the_host_and_copies_only_the_labels(tmp_path, monkeypatch, workers, worker_type):
    paths, labels = write_jpegs(tmp_path, n=9)
    ds = DeviceJPEGList(paths, labels, size=20)
    reference = [(x.numpy().copy(), y.numpy().copy()) for x, y in
                 DataLoader(ds.for_device("cpu"), batch_size=4, shuffle=True, seed=3, num_workers=workers)]
    fake = fake_device(monkeypatch)
    ds = RecordingJPEGList(paths, labels, size=20)
    RecordingJPEGList.seen = seen = []
    got = [(x.numpy().copy(), y.numpy().copy()) for x, y in
           DataLoader(ds, batch_size=4, shuffle=True, seed=3, num_workers=workers, device="cuda",
                      worker_type=worker_type)]
    assert len(got) == len(reference) == 3
    for (x, y), (rx, ry) in zip(got, reference):   # the same draws as the CPU pipeline, the same bits
        np.testing.assert_array_equal(x, rx)
        np.testing.assert_array_equal(y, ry)
    assert all(kinds[:8] == ["ndarray"] * 8 and kinds[8] == "DeviceArray" for kinds in seen), seen
    assert fake.log.count("copy") == 3   # the labels, once a batch


def test_a_cut_file_is_refused_in_the_worker(tmp_path):
    # the GPU decoders fill in a cut scan where Pillow refuses the file: the worker checks for the end marker
    paths, labels = write_jpegs(tmp_path, n=3)
    data = paths[2].read_bytes()
    paths[2].write_bytes(data[:len(data) // 2])
    with pytest.raises(ValueError, match=rf"{paths[2]} is truncated \(no end-of-image marker after its scan\)"):
        DeviceJPEGList(paths, labels, size=16).get_batch(np.arange(3))
    with pytest.raises(ValueError, match=r"decoder must be one of \('hybrid', 'hardware', 'auto'\), got 'gpu'"):
        DeviceJPEGList(paths, labels, decoder="gpu")
    assert set(jd.DECODERS) == set(jpeg_decode.BACKENDS)


def test_a_corrupt_file_is_named(tmp_path, monkeypatch):
    paths, labels = write_jpegs(tmp_path, n=6)
    paths[4].write_bytes(bogus_huffman_table(paths[4].read_bytes()))
    ds = DeviceJPEGList(paths, labels, size=16)
    with pytest.raises(RuntimeError, match=rf"DeviceJPEGList: cannot decode {paths[4]}: OSError: "):
        with cpu.use_generator(np.random.default_rng(0)):
            ds.finish_on_device(list(ds.get_batch(np.arange(6))))
    fake_device(monkeypatch)
    got = []
    with pytest.raises(RuntimeError, match=rf"cannot decode {paths[4]}: OSError"):
        for x, _ in DataLoader(ds, batch_size=3, num_workers=2, device="cuda"):
            got.append(x.numpy().copy())
    # the batch before the broken one comes whole; the broken batch too, the error raised when the next is asked for
    assert len(got) == 2
    with cpu.use_generator(np.random.default_rng(0)):
        first = ds.for_device("cpu").get_batch(np.arange(3))[0]
    assert got[0].shape == first.shape


def test_other_formats_in_the_folder_are_decoded_by_pillow(tmp_path, monkeypatch):
    # ImageNet's training set holds a PNG named .JPEG: the worker reads its size with Pillow and marks it for the host
    paths, labels = write_jpegs(tmp_path, n=4)
    png = tmp_path / "x.jpg"
    Image.fromarray(np.arange(8 * 9 * 3, dtype=np.uint8).reshape(8, 9, 3)).save(png, format="PNG")
    ds = DeviceJPEGList([*paths, png], [*labels, 0], size=8)
    with cpu.use_generator(np.random.default_rng(2)):
        fields = ds.get_batch(np.arange(5))
    assert fields[5].tolist() == [1, 1, 1, 1, 0] and tuple(fields[3][4]) == (8, 9)
    images, _ = ds.finish_on_device(list(fields))
    np.testing.assert_array_equal(images, reference_batch(ds, range(5), 2)[0])
    junk = tmp_path / "junk.jpg"
    junk.write_bytes(b"not an image at all")
    with pytest.raises(ValueError, match=rf"{junk} is neither a JPEG file nor an image Pillow reads"):
        DeviceJPEGList([junk], [0]).get_batch(np.arange(1))


def test_a_small_file_claiming_a_huge_image_is_refused_before_any_buffer(tmp_path, monkeypatch):
    paths, labels = write_jpegs(tmp_path, n=3)
    data = bytearray(paths[1].read_bytes())
    sof = next(i for i in range(len(data) - 1) if data[i] == 0xFF and data[i + 1] in (0xC0, 0xC2))
    data[sof + 5:sof + 9] = b"\xea\x60\xea\x60"   # 60000 x 60000
    paths[1].write_bytes(bytes(data))
    ds = DeviceJPEGList(paths, labels, size=8)
    with pytest.raises(ValueError, match=rf"{paths[1]} claims 60000 x 60000 pixels, more than the decoder's limit"):
        ds.get_batch(np.arange(3))
    with monkeypatch.context() as patch:
        patch.setattr(pd, "MAX_PIXELS", 10)   # the limit the message names is the one applied
        with pytest.raises(ValueError, match=rf"{paths[0]} claims \d+ x \d+ pixels, more than the decoder's limit "
                                             rf"of 10"):
            ds.get_batch(np.arange(1))
    monkeypatch.setattr(jd, "MAX_BATCH_PIXELS", 3 * 70 * 70 * 2)   # two of the largest images at most
    ds = DeviceJPEGList(*write_jpegs(tmp_path / "more", n=8), size=8)
    with pytest.raises(ValueError, match=r"a batch of 8 images decodes to \d+ bytes, more than .*MAX_BATCH_PIXELS "
                                         r".* the largest is .*\.jpg: use a smaller batch"):
        ds.get_batch(np.arange(8))


def test_the_layers_decoder_takes_cupy_targets_only(tmp_path):
    jpeg = (write_jpegs(tmp_path, n=1)[0][0]).read_bytes()
    host = jd.decode_jpeg_batch(np.zeros(1), [jpeg, b"junk"])
    with Image.open(io.BytesIO(jpeg)) as image:
        np.testing.assert_array_equal(host[0], np.asarray(image.convert("RGB")))
    assert host[1] is None
    assert dispatch.lookup("decode_jpeg", np.zeros(1), [jpeg]) is None   # NumPy: the reference
    with pytest.raises(ValueError, match=r"decode_jpeg_batch: decoder must be one of .*, got 'gpu'"):
        jd.decode_jpeg_batch(np.zeros(1), [jpeg], decoder="gpu")   # on every path, not only the GPU's


@pytest.mark.cuda
@pytest.mark.parametrize("workers", [0, 3])
def test_gpu_loader_against_the_cpu_pipeline(tmp_path, workers):
    """Labels and windows exact; pixels within the GPU decoder's rounding of libjpeg's (exact without it)."""
    paths, labels = write_jpegs(tmp_path, n=40, seed=1)
    ds = DeviceJPEGList(paths, labels, size=32)
    cpu_batches = [(x.numpy(), y.numpy()) for x, y in
                   DataLoader(ds.for_device("cpu"), batch_size=16, shuffle=True, seed=7, num_workers=workers)]
    gpu_batches = [(x, y) for x, y in DataLoader(ds, batch_size=16, shuffle=True, seed=7, num_workers=workers,
                                                 device="cuda")]
    exact = jpeg_decode.nvimgcodec() is None
    assert len(gpu_batches) == len(cpu_batches) == 3
    for (x, y), (rx, ry) in zip(gpu_batches, cpu_batches):
        assert x.device == "cuda:0" and x.dtype == frost.uint8 and x.shape == rx.shape
        np.testing.assert_array_equal(y.numpy(), ry)
        diff = np.abs(x.numpy().astype(int) - rx.astype(int))
        if exact:
            assert diff.max() == 0
        else:
            assert diff.mean() < 1.5 and np.percentile(diff, 99) <= 8, (diff.mean(), diff.max())


@pytest.mark.cuda
def test_gpu_loader_names_a_corrupt_file(tmp_path):
    paths, labels = write_jpegs(tmp_path, n=24, seed=2)
    paths[13].write_bytes(bogus_huffman_table(paths[13].read_bytes()))
    for workers in (0, 2):
        with pytest.raises(RuntimeError, match=rf"DeviceJPEGList: cannot decode {paths[13]}: "):
            for _ in DataLoader(DeviceJPEGList(paths, labels, size=16), batch_size=8, num_workers=workers,
                                device="cuda"):
                pass


def test_a_ctrl_c_while_an_epoch_ends_still_releases_the_worker_processes(tmp_path, monkeypatch):
    from frost.data import loader as loader_module
    paths, labels = write_jpegs(tmp_path, n=8)
    fake_device(monkeypatch)
    it = iter(DataLoader(DeviceJPEGList(paths, labels, size=8), batch_size=2, num_workers=2, worker_type="process",
                         device="cuda"))
    next(it)
    run = it._run
    monkeypatch.setattr(run.lookahead, "drain", lambda: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        run.shutdown()
    assert run.pool.closed   # the workers were told to go although drain was interrupted
    assert isinstance(run, loader_module._ProcessRun)
    run.lookahead.drain = lambda: None   # the iterator's own end drains again
    it.close()


def test_every_broken_file_of_a_batch_is_counted(tmp_path):
    paths, labels = write_jpegs(tmp_path, n=5)
    for k in (1, 3):
        paths[k].write_bytes(bogus_huffman_table(paths[k].read_bytes()))
    ds = DeviceJPEGList(paths, labels, size=8)
    with cpu.use_generator(np.random.default_rng(0)):
        fields = ds.get_batch(np.arange(5))
    with pytest.raises(RuntimeError, match=rf"cannot decode {paths[1]}: .*\(and 1 more file\(s\) of the batch: "
                                           rf"{paths[3]}\)"):
        ds.finish_on_device(list(fields))


def test_a_file_pillow_refuses_on_the_host_is_decoded_once(tmp_path, monkeypatch):
    """A PNG named .jpg (read on the host) whose compressed pixels are broken: Pillow's refusal names the file, and
    Pillow was not asked a second time for the reason."""
    paths, labels = write_jpegs(tmp_path, n=2)
    png = tmp_path / "cut.jpg"
    buffer = io.BytesIO()
    Image.fromarray(np.arange(8 * 9 * 3, dtype=np.uint8).reshape(8, 9, 3)).save(buffer, format="PNG")
    data = buffer.getvalue()
    at = data.index(b"IDAT") + 6   # the header whole, the zlib stream's first bytes flipped
    png.write_bytes(data[:at] + bytes(b ^ 0xFF for b in data[at:at + 14]) + data[at + 14:])
    ds = DeviceJPEGList([*paths, png], [*labels, 0], size=8)
    with cpu.use_generator(np.random.default_rng(0)):
        fields = ds.get_batch(np.arange(3))
    calls = []
    decode = jd.decode_with_pillow
    monkeypatch.setattr(jd, "decode_with_pillow", lambda data: calls.append(len(data)) or decode(data))
    with pytest.raises(RuntimeError, match=rf"cannot decode {png}: "):
        ds.finish_on_device(list(fields))
    assert calls.count(len(data)) == 1
