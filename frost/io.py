"""Checkpoints: frost.save / frost.load of nested dicts and lists of tensors as one safetensors file.

The file is plain safetensors (8-byte little-endian header length, JSON header, raw little-endian tensor data),
so other safetensors readers can open it; bfloat16 is stored as the format's BF16. The nesting (dict keys of
any JSON type, lists, tuples, numbers, strings, None) goes as JSON into the header's `__metadata__`, with each
tensor replaced by the name of its entry. Writes go to a temporary file in the same folder, are flushed to disk
and then renamed over the target, so a crash mid-save never leaves a half-written checkpoint; the temporary file
of a save killed outright is removed by the next save to the same path. Loading reads only that layout and never
unpickles anything, and it checks the header before it allocates: the tensors must tile the data exactly (as the
safetensors library requires), so a file loads into no more memory than it takes on disk.
"""
from __future__ import annotations

import json
import math
import os
import re
import socket
import struct
import uuid
import zipfile
from typing import Any, BinaryIO, Callable, NamedTuple

import numpy as np

from frost import backend
from frost.backend import Device
from frost.dtype import to_dtype
from frost.kernel.frontend import PARSE_LOCK
from frost.tensor import Tensor

FORMAT = "frost"                 # __metadata__["format"]
STRUCTURE_KEY = "frost.structure"  # __metadata__[STRUCTURE_KEY]: the JSON of the saved object
VERSION_KEY, VERSION = "frost.version", 1  # the layout of the structure; files without it are version 1
MAX_HEADER = 100 * 1024 * 1024   # the safetensors library's own limit
MAX_ENTRIES = 1 << 20            # tensors in one file; a large model's whole training state has ~10^5
MAX_NDIM = 32                    # NumPy 1.x's limit (2.x allows 64)
MAX_DEPTH = 512                  # JSON nesting of the structure (~170 nested dicts), within the recursion limit
_HEADER_DEPTH = 3                # a safetensors header nests no deeper: {name: {"shape": [...]}}
_MAX_BYTES = 2 ** 63 - 1         # what NumPy can index; also bounds the dimensions of an empty tensor
_SCAN_CHUNK = 1 << 20
_OPENERS, _CLOSERS = np.frombuffer(b"[{", np.uint8), np.frombuffer(b"]}", np.uint8)
_HOST = socket.gethostname()     # in temporary names: another host's save to a shared folder is not ours to clean
_CODES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
          "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}
_NAMES = {code: name for name, code in _CODES.items()}
_SAVED_LOCATION = "cpu"          # where every tensor of a checkpoint was saved from, for map_location


class CheckpointError(ValueError):
    """A file that is not a frost checkpoint (or, for read_safetensors, a safetensors file), or a damaged one."""


def expand_path(path: str | os.PathLike) -> str:
    """A user's path as the shell would read it: `~` and `~user` expanded, then $VAR and ${VAR} (one left as
    written where the variable is unset, as os.path.expandvars does)."""
    return os.path.expandvars(os.path.expanduser(os.fspath(path)))


# ---------------------------------------------------------------- save


def save(obj: Any, path: str | os.PathLike) -> None:
    """Save a (nested) dict/list/tuple of tensors and JSON-able values (e.g. {'model': model.state_dict(),
    'optimizer': opt.state_dict(), 'step': 10}) to `path` (`~` and $VARS expanded), atomically. CUDA tensors are
    copied to the host."""
    path = expand_path(path)
    tensors: dict[str, np.ndarray] = {}
    structure = json.dumps(_encode(obj, [], tensors, {}), allow_nan=False, separators=(",", ":"))
    if _json_depth(structure.encode()) > MAX_DEPTH:
        raise ValueError(f"frost.save: cannot save to {path}: the object nests deeper than frost.load reads "
                         f"({MAX_DEPTH} levels of JSON)")
    header = _header(tensors, structure)
    _atomic_write(path, lambda f: (f.write(header), _write_tensors(f, tensors)))


def _encode(value, where: list, tensors: dict[str, np.ndarray], seen: dict[tuple, str]):
    """JSON for `value`: literals stay literal; containers, tensors and non-finite floats become tagged objects."""
    if isinstance(value, Tensor):
        if value.ndim > MAX_NDIM:
            raise ValueError(f"frost.save: cannot save the {value.ndim}-dimensional tensor at {_where(where)}; "
                             f"frost.load reads up to {MAX_NDIM} dimensions")
        key = _memory_key(value)
        if key not in seen:  # the same memory reached twice (tied weights) is stored once and loaded once
            seen[key] = name = _tensor_name(where, tensors)
            host = backend.to_device(value.data, backend.CPU)
            tensors[name] = host if host.flags.c_contiguous else host.copy(order="C")
        node = {"tensor": seen[key], "dtype": value.dtype.name}
        return {**node, "requires_grad": True} if value.requires_grad else node
    if isinstance(value, dict):
        return {"dict": [[_encode_key(k, where), _encode(v, where + [k], tensors, seen)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        items = [_encode(v, where + [i], tensors, seen) for i, v in enumerate(value)]
        return {"list" if isinstance(value, list) else "tuple": items}
    if isinstance(value, np.generic) and (value.dtype.kind in "biuf" or value.dtype == to_dtype("bfloat16").np):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": repr(value)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"frost.save: cannot save a {type(value).__name__} at {_where(where)}; a checkpoint holds "
                    f"tensors, dicts, lists, tuples, str, int, float, bool and None")


def _memory_key(t: Tensor) -> tuple:
    """What makes two tensors the same data: their first element's address, shape, strides and dtype (a
    state_dict's detached entries of one tied weight are different Tensor objects over the same memory)."""
    array = t.data
    if array.size == 0:  # nothing to share; and CuPy gives every empty allocation the address 0
        return ("empty", id(t))
    address = array.data.ptr if hasattr(array, "__cuda_array_interface__") else array.__array_interface__["data"][0]
    return str(t.device), address, array.shape, array.strides, array.dtype.str


def _encode_key(key, where: list):
    if isinstance(key, float) and not math.isfinite(key):
        return {"float": repr(key)}
    if key is None or isinstance(key, (bool, int, float, str)):
        return key
    raise TypeError(f"frost.save: cannot save the dict key {key!r} ({type(key).__name__}) at {_where(where)}; "
                    f"keys must be str, int, float, bool or None")


def _where(where: list) -> str:
    return "the top level" if not where else "obj" + "".join(f"[{k!r}]" for k in where)


def _tensor_name(where: list, tensors: dict) -> str:
    """A readable, unique entry name: the path of keys joined by '/', e.g. 'model/fc.weight'."""
    base = "/".join(str(k) for k in where) or "tensor"
    name, n = base, 1
    while name in tensors or name == "__metadata__":
        n += 1
        name = f"{base}#{n}"
    return name


def _header(tensors: dict[str, np.ndarray], structure: str) -> bytes:
    """Length prefix + JSON header, padded with spaces to 8 bytes so that every tensor's data is aligned."""
    entries: dict[str, Any] = {"__metadata__": {"format": FORMAT, VERSION_KEY: str(VERSION), STRUCTURE_KEY: structure}}
    offset = 0
    for name, array in tensors.items():
        entries[name] = {"dtype": _CODES[to_dtype(array.dtype).name], "shape": list(array.shape),
                         "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    text = json.dumps(entries, separators=(",", ":"))  # ASCII only: one byte per character
    text = (text + " " * (-len(text) % 8)).encode()
    return struct.pack("<Q", len(text)) + text


def _write_tensors(f: BinaryIO, tensors: dict[str, np.ndarray]) -> None:
    for array in tensors.values():
        f.write(memoryview(array.reshape(-1).view(np.uint8)))


def _atomic_write(path: str, write) -> None:
    """Write through `write(file)` to a temporary file next to `path`, fsync it, then rename it over `path`."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"frost.save: cannot write {path}: the folder {folder} does not exist")
    _remove_stale_temporaries(folder, os.path.basename(path))
    tmp = os.path.join(folder, temporary_name(os.path.basename(path), _HOST, os.getpid()))
    try:
        with open(tmp, "xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    try:  # make the rename itself durable
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temporary_name(target: str, host: str, pid: int) -> str:
    """The hidden name of a save's temporary file: it names the target, and the host and process writing it."""
    return f".{target}.{host}.{pid}.{uuid.uuid4().hex[:12]}.tmp"


def _remove_stale_temporaries(folder: str, target: str) -> None:
    """Delete the temporary files of earlier saves to `target` by processes of this host that are gone (killed
    mid-save: nothing else could have removed them)."""
    pattern = re.compile(rf"\.{re.escape(target)}\.(.+)\.(\d+)\.[0-9a-f]{{12}}\.tmp")
    for name in os.listdir(folder):
        match = pattern.fullmatch(name)
        if match is None or match.group(1) != _HOST or _process_alive(int(match.group(2))):
            continue
        try:
            os.unlink(os.path.join(folder, name))
        except OSError:  # removed meanwhile, or not ours to remove: the save itself must not fail for it
            pass


def _process_alive(pid: int) -> bool:
    if os.name != "posix":  # os.kill would terminate the process there, so its files are kept
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's process, or no valid pid at all: leave it
        return True
    return True


def _json_depth(text: bytes) -> int:
    """The deepest nesting of [ and { in JSON text, outside its strings. Linear, vectorized and in chunks, as a
    header may be 100 MiB; on text that is not JSON the answer means nothing (the parser refuses that text)."""
    # JSON escapes pair up left to right: without \\ and \" pairs, every " left opens or closes a string
    bare = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    depth = deepest = quotes = 0
    for start in range(0, len(bare), _SCAN_CHUNK):
        code = np.frombuffer(bare, np.uint8, min(_SCAN_CHUNK, len(bare) - start), start)
        outside = (np.cumsum(code == ord('"'), dtype=np.int64) + quotes) % 2 == 0
        steps = (outside & np.isin(code, _OPENERS)).astype(np.int64) - (outside & np.isin(code, _CLOSERS))
        levels = np.cumsum(steps) + depth
        deepest, depth = max(deepest, int(levels.max())), int(levels[-1])
        quotes += int(np.count_nonzero(code == ord('"')))
    return deepest


# ---------------------------------------------------------------- load


class _Reader(NamedTuple):
    """Who reads a safetensors file and what it must be, for the errors: frost.load wants a frost checkpoint."""
    who: str
    kind: str


_LOAD = _Reader("frost.load", "frost checkpoint")
_PLAIN = _Reader("read_safetensors", "safetensors file")


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of a plain safetensors file (a Hugging Face model.safetensors, say) as a NumPy array, by
    name, with load's checks: the header, each entry's dtype and shape, and byte ranges that tile the data,
    all before anything is read (a CheckpointError naming the file and the entry otherwise)."""
    path = expand_path(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        header, data_start = _read_header(f, size, path, _PLAIN)
        header.pop("__metadata__", None)
        return _read_arrays(f, header, data_start, size, path, _PLAIN)


# .npy 3.0 (UTF-8 field names) has no public header reader
_NPY_HEADER_READERS = {(1, 0): "read_array_header_1_0", (2, 0): "read_array_header_2_0"}


def read_npz_array(path: str | os.PathLike, name: str) -> np.ndarray:
    """np.load(path)[name], its header read under PARSE_LOCK and its data inflated outside it (where other threads
    read other files, in parallel). NumPy parses a .npy header with ast.literal_eval, which CPython 3.11 cannot run
    in two threads at once: parts loaded in parallel take turns with each other and with the kernel language."""
    with zipfile.ZipFile(path) as z, z.open(f"{name}.npy") as f:
        return _read_npy_stream(f, z.getinfo(f"{name}.npy").file_size, f"{path}: {name}.npy")


def read_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every array of an .npz file by name (np.load(path) read whole), each as read_npz_array reads it."""
    with zipfile.ZipFile(path) as z:
        names = [member[:-len(".npy")] for member in z.namelist() if member.endswith(".npy")]
    return {name: read_npz_array(path, name) for name in names}


def read_npy(path: str | os.PathLike, mmap_mode: str | None = None) -> np.ndarray:
    """np.load of a .npy file (no pickles), its header parsed under PARSE_LOCK (see read_npz_array); mmap_mode as
    np.load's."""
    if mmap_mode is not None:
        try:
            with PARSE_LOCK:   # np.memmap parses the header when it maps the file
                array = np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from e
        if not isinstance(array, np.ndarray):
            raise ValueError(f"{path}: not an .npy file (np.load found {type(array).__name__})")
        return array
    with open(path, "rb") as f:
        return _read_npy_stream(f, os.fstat(f.fileno()).st_size, str(path))


def _read_npy_stream(f, available: int, where: str) -> np.ndarray:
    """The array of the .npy stream f holding at most `available` bytes: the header under PARSE_LOCK, the data read
    into a new writable buffer after a check that the stream can hold it (a small file claiming a huge shape
    allocates nothing)."""
    with PARSE_LOCK:
        try:
            version = np.lib.format.read_magic(f)
            if version not in _NPY_HEADER_READERS:
                raise ValueError(f"an .npy file of version {version}, not 1.0 or 2.0")
            shape, fortran_order, dtype = getattr(np.lib.format, _NPY_HEADER_READERS[version])(f)
        except ValueError as e:
            raise ValueError(f"{where} is not a readable .npy file: {e}") from e
    if dtype.hasobject:
        raise ValueError(f"{where} holds Python objects ({dtype}), which frost never unpickles")
    size = math.prod(shape) * dtype.itemsize
    if size > available:
        raise ValueError(f"{where} claims {shape} {dtype}, which it does not hold")
    data = np.empty(size, np.uint8)   # not zero-filled: readinto fills it
    got = f.readinto(data)
    if got != size:
        raise ValueError(f"{where} ends after {got} of its {size} bytes")
    return data.view(dtype).reshape(shape, order="F" if fortran_order else "C")


def load(path: str | os.PathLike, device: str | Device | None = None, *, map_location: Any = None,
         weights_only: bool | None = None) -> Any:
    """Load what `save` wrote (`~` and $VARS in `path` expanded), a plain safetensors file (a Hugging Face
    model.safetensors: a dict of tensors by name) or a sharded one through its `*.safetensors.index.json` (one dict
    of all the shards' tensors, in the index's order). Tensors come back on the CPU, or where `device` or
    PyTorch's `map_location` puts them: a device ("cpu", "cuda:1", a Device), a dict from saved location to device,
    or a callable f(tensor, location) returning the tensor to use (None keeps it). Frost saves every tensor from the
    host, so the saved location a dict or callable sees is always "cpu". weights_only is accepted and ignored:
    frost.load never unpickles anything."""
    path = expand_path(path)
    place = _placement(device, map_location)
    if not os.path.exists(path):
        raise FileNotFoundError(f"frost.load: no such file: {path}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"frost.load: {path} is a folder, not a checkpoint file")
    if path.endswith(".index.json"):
        return _load_sharded(path, place)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        header, data_start = _read_header(f, size, path, _LOAD)
        structure = _structure(header, path) if _is_frost(header) else None
        header.pop("__metadata__", None)
        arrays = _read_arrays(f, header, data_start, size, path, _LOAD)
    if structure is None:
        return {name: place(a) for name, a in arrays.items()}
    return _decode(structure, _PlacedTensors(arrays, place), path)


def _placement(device, map_location) -> Callable[[np.ndarray], Tensor]:
    """The function from a loaded host array to the tensor load returns, from load's device or map_location."""
    if device is not None and map_location is not None:
        raise TypeError("frost.load: give device or map_location, not both")
    where = device if device is not None else map_location
    if isinstance(where, dict):  # PyTorch's {saved location: device}; frost's saved location is the host
        where = where.get(_SAVED_LOCATION)
    if where is None:
        return Tensor
    if isinstance(where, (str, Device)):
        target = Device(where)
        return lambda a: Tensor(backend.to_device(a, target))
    if callable(where):
        return lambda a: _mapped(where, Tensor(a))
    raise TypeError(f"frost.load: map_location must be a device, a dict or a callable, got {type(where).__name__}")


def _mapped(map_location: Callable, t: Tensor) -> Tensor:
    result = map_location(t, _SAVED_LOCATION)
    if result is None:
        return t
    if not isinstance(result, Tensor):
        raise TypeError(f"frost.load: map_location returned a {type(result).__name__}; it must return a Tensor or "
                        f"None")
    return result


class _PlacedTensors:
    """A checkpoint's tensors by name, each placed once (load's device or map_location: tied entries stay one
    tensor), with the dtypes they were saved in (a map_location may change them)."""

    def __init__(self, arrays: dict[str, np.ndarray], place: Callable[[np.ndarray], Tensor]) -> None:
        self.saved_dtypes = {name: to_dtype(a.dtype).name for name, a in arrays.items()}
        self.placed = {name: place(a) for name, a in arrays.items()}

    def saved_dtype(self, name: str) -> str:
        return self.saved_dtypes[name]

    def __getitem__(self, name: str) -> Tensor:
        return self.placed[name]


def _is_frost(header: dict) -> bool:
    """Whether a safetensors header is a frost checkpoint's (its metadata says format "frost")."""
    meta = header.get("__metadata__")
    return isinstance(meta, dict) and meta.get("format") == FORMAT


def _load_sharded(index_path: str, place: Callable[[np.ndarray], Tensor]) -> dict[str, Tensor]:
    """The tensors of a sharded safetensors checkpoint: its index's weight_map names each tensor's shard file, a
    file in the index's folder."""
    weight_map = _weight_map(index_path)
    folder = os.path.dirname(index_path)
    shards: dict[str, dict[str, np.ndarray]] = {}
    for shard in dict.fromkeys(weight_map.values()):
        shard_path = os.path.join(folder, shard)
        if not os.path.isfile(shard_path):
            raise FileNotFoundError(f"frost.load: {index_path} names the shard {shard}, which is not in {folder}")
        with open(shard_path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            header, data_start = _read_header(f, size, shard_path, _PLAIN)
            header.pop("__metadata__", None)
            shards[shard] = _read_arrays(f, header, data_start, size, shard_path, _PLAIN)
    missing = [(name, shard) for name, shard in weight_map.items() if name not in shards[shard]]
    if missing:
        name, shard = missing[0]
        raise CheckpointError(f"frost.load: {index_path} puts tensor {name!r} in {shard}, which does not hold it "
                              f"({len(missing)} such tensors)")
    return {name: place(shards[shard][name]) for name, shard in weight_map.items()}


def _weight_map(index_path: str) -> dict[str, str]:
    """The checked weight_map of a sharded checkpoint's index: tensor name -> shard file name (a bare file name:
    an index must not reach outside its folder)."""
    if os.path.getsize(index_path) > MAX_HEADER:
        raise CheckpointError(f"frost.load: {index_path} is larger than an index can be ({MAX_HEADER} bytes)")
    with open(index_path, encoding="utf-8") as f:
        try:
            index = json.load(f)
        except (ValueError, RecursionError) as e:
            raise CheckpointError(f"frost.load: {index_path} is not a safetensors index: not valid JSON "
                                  f"({e})") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in weight_map.items()):
        raise CheckpointError(f"frost.load: {index_path} is not a safetensors index: it has no weight_map of tensor "
                              f"names to shard files")
    for shard in weight_map.values():
        if os.path.basename(shard) != shard or shard in ("", ".", ".."):
            raise CheckpointError(f"frost.load: {index_path} names the shard {shard!r}, which is not a file name in "
                                  f"the index's folder")
    return weight_map


def _read_header(f: BinaryIO, size: int, path: str, reader: _Reader) -> tuple[dict, int]:
    prefix = f.read(8)
    if len(prefix) < 8:
        raise CheckpointError(f"{reader.who}: {path} is not a {reader.kind}: it has only {size} bytes "
                              f"(empty or truncated)")
    (length,) = struct.unpack("<Q", prefix)
    first = f.read(1)
    if first != b"{" or not 2 <= length <= min(MAX_HEADER, size - 8):
        if prefix[:1] == b"\x80" and prefix[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05") \
                or prefix[:4] == b"PK\x03\x04":
            raise CheckpointError(f"{reader.who}: {path} is not a {reader.kind}: it looks like a pickle or a "
                                  f"torch.save zip file, which frost never unpickles")
        if first != b"{":
            raise CheckpointError(f"{reader.who}: {path} is not a {reader.kind}: not a safetensors file (its "
                                  f"header does not start with '{{')")
        raise CheckpointError(f"{reader.who}: {path} is truncated or not a safetensors file: its header claims "
                              f"{length} bytes but the file has {size} bytes in all")
    raw = first + f.read(length - 1)
    if _json_depth(raw) > _HEADER_DEPTH:
        raise CheckpointError(f"{reader.who}: {path} is damaged: its safetensors header nests deeper than "
                              f"{_HEADER_DEPTH} levels, which no tensor entry needs")
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=lambda pairs: _unique_keys(pairs, path, reader))
    except CheckpointError:
        raise
    except (ValueError, RecursionError) as e:  # bad UTF-8, bad JSON, or an integer of more than 4,300 digits
        raise CheckpointError(f"{reader.who}: {path} is not a {reader.kind}: its safetensors header is not "
                              f"valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{reader.who}: {path} is not a {reader.kind}: its header is not a JSON object")
    if len(header) > MAX_ENTRIES + 1:
        raise CheckpointError(f"{reader.who}: {path} is damaged: its header lists {len(header) - 1} tensors, more "
                              f"than the {MAX_ENTRIES} a checkpoint may hold")
    return header, 8 + length


def _unique_keys(pairs: list[tuple[str, Any]], path: str, reader: _Reader) -> dict:
    """A JSON object of the header; a name given twice would hide one entry's byte range from the checks."""
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        twice = next(key for key in keys if keys.count(key) > 1)
        raise CheckpointError(f"{reader.who}: {path} is damaged: its header names the entry {twice!r} twice")
    return dict(pairs)


def _read_arrays(f: BinaryIO, header: dict, data_start: int, size: int, path: str,
                 reader: _Reader) -> dict[str, np.ndarray]:
    """Every tensor entry of a read header, checked (_check_entries) before any is read."""
    entries = _check_entries(header, size - data_start, path, reader.who)
    return {name: _read_array(f, data_start, entry, path, reader.who) for name, entry in entries.items()}


def _structure(header: dict, path: str):
    meta = header.pop("__metadata__", None)
    if isinstance(meta, dict) and not all(isinstance(v, str) for v in meta.values()):
        raise CheckpointError(f"frost.load: {path} is damaged: its safetensors __metadata__ holds values that are "
                              f"not strings")
    if STRUCTURE_KEY not in meta:
        raise CheckpointError(f"frost.load: {path} is damaged: its metadata says format {FORMAT!r} but has no "
                              f"'{STRUCTURE_KEY}'")
    version = meta.get(VERSION_KEY, "1")
    if not (isinstance(version, str) and version.isdigit()):
        raise CheckpointError(f"frost.load: {path} is damaged: its {VERSION_KEY} is {version!r}, not a number")
    if int(version) > VERSION:
        raise CheckpointError(f"frost.load: {path} was written by a newer Frost (checkpoint format {version}; this "
                              f"one reads up to {VERSION}); upgrade Frost to read it")
    if _json_depth(meta[STRUCTURE_KEY].encode()) > MAX_DEPTH:
        raise CheckpointError(f"frost.load: {path} is damaged: its frost metadata nests deeper than {MAX_DEPTH} "
                              f"levels of JSON, more than frost.save writes")
    try:
        return json.loads(meta[STRUCTURE_KEY])
    except (TypeError, ValueError, RecursionError) as e:
        raise CheckpointError(f"frost.load: {path} is damaged: its frost metadata is not valid JSON ({e})") from None


def _check_entries(header: dict, data_size: int, path: str, who: str) -> dict[str, dict]:
    """Validate every tensor entry (dtype, shape, byte range) before reading anything. As in the safetensors
    library, the byte ranges, sorted, must tile the data exactly: no overlap (which would load one file's bytes
    many times over), no gap, nothing past the end of the file and nothing after the last tensor."""
    spans = sorted((_entry_span(name, entry, path, who), name) for name, entry in header.items())
    offset = 0
    for (begin, end), name in spans:
        if begin != offset:
            why = "overlapping another tensor's bytes" if begin < offset else f"leaving bytes {offset}..{begin} unused"
            raise CheckpointError(f"{who}: {path} is damaged: tensor {name!r} spans bytes {begin}..{end} of the "
                                  f"data, {why}")
        offset = end
    if offset > data_size:
        raise CheckpointError(f"{who}: {path} is truncated: its tensors need {offset} bytes of data but "
                              f"the file has {data_size} after the header")
    if offset < data_size:
        raise CheckpointError(f"{who}: {path} is damaged: it has {data_size - offset} bytes after its last "
                              f"tensor, which no header entry covers")
    return header


def _entry_span(name: str, entry, path: str, who: str) -> tuple[int, int]:
    """The byte range [begin, end) of one well-formed tensor entry; a CheckpointError naming it otherwise."""
    def bad(why: str) -> CheckpointError:
        return CheckpointError(f"{who}: {path} is damaged: bad header entry for tensor {name!r}: {why} "
                               f"({repr(entry)[:200]})")

    if not isinstance(entry, dict):
        raise bad("not a JSON object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in _NAMES:
        raise bad(f"unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):  # bool is an int too
        raise bad("the shape is not a list of non-negative integers")
    if len(shape) > MAX_NDIM:
        raise bad(f"{len(shape)} dimensions, more than {MAX_NDIM}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(n) is int for n in offsets)
            and 0 <= offsets[0] <= offsets[1]):
        raise bad("data_offsets is not [begin, end] with 0 <= begin <= end")
    itemsize = to_dtype(_NAMES[dtype]).itemsize
    if math.prod(max(n, 1) for n in shape) * itemsize > _MAX_BYTES:
        raise bad("the shape is too large for any array")
    nbytes = math.prod(shape) * itemsize
    begin, end = offsets
    if end - begin != nbytes:
        raise CheckpointError(f"{who}: {path} is damaged: tensor {name!r} of shape {tuple(shape)} and "
                              f"dtype {_NAMES[dtype]} needs {nbytes} bytes but its entry spans {end - begin}")
    return begin, end


def _read_array(f: BinaryIO, data_start: int, entry: dict, path: str, who: str) -> np.ndarray:
    array = np.empty(entry["shape"], dtype=to_dtype(_NAMES[entry["dtype"]]).np)  # hosts are little-endian
    begin, end = entry["data_offsets"]
    f.seek(data_start + begin)
    if f.readinto(memoryview(array.reshape(-1).view(np.uint8))) != end - begin:
        raise CheckpointError(f"{who}: {path} is truncated (short read)")
    return array


def _decode(node, tensors: _PlacedTensors, path: str):
    if not isinstance(node, dict):
        return node
    tag = "tensor" if "tensor" in node else next(iter(node), None) if len(node) == 1 else None
    try:
        body = node[tag] if tag is not None else None
        if tag == "tensor":
            if (saved := tensors.saved_dtype(body)) != node["dtype"]:
                raise ValueError(f"tensor {body!r} is {saved} in the data but {node['dtype']} in the metadata")
            t = tensors[body]
            return t.requires_grad_(True) if node.get("requires_grad") is True else t
        if tag == "float":
            return float(body)
        if tag == "list":
            return [_decode(v, tensors, path) for v in body]
        if tag == "tuple":
            return tuple(_decode(v, tensors, path) for v in body)
        if tag == "dict":
            return {_decode(k, tensors, path): _decode(v, tensors, path) for k, v in body}
        raise ValueError(f"unknown tag {tag!r}" if tag else "not a tagged object")
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, RecursionError) as e:
        raise CheckpointError(f"frost.load: {path} is damaged: bad frost metadata near {str(node)[:80]} "
                              f"({type(e).__name__}: {e})") from None
