"""CIFAR-10 from any of its common layouts: official binary or python release, PNG folders, npz parts; and the
small sample of it shipped inside the package (`CIFAR10.sample()`, `load_sample()`)."""
from __future__ import annotations

import gzip
import hashlib
import io
import os
import pickle
import re
import tarfile
import urllib.error
import urllib.request
import zipfile
import zlib
from pathlib import Path
from typing import Callable

import numpy as np

from frost.data.dataset import Dataset
from frost.data.folder import decode_image
from frost.io import expand_path

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
BINARY_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
BINARY_ARCHIVE = "cifar-10-binary.tar.gz"
BINARY_MD5 = "c32a1d4ab5d03f1284b67883e8d87530"
PYTHON_ARCHIVE = "cifar-10-python.tar.gz"
_RECORD = 1 + 3 * 32 * 32  # label byte + CHW pixels
# 2,000 training and 500 test images of the official release, made by benchmarks/cifar10_sample.py (see there)
SAMPLE_FILE = Path(__file__).with_name("cifar10_sample.npz")


class CIFAR10(Dataset):
    """CIFAR-10: `.data` uint8 (N, 32, 32, 3) HWC RGB, `.targets` int64 (N,); item i = (image, label).

    `root` may hold (searched in this order): `cifar-10-batches-bin/` or `cifar-10-binary.tar.gz`
    (the official binary release, preferred: no pickle), `cifar-10-batches-py/` or
    `cifar-10-python.tar.gz` (the official python release, read by a restricted unpickler),
    the npz parts `train_x_{a..e}.npz`, `train_y.npy`, `test_x.npz`, `test_y.npy`, or the PNG
    folders `train/<index>_<class>.png` and `test/...`. With download=True and none of these,
    the binary archive is fetched into root and its MD5 checked before use. `~` and $VARS in root are expanded.

    `CIFAR10.sample(train)` is the small sample shipped inside the package (2,000 training and 500 test images,
    200 and 50 per class), for runs without the data; it is no substitute for the full set's results."""

    classes = CLASSES

    def __init__(self, root: str | os.PathLike, train: bool = True, download: bool = False,
                 transform: Callable | None = None) -> None:
        self.root, self.train, self.transform = Path(expand_path(root)), train, transform
        layout = find_layout(self.root)
        if layout is None and download:
            download_binary(self.root)
            layout = find_layout(self.root)
        if layout is None:
            raise FileNotFoundError(
                f"CIFAR10: no CIFAR-10 files in {self.root}; expected cifar-10-batches-bin/, {BINARY_ARCHIVE}, "
                f"cifar-10-batches-py/, {PYTHON_ARCHIVE}, train_x_a..e.npz + train_y.npy, or train/ and test/ "
                f"PNG folders (pass download=True to fetch the official archive)")
        kind, path = layout
        self.layout = kind
        self.data, self.targets = _READERS[kind](path, train)

    @classmethod
    def sample(cls, train: bool = True, transform: Callable | None = None) -> CIFAR10:
        """The sample of CIFAR-10 shipped inside the package (see `load_sample`), as a dataset."""
        ds = cls.__new__(cls)
        ds.root, ds.train, ds.transform, ds.layout = SAMPLE_FILE, train, transform, "sample"
        ds.data, ds.targets = load_sample(train)
        return ds

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.int64]:
        image = self.data[index]
        if self.transform is not None:
            image = self.transform(image)
        return image, self.targets[index]

    def get_batch(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Images and labels at `indices` at once (the DataLoader's fast path: one gather, GIL released)."""
        images = self.data[indices]
        if self.transform is not None:
            images = np.stack([self.transform(image) for image in images])
        return images, self.targets[indices]

    def __repr__(self) -> str:
        split = "train" if self.train else "test"
        return f"CIFAR10({split}, {len(self)} images, from {self.layout} in {self.root})"


def find_layout(root: Path) -> tuple[str, Path] | None:
    """The first CIFAR-10 layout present in root, as (kind, path)."""
    candidates = [
        ("binary_dir", root / "cifar-10-batches-bin", lambda p: (p / "data_batch_1.bin").is_file()),
        ("binary_dir", root, lambda p: (p / "data_batch_1.bin").is_file()),
        ("binary_tar", root / BINARY_ARCHIVE, Path.is_file),
        ("python_dir", root / "cifar-10-batches-py", lambda p: (p / "data_batch_1").is_file()),
        ("python_dir", root, lambda p: (p / "data_batch_1").is_file()),
        ("python_tar", root / PYTHON_ARCHIVE, Path.is_file),
        ("npz", root, lambda p: (p / "train_x_a.npz").is_file() or (p / "test_x.npz").is_file()),
        ("png", root, lambda p: (p / "train").is_dir() or (p / "test").is_dir()),
    ]
    for kind, path, present in candidates:
        if present(path):
            return kind, path
    return None


def _split_names(train: bool, suffix: str = "") -> list[str]:
    names = [f"data_batch_{k}" for k in range(1, 6)] if train else ["test_batch"]
    return [n + suffix for n in names]


# ---------------------------------------------------------------- binary release
def _parse_binary(raw: bytes, name: str) -> tuple[np.ndarray, np.ndarray]:
    if len(raw) % _RECORD:
        raise ValueError(f"CIFAR10: {name} has {len(raw)} bytes, not a whole number of {_RECORD}-byte records")
    records = np.frombuffer(raw, np.uint8).reshape(-1, _RECORD)
    images = records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return images, records[:, 0].astype(np.int64)


def _concat(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    return (np.ascontiguousarray(np.concatenate([x for x, _ in parts])),
            np.concatenate([y for _, y in parts]).astype(np.int64))


def _read_binary_dir(path: Path, train: bool):
    return _concat([_parse_binary((path / n).read_bytes(), str(path / n)) for n in _split_names(train, ".bin")])


def _tar_members(path: Path, folder: str, names: list[str]) -> list[tuple[str, bytes]]:
    out = []
    try:
        with tarfile.open(path, "r:gz") as tar:
            for n in names:
                member = f"{folder}/{n}"
                try:
                    f = tar.extractfile(member)  # read in memory: nothing is extracted to disk
                except KeyError:
                    f = None
                if f is None:
                    raise FileNotFoundError(f"CIFAR10: {path} has no member {member}")
                out.append((f"{path}:{member}", f.read()))
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as e:  # a truncated or damaged archive
        raise ValueError(f"CIFAR10: {path} is not a readable .tar.gz ({type(e).__name__}: {e}); delete it (or "
                         f"fetch it again) and retry") from e
    return out


def _read_binary_tar(path: Path, train: bool):
    members = _tar_members(path, "cifar-10-batches-bin", _split_names(train, ".bin"))
    return _concat([_parse_binary(raw, name) for name, raw in members])


# ---------------------------------------------------------------- python release
def _numpy_reconstruct():
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # NumPy 1.x
        from numpy.core.multiarray import _reconstruct
    return _reconstruct


def _frombuffer(buf, dtype, shape, order):
    """What NumPy's protocol-5 pickles call to rebuild an array from its bytes."""
    return np.frombuffer(buf, dtype=dtype).reshape(shape, order=order)


class _RestrictedUnpickler(pickle.Unpickler):
    """Admits only NumPy array reconstruction and built-in containers; refuses everything else."""

    def __init__(self, file, name: str) -> None:
        super().__init__(file, encoding="bytes")
        self.name = name

    def find_class(self, module: str, name: str):
        allowed = {
            ("numpy.core.multiarray", "_reconstruct"): _numpy_reconstruct,
            ("numpy._core.multiarray", "_reconstruct"): _numpy_reconstruct,
            ("numpy.core.numeric", "_frombuffer"): lambda: _frombuffer,
            ("numpy._core.numeric", "_frombuffer"): lambda: _frombuffer,
            ("numpy", "ndarray"): lambda: np.ndarray,
            ("numpy", "dtype"): lambda: np.dtype,
            ("_codecs", "encode"): lambda: __import__("codecs").encode,  # bytes in Python 3 protocol-2 pickles
        }
        builtins = {"list": list, "dict": dict, "bytes": bytes, "bytearray": bytearray, "str": str, "int": int}
        if (module, name) in allowed:
            return allowed[(module, name)]()
        if module in ("builtins", "__builtin__") and name in builtins:
            return builtins[name]
        raise pickle.UnpicklingError(
            f"CIFAR10: {self.name} asks to load {module}.{name}; refused: only NumPy arrays and built-in "
            f"lists, dicts, bytes, str and int are allowed in a CIFAR-10 batch file")


def _parse_python(raw: bytes, name: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        batch = _RestrictedUnpickler(io.BytesIO(raw), name).load()
    except pickle.UnpicklingError as e:
        if str(e).startswith("CIFAR10:"):  # the restricted unpickler's refusal, which names the file already
            raise
        raise ValueError(f"CIFAR10: {name} is not a CIFAR-10 python batch file (UnpicklingError: {e})") from e
    except (EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError) as e:
        raise ValueError(f"CIFAR10: {name} is not a CIFAR-10 python batch file ({type(e).__name__}: {e})") from e
    if not isinstance(batch, dict):
        raise ValueError(f"CIFAR10: {name} holds a {type(batch).__name__}, not a CIFAR-10 batch dict")
    get = lambda k: batch.get(k.encode(), batch.get(k))  # noqa: E731 - Python 2 pickles have bytes keys
    data, labels = get("data"), get("labels")
    if data is None or labels is None:
        raise ValueError(f"CIFAR10: {name} has no 'data' and 'labels' entries")
    data, labels = np.asarray(data, dtype=np.uint8), np.asarray(labels, dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or labels.shape != (len(data),):
        raise ValueError(f"CIFAR10: {name} has 'data' of shape {data.shape} and 'labels' of shape {labels.shape}; "
                         f"expected (N, 3072) and (N,)")
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels


def _read_python_dir(path: Path, train: bool):
    return _concat([_parse_python((path / n).read_bytes(), str(path / n)) for n in _split_names(train)])


def _read_python_tar(path: Path, train: bool):
    members = _tar_members(path, "cifar-10-batches-py", _split_names(train))
    return _concat([_parse_python(raw, name) for name, raw in members])


# ---------------------------------------------------------------- npz parts and PNG folders
def _read_npz(path: Path, train: bool):
    if train:
        from frost.parallel import finish, spawn
        parts = sorted(path.glob("train_x_*.npz"))
        if not parts:
            raise FileNotFoundError(f"CIFAR10: {path} has no train_x_*.npz parts (the npz layout's training images)")
        arrays: dict[Path, np.ndarray] = {}

        def load(part: Path) -> None:
            arrays[part] = np.load(part)["x"]

        with finish():  # zlib inflates with the GIL released: the parts load in parallel
            for part in parts:
                spawn(load, part)
        x = np.concatenate([arrays[p] for p in parts])
        y = np.load(path / "train_y.npy")
    else:
        x, y = np.load(path / "test_x.npz")["x"], np.load(path / "test_y.npy")
    if x.shape[1:] != (32, 32, 3) or len(x) != len(y):
        raise ValueError(f"CIFAR10: npz parts in {path} give images {x.shape} and labels {y.shape}")
    return np.ascontiguousarray(x, dtype=np.uint8), y.astype(np.int64)


_PNG_NAME = re.compile(r"^(\d+)_([a-z]+)\.png$")


def seed_png_files(folder: Path) -> tuple[list[Path], np.ndarray]:
    """The files of a `<index>_<class>.png` folder in index order, with their labels."""
    entries = []
    for f in folder.iterdir():
        m = _PNG_NAME.match(f.name)
        if m is None:
            continue
        if m.group(2) not in CLASSES:
            raise ValueError(f"CIFAR10: {f} names unknown class {m.group(2)!r}")
        entries.append((int(m.group(1)), f, CLASSES.index(m.group(2))))
    entries.sort()
    if [i for i, _, _ in entries] != list(range(len(entries))):
        raise ValueError(f"CIFAR10: the indices of the PNG files in {folder} are not 0..{len(entries) - 1}")
    return [f for _, f, _ in entries], np.array([c for _, _, c in entries], dtype=np.int64)


def _read_png(path: Path, train: bool):
    from frost.parallel import finish, spawn, split
    folder = path / ("train" if train else "test")
    files, labels = seed_png_files(folder)
    images = np.empty((len(files), 32, 32, 3), np.uint8)

    def decode(positions: range) -> None:
        for i in positions:
            img = decode_image(files[i])
            if img.shape != (32, 32, 3):
                raise ValueError(f"CIFAR10: {files[i]} is {img.shape}, not a 32x32 RGB image")
            images[i] = img

    with finish():  # Pillow decodes with the GIL released
        spawn(decode, split(range(len(files)), min(8, os.cpu_count() or 1)))
    return images, labels


_READERS = {"binary_dir": _read_binary_dir, "binary_tar": _read_binary_tar, "python_dir": _read_python_dir,
            "python_tar": _read_python_tar, "npz": _read_npz, "png": _read_png}


# ---------------------------------------------------------------- the embedded sample
def load_sample(train: bool = True, path: str | os.PathLike = SAMPLE_FILE) -> tuple[np.ndarray, np.ndarray]:
    """The package's CIFAR-10 sample: images uint8 (N, 32, 32, 3) HWC RGB and labels int64 (N,), N = 2,000 for
    train, 500 for test: the first 200 (50) images of each class in the official order of the training set (test
    set). The file keeps the images as gradient residuals (PNG's filter, which zlib packs better); two cumulative
    sums modulo 256 restore them. The positions in the official arrays are in the file's train/test_indices."""
    split = "train" if train else "test"
    try:
        with np.load(path, allow_pickle=False) as z:
            residuals, labels = z[f"{split}_images_residuals"], z[f"{split}_labels"]
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile, zlib.error) as e:
        raise RuntimeError(f"CIFAR10: the package's sample {path} is missing or damaged ({type(e).__name__}: {e}); "
                           f"reinstall frost or pass the full data") from e
    images = np.cumsum(np.cumsum(residuals, axis=1, dtype=np.uint8), axis=2, dtype=np.uint8)  # wraps modulo 256
    return images, labels.astype(np.int64)


# ---------------------------------------------------------------- download
def download_binary(root: Path, url: str | None = None, md5: str | None = None, timeout: float = 60) -> Path:
    """Fetch the official binary archive into root, checking its MD5 before it is used. `timeout` bounds the
    connection and each read (seconds): offline, the call fails within it."""
    url, md5 = url or BINARY_URL, md5 or BINARY_MD5
    root.mkdir(parents=True, exist_ok=True)
    target, partial = root / BINARY_ARCHIVE, root / (BINARY_ARCHIVE + ".part")
    digest = hashlib.md5()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, open(partial, "wb") as out:
            while chunk := response.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
    except (urllib.error.URLError, OSError) as e:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"CIFAR10: could not download {url} ({e}); are you offline? Put {BINARY_ARCHIVE} "
                           f"(or any layout CIFAR10 reads) in {root} by hand and try again") from e
    if digest.hexdigest() != md5:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"CIFAR10: {url} downloaded with MD5 {digest.hexdigest()}, expected {md5}; "
                           f"the file was deleted")
    partial.replace(target)
    return target
