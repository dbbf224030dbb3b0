"""Tests for frost/data/cifar.py: every layout, the restricted unpickler, the mocked download, the real parts."""
import ast
import hashlib
import http.server
import importlib.util
import io
import os
import pickle
import re
import struct
import tarfile
import threading
import tracemalloc
import urllib.error
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import frost.io
from frost.data import CIFAR10
from frost.data import cifar

SHARED = Path(__file__).parents[2] / ".." / "shared" / "data" / "cifar10"
PER_BATCH = 3  # images per fake batch file: train has 5 * 3, test 3


def fake_split(seed):
    rng = np.random.default_rng(seed)
    n = PER_BATCH * 5
    return (rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, n)), \
           (rng.integers(0, 256, (PER_BATCH, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, PER_BATCH))


TRAIN, TEST = fake_split(0)


def batches():
    """(name, images HWC, labels) of the five train batches and the test batch."""
    parts = [slice(k * PER_BATCH, (k + 1) * PER_BATCH) for k in range(5)]
    out = [(f"data_batch_{k + 1}", TRAIN[0][part], TRAIN[1][part]) for k, part in enumerate(parts)]
    return out + [("test_batch", TEST[0], TEST[1])]


def binary_bytes(images, labels):
    chw = images.transpose(0, 3, 1, 2).reshape(len(images), -1)
    return np.concatenate([labels.astype(np.uint8)[:, None], chw], axis=1).tobytes()


def python_bytes(images, labels, protocol=2):
    batch = {b"batch_label": b"fake", b"labels": [int(v) for v in labels],
             b"data": images.transpose(0, 3, 1, 2).reshape(len(images), -1).copy(),
             b"filenames": [b"x.png"] * len(labels)}
    return pickle.dumps(batch, protocol=protocol)


def write_tar(path, folder, files):
    with tarfile.open(path, "w:gz") as tar:
        for name, raw in files:
            info = tarfile.TarInfo(f"{folder}/{name}")
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))


def check(root, layout):
    train, test = CIFAR10(root), CIFAR10(root, train=False)
    assert train.layout == layout
    assert train.data.shape == (15, 32, 32, 3) and train.data.dtype == np.uint8
    np.testing.assert_array_equal(train.data, TRAIN[0])
    np.testing.assert_array_equal(train.targets, TRAIN[1])
    assert train.targets.dtype == np.int64
    np.testing.assert_array_equal(test.data, TEST[0])
    np.testing.assert_array_equal(test.targets, TEST[1])
    image, label = train[4]
    np.testing.assert_array_equal(image, TRAIN[0][4])
    assert label == TRAIN[1][4]
    assert len(train) == 15 and len(test) == 3


def test_binary_folder(tmp_path):
    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    for name, x, y in batches():
        (folder / f"{name}.bin").write_bytes(binary_bytes(x, y))
    check(tmp_path, "binary_dir")
    check(folder, "binary_dir")  # root may be the batches folder itself


def test_binary_archive(tmp_path):
    write_tar(tmp_path / "cifar-10-binary.tar.gz", "cifar-10-batches-bin",
              [(f"{n}.bin", binary_bytes(x, y)) for n, x, y in batches()])
    check(tmp_path, "binary_tar")


def test_binary_truncated_record_names_the_file(tmp_path):
    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    for name, x, y in batches():
        (folder / f"{name}.bin").write_bytes(binary_bytes(x, y)[:-5])
    with pytest.raises(ValueError, match=r"data_batch_1\.bin has 9214 bytes, not a whole number of 3073-byte"):
        CIFAR10(tmp_path)


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_python_folder(tmp_path, protocol):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name, x, y in batches():
        (folder / name).write_bytes(python_bytes(x, y, protocol))
    check(tmp_path, "python_dir")


def test_python_archive(tmp_path):
    write_tar(tmp_path / "cifar-10-python.tar.gz", "cifar-10-batches-py",
              [(n, python_bytes(x, y)) for n, x, y in batches()])
    check(tmp_path, "python_tar")


def write_python_folder(root, replace=None):
    folder = root / "cifar-10-batches-py"
    folder.mkdir()
    for name, x, y in batches():
        (folder / name).write_bytes(python_bytes(x, y))
    for name, raw in (replace or {}).items():
        (folder / name).write_bytes(raw)


@pytest.mark.parametrize("raw,match", [
    (python_bytes(TRAIN[0][:3], TRAIN[1][:2]), r"data_batch_2 has 'data' of shape \(3, 3072\) and 'labels' of shape "
                                                r"\(2,\); expected \(N, 3072\) and \(N,\)"),
    (pickle.dumps({b"data": np.zeros((2, 3000), np.uint8), b"labels": [1, 2]}, protocol=2),
     r"data_batch_2 has 'data' of shape \(2, 3000\)"),
    (b"\x00garbage", r"data_batch_2 is not a CIFAR-10 python batch file \(UnpicklingError"),
    (pickle.dumps({b"data": np.array([[1]], dtype=object), b"labels": [1]}, protocol=2),
     r"data_batch_2 is not a CIFAR-10 python batch file \(UnpicklingError: refused: the dtype 'O"),
    (python_bytes(TRAIN[0][:3], TRAIN[1][:3])[:100], r"data_batch_2 is not a CIFAR-10 python batch file \(\w+Error")],
    ids=["labels_short", "rows_short", "garbage", "object_dtype", "truncated"])
def test_a_damaged_python_batch_is_named(tmp_path, raw, match):
    """Images and labels out of step would shift every later label: refused, naming the file."""
    write_python_folder(tmp_path, {"data_batch_2": raw})
    with pytest.raises(ValueError, match=match):
        CIFAR10(tmp_path)


def test_a_truncated_archive_is_named(tmp_path):
    write_tar(tmp_path / "cifar-10-binary.tar.gz", "cifar-10-batches-bin",
              [(f"{n}.bin", binary_bytes(x, y)) for n, x, y in batches()])
    archive = tmp_path / "cifar-10-binary.tar.gz"
    archive.write_bytes(archive.read_bytes()[:-2000])
    with pytest.raises(ValueError, match=r"cifar-10-binary\.tar\.gz is not a readable \.tar\.gz \(\w+"):
        CIFAR10(tmp_path)


def test_npz_layout_without_train_parts_says_so(tmp_path):
    np.savez(tmp_path / "test_x.npz", x=TEST[0])
    np.save(tmp_path / "test_y.npy", TEST[1].astype(np.uint8))
    assert len(CIFAR10(tmp_path, train=False)) == PER_BATCH
    with pytest.raises(FileNotFoundError, match=r"has no train_x_\*\.npz parts"):
        CIFAR10(tmp_path)


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_restricted_unpickler_refuses_code_and_names_the_file(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name, x, y in batches():
        (folder / name).write_bytes(python_bytes(x, y))
    (folder / "data_batch_3").write_bytes(pickle.dumps({b"data": Evil(), b"labels": [1]}, protocol=2))
    with pytest.raises(pickle.UnpicklingError, match=r"data_batch_3 asks to load (posix|nt|os)\.system; refused"):
        CIFAR10(tmp_path)


def test_npz_parts(tmp_path):
    for k, s in enumerate("abcde"):
        np.savez(tmp_path / f"train_x_{s}.npz", x=TRAIN[0][k * PER_BATCH:(k + 1) * PER_BATCH])
    np.save(tmp_path / "train_y.npy", TRAIN[1].astype(np.uint8))
    np.savez(tmp_path / "test_x.npz", x=TEST[0])
    np.save(tmp_path / "test_y.npy", TEST[1].astype(np.uint8))
    check(tmp_path, "npz")


def write_png_layout(root):
    for split, (x, y) in (("train", TRAIN), ("test", TEST)):
        (root / split).mkdir()
        for i in range(len(x)):
            Image.fromarray(x[i]).save(root / split / f"{i}_{cifar.CLASSES[y[i]]}.png")


def test_png_folders(tmp_path):
    write_png_layout(tmp_path)
    check(tmp_path, "png")


def test_png_folder_corrupt_file_is_named(tmp_path):
    write_png_layout(tmp_path)
    (tmp_path / "train" / f"7_{cifar.CLASSES[TRAIN[1][7]]}.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    with pytest.raises(RuntimeError, match=r"cannot decode .*train[/\\]7_\w+\.png"):
        CIFAR10(tmp_path)


def test_missing_data_says_what_it_looked_for(tmp_path):
    with pytest.raises(FileNotFoundError, match="no CIFAR-10 files .*cifar-10-binary.tar.gz.*download=True"):
        CIFAR10(tmp_path)


# ---------------------------------------------------------------- download (network mocked)
class FakeResponse(io.BytesIO):
    @property
    def headers(self) -> dict:
        return {"Content-Length": str(len(self.getbuffer()))}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def fake_archive(tmp_path):
    path = tmp_path / "built.tar.gz"
    write_tar(path, "cifar-10-batches-bin", [(f"{n}.bin", binary_bytes(x, y)) for n, x, y in batches()])
    return path.read_bytes()


def test_download_verifies_md5_then_reads(tmp_path, monkeypatch):
    raw = fake_archive(tmp_path)
    urls = []
    monkeypatch.setattr(cifar.urllib.request, "urlopen", lambda url, timeout: urls.append(url) or FakeResponse(raw))
    monkeypatch.setattr(cifar, "BINARY_MD5", hashlib.md5(raw).hexdigest())
    root = tmp_path / "data"
    check_root = CIFAR10(root, download=True)
    assert urls == ["https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"]
    assert (root / "cifar-10-binary.tar.gz").is_file()
    np.testing.assert_array_equal(check_root.data, TRAIN[0])
    CIFAR10(root, download=True)  # present now: no second download
    assert len(urls) == 1


def test_download_with_wrong_md5_is_refused_and_deleted(tmp_path, monkeypatch):
    raw = fake_archive(tmp_path)
    monkeypatch.setattr(cifar.urllib.request, "urlopen", lambda url, timeout: FakeResponse(raw))
    assert cifar.BINARY_MD5 == "c32a1d4ab5d03f1284b67883e8d87530"
    with pytest.raises(RuntimeError, match=r"MD5 [0-9a-f]{32}, expected c32a1d4ab5d03f1284b67883e8d87530"):
        CIFAR10(tmp_path / "data", download=True)
    assert list((tmp_path / "data").iterdir()) == []


def test_download_offline_gives_a_clear_message(tmp_path, monkeypatch):
    def offline(url, timeout):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(cifar.urllib.request, "urlopen", offline)
    with pytest.raises(RuntimeError, match="could not download .*are you offline"):
        CIFAR10(tmp_path, download=True)


# ---------------------------------------------------------------- the real shared parts
@pytest.mark.skipif(not (SHARED / "train_x_a.npz").is_file(), reason="shared CIFAR-10 parts not present")
def test_shared_npz_parts_match_their_readme():
    train, test = CIFAR10(SHARED), CIFAR10(SHARED, train=False)
    assert train.data.shape == (50000, 32, 32, 3) and test.data.shape == (10000, 32, 32, 3)
    assert train.targets[:10].tolist() == [6, 9, 9, 4, 1, 1, 2, 7, 8, 3]
    assert test.targets[:10].tolist() == [3, 8, 8, 0, 6, 6, 1, 6, 3, 1]
    assert tuple(train.data[0, 0, 0]) == (59, 62, 63)
    assert tuple(test.data[0, 0, 0]) == (158, 112, 49)
    assert np.bincount(train.targets[:10000]).tolist() == [1005, 974, 1032, 1016, 999, 937, 1030, 1001, 1025, 981]
    assert hashlib.sha256(test.data.tobytes()).hexdigest() == \
        "f9b1e2130bab680db56eb06d886f7f1ad0f1183907ceff4659d1735c890f5b04"


def test_get_batch_feeds_the_loader_with_and_without_transform(tmp_path):
    from frost.data import DataLoader
    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    for name, x, y in batches():
        (folder / f"{name}.bin").write_bytes(binary_bytes(x, y))
    for transform in (None, lambda img: img[::-1, :, :1]):
        ds = CIFAR10(tmp_path, transform=transform)
        per_item = [ds[i] for i in range(len(ds))]
        for w in (0, 2):
            got = [(x.numpy().copy(), y.numpy().copy())
                   for x, y in DataLoader(ds, batch_size=4, shuffle=True, seed=3, num_workers=w)]
            order = DataLoader(ds, batch_size=4, shuffle=True, seed=3).batch_indices(0)
            for (x, y), idx in zip(got, order):
                np.testing.assert_array_equal(x, np.stack([per_item[i][0] for i in idx]))
                np.testing.assert_array_equal(y, [per_item[i][1] for i in idx])


# ---------------------------------------------------------------- paths as a user types them
def test_root_expands_home_and_environment_variables(tmp_path, monkeypatch):
    folder = tmp_path / "data" / "cifar-10-batches-bin"
    folder.mkdir(parents=True)
    for name, x, y in batches():
        (folder / f"{name}.bin").write_bytes(binary_bytes(x, y))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("FROST_TEST_DATA", "data")
    for typed in ("~/data", "~/$FROST_TEST_DATA", "${HOME}/data"):
        ds = CIFAR10(typed)
        assert ds.root == tmp_path / "data", typed
        np.testing.assert_array_equal(ds.data, TRAIN[0])


# ---------------------------------------------------------------- the sample inside the package
# the SHA-256 of the sample's images (C-order uint8 bytes), as benchmarks/cifar10_sample.py printed them
SAMPLE_TRAIN_SHA256 = "4e5ac895e46a9b569a45d0220f845bd1c317a6bbb96ae905af26bf5b6ca10a16"
SAMPLE_TEST_SHA256 = "b130bd64837d7ea45dc3fbd2d32f1f70eda695648ee6ceacee1ee0a41dc4202a"


def sample_maker():
    """benchmarks/cifar10_sample.py as a module (the script that made the sample)."""
    return load_script("cifar10_sample")


def load_script(name: str):
    path = Path(__file__).parents[2] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_sample_is_small_stratified_and_pickle_free():
    assert cifar.SAMPLE_FILE.stat().st_size < 6_000_000
    with np.load(cifar.SAMPLE_FILE, allow_pickle=False) as z:  # every array loads without pickle
        arrays = {k: z[k] for k in z.files}
    assert "benchmarks/cifar10_sample.py" in str(arrays["about"]) and "not for results" in str(arrays["about"])
    for train, n, per_class, digest in ((True, 2000, 200, SAMPLE_TRAIN_SHA256), (False, 500, 50, SAMPLE_TEST_SHA256)):
        images, labels = cifar.load_sample(train)
        assert images.shape == (n, 32, 32, 3) and images.dtype == np.uint8 and labels.dtype == np.int64
        assert np.bincount(labels).tolist() == [per_class] * 10
        assert hashlib.sha256(images.tobytes()).hexdigest() == digest
        indices = arrays["train_indices" if train else "test_indices"]
        assert (np.diff(indices) > 0).all()  # the official order, no repeats
    # real photographs, not noise: neighbouring pixels are close (noise differs by ~85 on average)
    assert np.abs(np.diff(images.astype(np.int16), axis=2)).mean() < 20


def test_npz_headers_are_parsed_one_at_a_time(tmp_path, monkeypatch):
    # CPython 3.11's parser fails when two threads parse at once; the parts load in parallel
    literal_eval, held = ast.literal_eval, []   # NumPy's header parser

    def checked(text):
        held.append(frost.io.PARSE_LOCK.locked())
        return literal_eval(text)
    monkeypatch.setattr(ast, "literal_eval", checked)
    for k, s in enumerate("abc"):
        np.savez(tmp_path / f"train_x_{s}.npz", x=TRAIN[0][k * 2:(k + 1) * 2])
    np.save(tmp_path / "train_y.npy", TRAIN[1][:6].astype(np.uint8))
    x, y = cifar._read_npz(tmp_path, True)
    np.testing.assert_array_equal(x, TRAIN[0][:6])
    assert held == [True] * 4   # the three parts and the labels
    np.savez(tmp_path / "test_x.npz", x=TRAIN[0][:2])
    np.save(tmp_path / "test_y.npy", TRAIN[1][:2])
    cifar._read_npz(tmp_path, False)
    assert held == [True] * 6


def test_the_sample_as_a_dataset():
    train, test = CIFAR10.sample(), CIFAR10.sample(train=False, transform=lambda x: x[::2, ::2])
    assert (len(train), len(test)) == (2000, 500) and train.layout == "sample"
    image, label = test[3]
    assert image.shape == (16, 16, 3) and label == test.targets[3]
    assert repr(train) == f"CIFAR10(train, 2000 images, from sample in {cifar.SAMPLE_FILE})"
    np.testing.assert_array_equal(train.data, cifar.load_sample(True)[0])


@pytest.mark.skipif(not (SHARED / "train_x_a.npz").is_file(), reason="shared CIFAR-10 parts not present")
def test_the_sample_is_the_first_images_of_each_class_of_the_real_data():
    with np.load(cifar.SAMPLE_FILE, allow_pickle=False) as z:
        train_indices, test_indices = z["train_indices"], z["test_indices"]
    for train, indices, per_class in ((True, train_indices, 200), (False, test_indices, 50)):
        full = CIFAR10(SHARED, train=train)
        images, labels = cifar.load_sample(train)
        np.testing.assert_array_equal(images, full.data[indices])
        np.testing.assert_array_equal(labels, full.targets[indices])
        expected = np.sort(np.concatenate([np.flatnonzero(full.targets == k)[:per_class] for k in range(10)]))
        np.testing.assert_array_equal(indices, expected)


def test_the_sample_maker_round_trips_through_load_sample(tmp_path):
    # random images use every byte value: the residuals wrap around modulo 256 and must add back up exactly
    maker = sample_maker()
    rng = np.random.default_rng(0)
    train = rng.integers(0, 256, (60, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, 60)
    test = rng.integers(0, 256, (40, 32, 32, 3), dtype=np.uint8), rng.permutation(np.arange(40) % 10)
    arrays = maker.sample_arrays(train, test, train_per_class=2, test_per_class=3)
    np.savez_compressed(tmp_path / "sample.npz", **arrays)
    for (images, labels), per_class, is_train in ((train, 2, True), (test, 3, False)):
        chosen = [i for i in range(len(labels)) if (labels[:i] == labels[i]).sum() < per_class]  # first k per class
        got_images, got_labels = cifar.load_sample(is_train, tmp_path / "sample.npz")
        np.testing.assert_array_equal(got_images, images[chosen])
        np.testing.assert_array_equal(got_labels, labels[chosen])
        np.testing.assert_array_equal(arrays["train_indices" if is_train else "test_indices"], chosen)
    assert not np.array_equal(arrays["train_images_residuals"], train[0][arrays["train_indices"]])  # stored filtered
    with pytest.raises(SystemExit, match="class 3 has 2 images, fewer than 5"):
        maker.first_per_class(np.array([k for k in range(10) for _ in range(2 if k == 3 else 5)]), 5)


def test_a_damaged_sample_is_named(tmp_path):
    bad = tmp_path / "cifar10_sample.npz"
    bad.write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(RuntimeError, match=f"sample {bad} is missing or damaged"):
        cifar.load_sample(True, bad)
    with pytest.raises(RuntimeError, match="missing or damaged"):
        cifar.load_sample(True, tmp_path / "absent.npz")


def test_download_gives_up_within_its_timeout(tmp_path, monkeypatch):
    timeouts = []

    def offline(url, timeout):
        timeouts.append(timeout)
        raise urllib.error.URLError("timed out")

    monkeypatch.setattr(cifar.urllib.request, "urlopen", offline)
    with pytest.raises(RuntimeError, match="could not download"):
        cifar.download_binary(tmp_path, timeout=3)
    assert timeouts == [3] and list(tmp_path.iterdir()) == []  # no partial file left


# ---------------------------------------------------------------- hostile archives and batch files
def test_an_archive_member_larger_than_a_batch_is_refused_before_it_is_read(tmp_path):
    """One record more than an official batch, zeros (so the .tar.gz is tiny): refused from the member's header,
    without inflating it (the code before read it whole and returned it)."""
    size = cifar._MAX_BINARY_BATCH + cifar._RECORD
    with tarfile.open(tmp_path / "cifar-10-binary.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo("cifar-10-batches-bin/data_batch_1.bin")
        info.size = size
        tar.addfile(info, io.BytesIO(bytes(size)))
    assert (tmp_path / "cifar-10-binary.tar.gz").stat().st_size < 100_000
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=f"cifar-10-binary.tar.gz has a member cifar-10-batches-bin/"
                                             f"data_batch_1.bin of {size} bytes, more than any file of a CIFAR-10"):
            CIFAR10(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20


def test_an_archive_of_many_members_is_refused(tmp_path):
    files = [(f"{n}.bin", binary_bytes(x, y)) for n, x, y in batches()] + [(f"extra{i}", b"") for i in range(70)]
    write_tar(tmp_path / "cifar-10-binary.tar.gz", "cifar-10-batches-bin", files)
    with pytest.raises(ValueError, match="cifar-10-binary.tar.gz has more than 64 members"):
        CIFAR10(tmp_path)


def test_an_archive_member_that_is_a_link_is_refused(tmp_path):
    with tarfile.open(tmp_path / "cifar-10-binary.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo("cifar-10-batches-bin/data_batch_1.bin")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(info)
    with pytest.raises(ValueError, match="the member cifar-10-batches-bin/data_batch_1.bin is not a regular file"):
        CIFAR10(tmp_path)


def test_a_batch_file_larger_than_a_batch_is_refused_before_it_is_read(tmp_path, monkeypatch):
    write_python_folder(tmp_path)
    monkeypatch.setattr(cifar, "_MAX_PYTHON_BATCH", 1000)
    with pytest.raises(ValueError, match=r"data_batch_1 has \d+ bytes, more than a CIFAR-10 batch file \(1000\)"):
        CIFAR10(tmp_path)


def python2_bytes(images, labels) -> bytes:
    """A batch as the official release's Python 2 cPickle wrote it (protocol 2, the pixels as a BINSTRING,
    numpy.core.multiarray._reconstruct), assembled opcode by opcode."""
    def string(b: bytes) -> bytes:
        return b"U" + bytes([len(b)]) + b if len(b) < 256 else b"T" + struct.pack("<i", len(b)) + b

    def small(n: int) -> bytes:
        return b"K" + bytes([n]) if n < 256 else b"M" + struct.pack("<H", n)

    dtype = (b"cnumpy\ndtype\n" + string(b"u1") + small(0) + small(1) + b"\x87R"
             + b"(" + small(3) + string(b"|") + b"NNN" + b"J\xff\xff\xff\xff" * 2 + small(0) + b"tb")
    pixels = images.transpose(0, 3, 1, 2).reshape(len(images), -1).tobytes()
    array = (b"cnumpy.core.multiarray\n_reconstruct\n" + b"cnumpy\nndarray\n" + small(0) + b"\x85" + string(b"b")
             + b"\x87R" + b"(" + small(1) + small(len(images)) + small(3072) + b"\x86" + dtype + b"\x89"
             + string(pixels) + b"tb")
    label_list = b"](" + b"".join(small(int(v)) for v in labels) + b"e"
    return (b"\x80\x02}(" + string(b"batch_label") + string(b"fake") + string(b"data") + array
            + string(b"labels") + label_list + b"u.")


def test_python_2_batches_as_the_official_release_wrote_them(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name, x, y in batches():
        (folder / name).write_bytes(python2_bytes(x, y))
    check(tmp_path, "python_dir")


EXPOSED = [("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
           ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"), ("numpy", "ndarray"),
           ("numpy", "dtype"), ("_codecs", "encode"), ("builtins", "bytes"), ("__builtin__", "bytearray")]


def mutating_pickle(module: str, name: str, state: bytes) -> bytes:
    """GLOBAL module.name, then BUILD on that very object with `state` (pickle opcodes)."""
    return b"\x80\x02c" + f"{module}\n{name}\n".encode() + state + b"b."


SLOTSTATE = b"N}(X\x0c\x00\x00\x00__defaults__(K\x07tX\x08\x00\x00\x00injectedK\x01u\x86"  # (None, {...})
DICTSTATE = b"}(X\x08\x00\x00\x00injectedK\x01u"


@pytest.mark.parametrize("state", [SLOTSTATE, DICTSTATE], ids=["setattr", "dict"])
@pytest.mark.parametrize("module,name", EXPOSED, ids=[f"{m}.{n}" for m, n in EXPOSED])
def test_a_pickle_cannot_change_what_the_unpickler_exposes(tmp_path, module, name, state):
    """BUILD on an allow-listed global would change it for the rest of the process (the code before exposed a
    Python function, whose __defaults__ a pickle could replace): every exposed object refuses."""
    exposed = cifar._RestrictedUnpickler(io.BytesIO(b""), "x").find_class(module, name)
    before = getattr(exposed, "__defaults__", None)
    write_python_folder(tmp_path, {"data_batch_2": mutating_pickle(module, name, state)})
    with pytest.raises(ValueError, match="data_batch_2 is not a CIFAR-10 python batch file"):
        CIFAR10(tmp_path)
    assert getattr(exposed, "__defaults__", None) == before and not hasattr(exposed, "injected")


def test_a_pickle_cannot_allocate_through_numpy_ndarray(tmp_path):
    call = b"\x80\x02cnumpy\nndarray\n(J\x00\x00\x10\x00J\x00\x00\x10\x00tR."  # ndarray((2**20, 2**20)): 8 TiB
    write_python_folder(tmp_path, {"data_batch_2": call})
    with pytest.raises(ValueError, match=r"data_batch_2 is not a CIFAR-10 python batch file \(UnpicklingError: "
                                         r"refused: the pickle calls numpy.ndarray"):
        CIFAR10(tmp_path)


@pytest.mark.parametrize("raw", [b"\x80\x04\x8e" + struct.pack("<Q", 2 ** 62) + b"xyz.",   # BINBYTES8
                                 b"\x80\x04\x8d" + struct.pack("<Q", 2 ** 63 + 5) + b"xyz.",  # BINUNICODE8
                                 b"\x80\x02T\xff\xff\xff\x7fxyz."],                        # BINSTRING
                         ids=["bytes8", "unicode8", "binstring"])
def test_an_oversized_length_field_is_named_not_allocated(tmp_path, raw):
    """The code before raised a bare MemoryError('') or OverflowError, or allocated what the field claimed."""
    write_python_folder(tmp_path, {"data_batch_2": raw})
    with pytest.raises(ValueError, match=r"data_batch_2 is not a CIFAR-10 python batch file \(UnpicklingError: "
                                         r".*(remain|maxsize)"):
        CIFAR10(tmp_path)


# ---------------------------------------------------------------- download failures, over a loopback server
class Replies(http.server.BaseHTTPRequestHandler):
    """/full: the archive; /cut-chunked and /cut-length: the connection closes mid-body; /garbage: no HTTP at
    all; anything else: 404."""
    body = b""

    def do_GET(self) -> None:
        if self.path == "/garbage":
            self.wfile.write(b"SSH-2.0-not-http\r\n\r\n")
            return
        if self.path not in ("/full", "/cut-chunked", "/cut-length"):
            self.send_error(404)
            return
        self.send_response(200)
        if self.path == "/cut-chunked":
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.write(b"%x\r\n" % len(self.body) + self.body[:len(self.body) // 2])
            return
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body if self.path == "/full" else self.body[:len(self.body) // 2])

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A local HTTP server on 127.0.0.1 (loopback only) serving `Replies`; yields its base URL."""
    monkeypatch.setenv("no_proxy", "*")  # a proxy from the environment must not see loopback requests
    monkeypatch.setenv("NO_PROXY", "*")
    Replies.body = fake_archive(tmp_path)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Replies)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def test_a_real_http_download_is_checked_and_read(tmp_path, server):
    root = tmp_path / "data"
    cifar.download_binary(root, url=server + "/full", md5=hashlib.md5(Replies.body).hexdigest(), timeout=10)
    assert sorted(p.name for p in root.iterdir()) == ["cifar-10-binary.tar.gz"]
    np.testing.assert_array_equal(CIFAR10(root).data, TRAIN[0])


@pytest.mark.parametrize("path,error", [("/cut-chunked", "IncompleteRead"),
                                        ("/cut-length", r"ConnectionError: the connection closed after \d+ of the "
                                                        r"\d+ bytes announced"),
                                        ("/garbage", "BadStatusLine"), ("/missing", "HTTPError")])
def test_a_failed_download_is_one_clear_error_and_leaves_no_file(tmp_path, server, path, error):
    """The code before let IncompleteRead and BadStatusLine escape and left the .part file."""
    root, url = tmp_path / "data", server + path
    with pytest.raises(RuntimeError, match=f"could not download {re.escape(url)} \\({error}"):
        cifar.download_binary(root, url=url, md5=hashlib.md5(Replies.body).hexdigest(), timeout=10)
    assert list(root.iterdir()) == []
