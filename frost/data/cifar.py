"""CIFAR-10 from any of its common layouts: official binary or python release, PNG folders, npz parts; and the
small sample of it shipped inside the package (`CIFAR10.sample()`, `load_sample()`)."""
from __future__ import annotations

import gzip
import hashlib
import http.client
import io
import math
import os
import pickle
import pickletools
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
from frost.io import expand_path, read_npy, read_npz_array
from frost.parallel import finish, spawn, split

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
BINARY_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
BINARY_ARCHIVE = "cifar-10-binary.tar.gz"
BINARY_MD5 = "c32a1d4ab5d03f1284b67883e8d87530"
PYTHON_ARCHIVE = "cifar-10-python.tar.gz"
_RECORD = 1 + 3 * 32 * 32  # label byte + CHW pixels
_BATCH_IMAGES = 10_000     # per official batch file
_MAX_BINARY_BATCH = _BATCH_IMAGES * _RECORD
# the pixels twice over (Python 3's protocol-2 pickles store bytes as latin-1 text in UTF-8) plus labels and names
_MAX_PYTHON_BATCH = 2 * _BATCH_IMAGES * 3 * 32 * 32 + (4 << 20)
_MAX_MEMBERS = 64          # the official archives hold 8 files
_CHUNK = 1 << 20
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


def _read_batch_file(path: Path, max_size: int) -> bytes:
    """A batch file's bytes, its size checked before anything is read."""
    size = path.stat().st_size
    if size > max_size:
        raise ValueError(f"CIFAR10: {path} has {size} bytes, more than a CIFAR-10 batch file ({max_size}); "
                         f"it is not one")
    return path.read_bytes()


def _read_binary_dir(path: Path, train: bool):
    return _concat([_parse_binary(_read_batch_file(path / n, _MAX_BINARY_BATCH), str(path / n))
                    for n in _split_names(train, ".bin")])


def _tar_members(path: Path, folder: str, names: list[str], max_size: int) -> list[tuple[str, bytearray]]:
    """The files folder/names of a .tar.gz, read in memory (nothing is extracted to disk) in one pass to its end,
    which checks the whole archive. Every member's size is checked against `max_size` from its header before its
    bytes are read or skipped, so a small archive cannot make this inflate more than a CIFAR archive holds."""
    wanted, found = [f"{folder}/{n}" for n in names], {}
    try:
        with tarfile.open(path, "r:gz") as tar:
            for count, member in enumerate(tar, 1):
                if count > _MAX_MEMBERS:
                    raise ValueError(f"CIFAR10: {path} has more than {_MAX_MEMBERS} members; it is not a CIFAR-10 "
                                     f"archive")
                if member.size > max_size:
                    raise ValueError(f"CIFAR10: {path} has a member {member.name} of {member.size} bytes, more than "
                                     f"any file of a CIFAR-10 archive ({max_size}); it is not one")
                if member.name in wanted:
                    found[member.name] = _read_member(tar, member, path)
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as e:  # a truncated or damaged archive
        raise ValueError(f"CIFAR10: {path} is not a readable .tar.gz ({type(e).__name__}: {e}); delete it (or "
                         f"fetch it again) and retry") from e
    missing = [name for name in wanted if name not in found]
    if missing:
        raise FileNotFoundError(f"CIFAR10: {path} has no member {missing[0]}")
    return [(f"{path}:{name}", found[name]) for name in wanted]


def _read_member(tar: tarfile.TarFile, member: tarfile.TarInfo, path: Path) -> bytearray:
    """A member's bytes, read in 1 MiB chunks into a buffer of the size its header gives."""
    source = tar.extractfile(member) if member.isfile() else None
    if source is None:
        raise ValueError(f"CIFAR10: {path}: the member {member.name} is not a regular file")
    data = bytearray(member.size)
    view, done = memoryview(data), 0
    with source:
        while done < member.size:
            n = source.readinto(view[done:done + _CHUNK])
            if not n:
                raise ValueError(f"CIFAR10: {path}: the member {member.name} ends after {done} of its "
                                 f"{member.size} bytes")
            done += n
    return data


def _read_binary_tar(path: Path, train: bool):
    members = _tar_members(path, "cifar-10-batches-bin", _split_names(train, ".bin"), _MAX_BINARY_BATCH)
    return _concat([_parse_binary(raw, name) for name, raw in members])


# ---------------------------------------------------------------- python release
# The unpickler hands a pickle only callables a pickle cannot change: classes of the metaclass below (a pickle's
# BUILD sets attributes, which they refuse) or immutable built-in types. NumPy's own reconstruction functions
# and dtypes are never exposed: the classes below read the array's state themselves and build it with
# np.frombuffer, for plain numeric dtypes only.
class _Immutable(type):
    """The metaclass of the callables exposed to a pickle: their attributes cannot be set or deleted."""

    def __setattr__(cls, name: str, value) -> None:
        raise pickle.UnpicklingError(f"refused: the pickle tries to set {name!r} on {cls.__name__}")

    def __delattr__(cls, name: str) -> None:
        raise pickle.UnpicklingError(f"refused: the pickle tries to delete {name!r} of {cls.__name__}")


def _text(value):
    """A Python 2 str read with encoding='bytes' comes as bytes: as text."""
    return value.decode("latin-1") if isinstance(value, bytes) else value


_NUMERIC_DTYPE = re.compile(r"[<>|=]?[biuf][1248]")  # how NumPy names them in pickles: 'u1', 'i8', 'f4', ...


class _Dtype(metaclass=_Immutable):
    """numpy.dtype(name, align, copy) as a pickle calls it, then BUILD with the dtype's state: a plain numeric
    dtype and its byte order, nothing else."""
    __slots__ = ("dtype",)

    def __init__(self, name, align=False, copy=False) -> None:
        name = _text(name)
        if not (isinstance(name, str) and _NUMERIC_DTYPE.fullmatch(name)):
            raise pickle.UnpicklingError(f"refused: the dtype {str(name)[:20]!r}; only plain numeric dtypes are "
                                         f"allowed")
        self.dtype = np.dtype(name)

    def __setstate__(self, state) -> None:
        # NumPy's dtype state: (version, byte order, subarray, names, fields, elsize, alignment, flags[, metadata])
        order = _text(state[1]) if isinstance(state, tuple) and len(state) in (8, 9) else None
        if order not in ("<", ">", "|", "=") or state[2:5] != (None, None, None):
            raise pickle.UnpicklingError(f"refused: the dtype state {str(state)[:80]}")
        self.dtype = self.dtype.newbyteorder(order) if order in "<>" else self.dtype


class _NdarrayName(metaclass=_Immutable):
    """numpy.ndarray as a pickle names it: an argument of _reconstruct, never called (np.ndarray(shape) would
    allocate any size)."""
    __slots__ = ()

    def __new__(cls, *args):
        raise pickle.UnpicklingError("refused: the pickle calls numpy.ndarray")


class _Reconstruct(metaclass=_Immutable):
    """numpy's _reconstruct(ndarray, (0,), b'b') and the BUILD after it, which brings the array's state: the
    array, in `array`, is built from that state."""
    __slots__ = ("array",)

    def __init__(self, subtype, shape, typecode) -> None:
        if subtype is not _NdarrayName:
            raise pickle.UnpicklingError(f"refused: _reconstruct of {subtype!r}, not numpy.ndarray")
        self.array = None

    def __setstate__(self, state) -> None:
        # NumPy's array state: (version, shape, dtype, is_fortran, raw bytes), without the version before NumPy 1.0
        if isinstance(state, tuple) and len(state) == 5:
            state = state[1:]
        if not (isinstance(state, tuple) and len(state) == 4 and state[2] in (True, False)):
            raise pickle.UnpicklingError(f"refused: the array state {str(state)[:80]}")
        shape, dtype, fortran, raw = state
        self.array = _array(raw, dtype, shape, "F" if fortran else "C")


class _FromBuffer(metaclass=_Immutable):
    """numpy's _frombuffer(buffer, dtype, shape, order) of protocol-5 pickles."""
    __slots__ = ()

    def __new__(cls, buffer, dtype, shape, order):
        return _array(buffer, dtype, shape, _text(order))


def _array(raw, dtype, shape, order: str) -> np.ndarray:
    """The array over `raw`, which must hold exactly its bytes."""
    if not (isinstance(raw, (bytes, bytearray)) and isinstance(dtype, _Dtype) and order in ("C", "F")
            and isinstance(shape, tuple) and all(type(n) is int and n >= 0 for n in shape)):
        raise pickle.UnpicklingError("refused: an array that is not (bytes, numeric dtype, shape, order)")
    if math.prod(shape) * dtype.dtype.itemsize != len(raw):
        raise pickle.UnpicklingError(f"an array of shape {shape} and dtype {dtype.dtype} has {len(raw)} bytes")
    return np.frombuffer(raw, dtype.dtype).reshape(shape, order=order)


class _Latin1(metaclass=_Immutable):
    """_codecs.encode(text, 'latin1'): how Python 3 writes bytes into protocol-2 pickles; no other codec."""
    __slots__ = ()

    def __new__(cls, text, encoding="utf-8"):
        if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
            raise pickle.UnpicklingError(f"refused: _codecs.encode with {str(encoding)[:20]!r}; only latin1")
        return text.encode("latin-1")


class _Bytes(metaclass=_Immutable):
    """bytes() and bytes(b'...') of protocol-2 pickles; never bytes(n), which would allocate n bytes."""
    __slots__ = ()
    _make = bytes  # set in the class body, which the metaclass's __setattr__ does not see

    def __new__(cls, source=b""):
        if not isinstance(source, (bytes, bytearray)):
            raise pickle.UnpicklingError(f"refused: {cls._make.__name__} of something other than bytes")
        return cls._make(source)


class _ByteArray(_Bytes):
    """bytearray(b'...') of protocol-2 pickles; never bytearray(n)."""
    __slots__ = ()
    _make = bytearray


_PICKLE_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): _Reconstruct, ("numpy._core.multiarray", "_reconstruct"): _Reconstruct,
    ("numpy.core.numeric", "_frombuffer"): _FromBuffer, ("numpy._core.numeric", "_frombuffer"): _FromBuffer,
    ("numpy", "ndarray"): _NdarrayName, ("numpy", "dtype"): _Dtype, ("_codecs", "encode"): _Latin1,
    ("builtins", "bytes"): _Bytes, ("__builtin__", "bytes"): _Bytes,
    ("builtins", "bytearray"): _ByteArray, ("__builtin__", "bytearray"): _ByteArray,
}


class _RestrictedUnpickler(pickle.Unpickler):
    """Admits only NumPy numeric arrays and bytes (besides what pickle builds without globals: dicts, lists, str,
    int, ...), through the immutable callables above; refuses everything else."""

    def __init__(self, file, name: str) -> None:
        super().__init__(file, encoding="bytes")
        self.name = name

    def find_class(self, module: str, name: str):
        if (module, name) in _PICKLE_GLOBALS:
            return _PICKLE_GLOBALS[(module, name)]
        raise pickle.UnpicklingError(
            f"CIFAR10: {self.name} asks to load {module}.{name}; refused: only NumPy arrays of numeric dtypes, "
            f"bytes and the built-in containers are allowed in a CIFAR-10 batch file")


def _check_lengths(raw: bytes | bytearray) -> None:
    """Walk the pickle's opcodes without running them: a length field claiming more bytes than the file holds
    raises here, before the unpickler would allocate that much."""
    try:
        for _ in pickletools.genops(raw):
            pass
    except ValueError as e:  # pickletools' word for a truncated argument, an overlong length or an unknown opcode
        raise pickle.UnpicklingError(str(e)) from None


def _load_batch(raw: bytes | bytearray, name: str):
    try:
        _check_lengths(raw)
        return _RestrictedUnpickler(io.BytesIO(raw), name).load()
    except pickle.UnpicklingError as e:
        if str(e).startswith("CIFAR10:"):  # the restricted unpickler's refusal, which names the file already
            raise
        raise ValueError(f"CIFAR10: {name} is not a CIFAR-10 python batch file (UnpicklingError: {e})") from e
    except (EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError, OverflowError) as e:
        raise ValueError(f"CIFAR10: {name} is not a CIFAR-10 python batch file ({type(e).__name__}: {e})") from e


def _parse_python(raw: bytes | bytearray, name: str) -> tuple[np.ndarray, np.ndarray]:
    batch = _load_batch(raw, name)
    if not isinstance(batch, dict):
        raise ValueError(f"CIFAR10: {name} holds a {type(batch).__name__}, not a CIFAR-10 batch dict")
    get = lambda k: batch.get(k.encode(), batch.get(k))  # noqa: E731 - Python 2 pickles have bytes keys
    data, labels = get("data"), get("labels")
    if data is None or labels is None:
        raise ValueError(f"CIFAR10: {name} has no 'data' and 'labels' entries")
    try:
        data, labels = np.asarray(_built(data), dtype=np.uint8), np.asarray(_built(labels), dtype=np.int64)
    except (TypeError, ValueError, OverflowError) as e:
        raise ValueError(f"CIFAR10: {name} has 'data' or 'labels' that are not arrays of numbers ({e})") from e
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or labels.shape != (len(data),):
        raise ValueError(f"CIFAR10: {name} has 'data' of shape {data.shape} and 'labels' of shape {labels.shape}; "
                         f"expected (N, 3072) and (N,)")
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels


def _built(value):
    """An array the pickle reconstructed, or the value as it is; an array whose state never came is refused."""
    if isinstance(value, _Reconstruct):
        if value.array is None:
            raise ValueError("an array without its state")
        return value.array
    return value


def _read_python_dir(path: Path, train: bool):
    return _concat([_parse_python(_read_batch_file(path / n, _MAX_PYTHON_BATCH), str(path / n))
                    for n in _split_names(train)])


def _read_python_tar(path: Path, train: bool):
    members = _tar_members(path, "cifar-10-batches-py", _split_names(train), _MAX_PYTHON_BATCH)
    return _concat([_parse_python(raw, name) for name, raw in members])


# ---------------------------------------------------------------- npz parts and PNG folders
def _read_npz(path: Path, train: bool):
    if train:
        parts = sorted(path.glob("train_x_*.npz"))
        if not parts:
            raise FileNotFoundError(f"CIFAR10: {path} has no train_x_*.npz parts (the npz layout's training images)")
        arrays: dict[Path, np.ndarray] = {}

        def load(part: Path) -> None:
            arrays[part] = read_npz_array(part, "x")

        with finish():  # zlib inflates with the GIL released: the parts load in parallel
            for part in parts:
                spawn(load, part)
        x = np.concatenate([arrays[p] for p in parts])
        y = read_npy(path / "train_y.npy")
    else:
        x, y = read_npz_array(path / "test_x.npz", "x"), read_npy(path / "test_y.npy")
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
        residuals = read_npz_array(path, f"{split}_images_residuals")
        labels = read_npz_array(path, f"{split}_labels")
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile, zlib.error) as e:
        raise RuntimeError(f"CIFAR10: the package's sample {path} is missing or damaged ({type(e).__name__}: {e}); "
                           f"reinstall frost or pass the full data") from e
    images = np.cumsum(np.cumsum(residuals, axis=1, dtype=np.uint8), axis=2, dtype=np.uint8)  # wraps modulo 256
    return images, labels.astype(np.int64)


# ---------------------------------------------------------------- download
def download_binary(root: Path, url: str | None = None, md5: str | None = None, timeout: float = 60) -> Path:
    """Fetch the official binary archive into root, checking its MD5 before it is used. `timeout` bounds the
    connection and each read (seconds): offline, the call fails within it. Any failure is one RuntimeError naming
    the URL, and leaves no partial file."""
    url, md5 = url or BINARY_URL, md5 or BINARY_MD5
    root.mkdir(parents=True, exist_ok=True)
    target, partial = root / BINARY_ARCHIVE, root / (BINARY_ARCHIVE + ".part")
    try:
        digest = _fetch(url, partial, timeout)
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as e:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"CIFAR10: could not download {url} ({type(e).__name__}: {e}); are you offline? Put "
                           f"{BINARY_ARCHIVE} (or any layout CIFAR10 reads) in {root} by hand and try again") from e
    except BaseException:  # interrupted: no partial file either
        partial.unlink(missing_ok=True)
        raise
    if digest != md5:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"CIFAR10: {url} downloaded with MD5 {digest}, expected {md5}; the file was deleted")
    partial.replace(target)
    return target


def _fetch(url: str, partial: Path, timeout: float) -> str:
    """Stream `url` into `partial` and return its MD5; a body shorter than the server announced is an error (the
    HTTP client returns it silently)."""
    digest, received = hashlib.md5(), 0
    with urllib.request.urlopen(url, timeout=timeout) as response, open(partial, "wb") as out:
        announced = response.headers.get("Content-Length")
        while chunk := response.read(_CHUNK):
            digest.update(chunk)
            out.write(chunk)
            received += len(chunk)
    if announced is not None and announced.isdigit() and received != int(announced):
        raise ConnectionError(f"the connection closed after {received} of the {announced} bytes announced")
    return digest.hexdigest()
