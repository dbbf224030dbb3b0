"""Checkpoints: frost.save / frost.load of nested dicts and lists of tensors as one safetensors file.

The file is plain safetensors (8-byte little-endian header length, JSON header, raw little-endian tensor data),
so other safetensors readers can open it; bfloat16 is stored as the format's BF16. The nesting (dict keys of
any JSON type, lists, tuples, numbers, strings, None) goes as JSON into the header's `__metadata__`, with each
tensor replaced by the name of its entry. Writes go to a temporary file in the same folder, are flushed to disk
and then renamed over the target, so a crash mid-save never leaves a half-written checkpoint. Loading reads
only that layout and never unpickles anything.
"""
from __future__ import annotations

import json
import math
import os
import struct
import uuid
from typing import Any, BinaryIO

import numpy as np

from frost import backend
from frost.backend import Device
from frost.dtype import to_dtype
from frost.tensor import Tensor

FORMAT = "frost"                 # __metadata__["format"]
STRUCTURE_KEY = "frost.structure"  # __metadata__[STRUCTURE_KEY]: the JSON of the saved object
VERSION_KEY, VERSION = "frost.version", 1  # the layout of the structure; files without it are version 1
MAX_HEADER = 100 * 1024 * 1024   # the safetensors library's own limit
_CODES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
          "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}
_NAMES = {code: name for name, code in _CODES.items()}


class CheckpointError(ValueError):
    """A file that is not a frost checkpoint, or a damaged one."""


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
    structure = _encode(obj, [], tensors, {})
    header = _header(tensors, json.dumps(structure, allow_nan=False, separators=(",", ":")))
    _atomic_write(path, lambda f: (f.write(header), _write_tensors(f, tensors)))


def _encode(value, where: list, tensors: dict[str, np.ndarray], seen: dict[tuple, str]):
    """JSON for `value`: literals stay literal; containers, tensors and non-finite floats become tagged objects."""
    if isinstance(value, Tensor):
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
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp")
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


# ---------------------------------------------------------------- load


def load(path: str | os.PathLike, device: str | Device | None = None) -> Any:
    """Load what `save` wrote (`~` and $VARS in `path` expanded). Tensors come back on the CPU, or on `device` when
    given."""
    path = expand_path(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"frost.load: no such file: {path}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"frost.load: {path} is a folder, not a checkpoint file")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        header, data_start = _read_header(f, size, path)
        structure = _structure(header, path)
        entries = _check_entries(header, size - data_start, path)
        arrays = {name: _read_array(f, data_start, entry, path) for name, entry in entries.items()}
    dev = Device(device) if device is not None else None
    tensors = {name: Tensor(a if dev is None else backend.to_device(a, dev)) for name, a in arrays.items()}
    return _decode(structure, tensors, path)


def _read_header(f: BinaryIO, size: int, path: str) -> tuple[dict, int]:
    prefix = f.read(8)
    if len(prefix) < 8:
        raise CheckpointError(f"frost.load: {path} is not a frost checkpoint: it has only {size} bytes "
                              f"(empty or truncated)")
    (length,) = struct.unpack("<Q", prefix)
    first = f.read(1)
    if first != b"{" or not 2 <= length <= min(MAX_HEADER, size - 8):
        if prefix[:1] == b"\x80" and prefix[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05") \
                or prefix[:4] == b"PK\x03\x04":
            raise CheckpointError(f"frost.load: {path} is not a frost checkpoint: it looks like a pickle or a "
                                  f"torch.save zip file, which frost never unpickles")
        if first != b"{":
            raise CheckpointError(f"frost.load: {path} is not a frost checkpoint: not a safetensors file (its "
                                  f"header does not start with '{{')")
        raise CheckpointError(f"frost.load: {path} is truncated or not a safetensors file: its header claims "
                              f"{length} bytes but the file has {size} bytes in all")
    raw = first + f.read(length - 1)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"frost.load: {path} is not a frost checkpoint: its safetensors header is not "
                              f"valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"frost.load: {path} is not a frost checkpoint: its header is not a JSON object")
    return header, 8 + length


def _structure(header: dict, path: str):
    meta = header.pop("__metadata__", None)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or STRUCTURE_KEY not in meta:
        raise CheckpointError(f"frost.load: {path} is a safetensors file but not a frost checkpoint (no "
                              f"'{STRUCTURE_KEY}' in its metadata); read plain safetensors files with "
                              f"safetensors.numpy.load_file")
    version = meta.get(VERSION_KEY, "1")
    if not (isinstance(version, str) and version.isdigit()):
        raise CheckpointError(f"frost.load: {path} is damaged: its {VERSION_KEY} is {version!r}, not a number")
    if int(version) > VERSION:
        raise CheckpointError(f"frost.load: {path} was written by a newer Frost (checkpoint format {version}; this "
                              f"one reads up to {VERSION}); upgrade Frost to read it")
    try:
        return json.loads(meta[STRUCTURE_KEY])
    except (TypeError, json.JSONDecodeError, RecursionError) as e:
        raise CheckpointError(f"frost.load: {path} is damaged: its frost metadata is not valid JSON ({e})") from None


def _check_entries(header: dict, data_size: int, path: str) -> dict[str, dict]:
    """Validate every tensor entry (dtype, shape, byte range) before reading anything."""
    end_max = 0
    for name, entry in header.items():
        try:
            dtype, shape, (begin, end) = _NAMES[entry["dtype"]], entry["shape"], entry["data_offsets"]
            ok = all(isinstance(n, int) and n >= 0 for n in (*shape, begin, end)) and begin <= end
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise CheckpointError(f"frost.load: {path} is damaged: bad header entry for tensor {name!r}: {entry!r}")
        nbytes = math.prod(shape) * to_dtype(dtype).itemsize
        if end - begin != nbytes:
            raise CheckpointError(f"frost.load: {path} is damaged: tensor {name!r} of shape {tuple(shape)} and "
                                  f"dtype {dtype} needs {nbytes} bytes but its entry spans {end - begin}")
        end_max = max(end_max, end)
    if end_max > data_size:
        raise CheckpointError(f"frost.load: {path} is truncated: its tensors need {end_max} bytes of data but "
                              f"the file has {data_size} after the header")
    return header


def _read_array(f: BinaryIO, data_start: int, entry: dict, path: str) -> np.ndarray:
    array = np.empty(entry["shape"], dtype=to_dtype(_NAMES[entry["dtype"]]).np)  # hosts are little-endian
    begin, end = entry["data_offsets"]
    f.seek(data_start + begin)
    if f.readinto(memoryview(array.reshape(-1).view(np.uint8))) != end - begin:
        raise CheckpointError(f"frost.load: {path} is truncated (short read)")
    return array


def _decode(node, tensors: dict[str, Tensor], path: str):
    if not isinstance(node, dict):
        return node
    tag = "tensor" if "tensor" in node else next(iter(node), None) if len(node) == 1 else None
    try:
        body = node[tag] if tag is not None else None
        if tag == "tensor":
            t = tensors[body]
            if t.dtype.name != node["dtype"]:
                raise ValueError(f"tensor {body!r} is {t.dtype.name} in the data but {node['dtype']} in the metadata")
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
