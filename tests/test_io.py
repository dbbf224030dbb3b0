"""frost.save / frost.load: exact round trips, safetensors compatibility, atomic writes, clear errors."""
from io import BytesIO
import ast
import json
import os
import pickle
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch

import frost
from frost import io, nn
from frost.io import CheckpointError
from frost.optim import AdamW, lr_scheduler

DTYPES = ["float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool"]


def sample(dtype: str, shape, seed: int = 0) -> frost.Tensor:
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return frost.Tensor(rng.random(shape) < 0.5)
    np_dtype = frost.dtype.to_dtype(dtype).np
    if np_dtype.kind in "iu":
        info = np.iinfo(np_dtype)
        return frost.Tensor(rng.integers(info.min, info.max, size=shape, dtype=np_dtype, endpoint=True))
    return frost.Tensor((rng.standard_normal(shape) * 100).astype(np_dtype))


def assert_same(a: frost.Tensor, b: frost.Tensor) -> None:
    assert isinstance(b, frost.Tensor) and a.dtype == b.dtype and a.shape == b.shape
    assert a.detach().numpy().tobytes() == b.detach().numpy().tobytes()  # bit for bit (NaN payloads and -0.0 included)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 4, 5)])
def test_every_dtype_and_shape_round_trips_exactly(dtype, shape, tmp_path):
    t = sample(dtype, shape)
    frost.save(t, tmp_path / "t.safetensors")
    assert_same(t, frost.load(tmp_path / "t.safetensors"))


def test_special_float_values_round_trip(tmp_path):
    t = frost.Tensor(np.array([np.nan, np.inf, -np.inf, -0.0, 5e-324, 1.7976931348623157e308]))
    b = frost.Tensor(np.array([np.nan, np.inf, -0.0, 1e-40], dtype=ml_dtypes.bfloat16))
    frost.save({"f64": t, "bf16": b}, tmp_path / "x.safetensors")
    out = frost.load(tmp_path / "x.safetensors")
    assert_same(t, out["f64"])
    assert_same(b, out["bf16"])


def test_nested_structure_round_trips(tmp_path):
    w = frost.randn(4, 3)
    obj = {
        "model": {"fc.weight": w, "fc.bias": frost.zeros(3).bfloat16(), "bn.num_batches_tracked": frost.tensor(7)},
        "optimizer": {"state": {0: {"step": frost.tensor(10.0), "exp_avg": frost.ones(4, 3)}},
                      "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999), "eps": 1e-8, "params": [0, 1],
                                        "nesterov": False, "initial_lr": None}]},
        "step": 10,
        "values": [1, 2.5, "unicode ✓ naïve", None, True, [], {}, (), float("inf"), float("-inf"), 2 ** 70],
        "mixed keys": {1: "int", "1": "str", 2.5: "float", None: "none"},
        "bool keys": {True: "yes", False: "no"},  # apart: True == 1 would merge with the int key above
        "masks": [frost.Tensor(np.array([True, False])), (frost.arange(5), frost.tensor(3.0).reshape(()))],
    }
    frost.save(obj, tmp_path / "ckpt.safetensors")
    out = frost.load(tmp_path / "ckpt.safetensors")

    def compare(a, b):
        assert type(a) is type(b), (a, b)
        if isinstance(a, frost.Tensor):
            assert_same(a, b)
        elif isinstance(a, dict):
            assert list(a) == list(b)  # keys, their types and their order
            for k in a:
                assert type(k) is type(next(kk for kk in b if kk == k and type(kk) is type(k)))
                compare(a[k], b[k])
        elif isinstance(a, (list, tuple)):
            assert len(a) == len(b)
            for x, y in zip(a, b):
                compare(x, y)
        else:
            assert a == b

    compare(obj, out)
    assert out["optimizer"]["state"][0]["step"].dtype == frost.float32


def test_a_float_nan_value_round_trips(tmp_path):
    frost.save({"loss": float("nan")}, tmp_path / "n.safetensors")
    assert np.isnan(frost.load(tmp_path / "n.safetensors")["loss"])


def test_a_tensor_saved_twice_is_stored_once_and_loaded_as_one(tmp_path):
    w = frost.randn(8, 8)
    frost.save({"embed": w, "head": w}, tmp_path / "tied.safetensors")
    out = frost.load(tmp_path / "tied.safetensors")
    assert out["embed"] is out["head"]
    assert len(safetensors.numpy.load_file(tmp_path / "tied.safetensors")) == 1


def test_non_contiguous_and_numpy_scalars(tmp_path):
    base = frost.Tensor(np.arange(12.0).reshape(3, 4))
    view = frost.Tensor(base.numpy().T)
    frost.save({"t": view, "n": np.float32(1.5), "i": np.int64(3), "b": np.bool_(True)}, tmp_path / "v.safetensors")
    out = frost.load(tmp_path / "v.safetensors")
    np.testing.assert_array_equal(out["t"].numpy(), base.numpy().T)
    assert out["n"] == 1.5 and out["i"] == 3 and out["b"] is True


def test_loaded_tensors_are_writable_and_independent(tmp_path):
    frost.save({"w": frost.ones(3)}, tmp_path / "w.safetensors")
    t = frost.load(tmp_path / "w.safetensors")["w"]
    t.data[0] = 5.0
    assert frost.load(tmp_path / "w.safetensors")["w"].numpy()[0] == 1.0


def test_files_are_standard_safetensors(tmp_path):
    """Other readers open a frost checkpoint: safetensors' NumPy and torch readers, bfloat16 included."""
    obj = {"model": {"w": sample("float32", (3, 4)), "b": sample("int64", (5,)), "m": sample("bool", (2,))},
           "bf": sample("bfloat16", (6,))}
    path = tmp_path / "c.safetensors"
    frost.save(obj, path)
    arrays = safetensors.numpy.load_file(path)
    assert set(arrays) == {"model/w", "model/b", "model/m", "bf"}
    np.testing.assert_array_equal(arrays["model/w"], obj["model"]["w"].numpy())
    np.testing.assert_array_equal(arrays["model/b"], obj["model"]["b"].numpy())
    np.testing.assert_array_equal(arrays["model/m"], obj["model"]["m"].numpy())
    tensors = safetensors.torch.load_file(path)
    assert tensors["bf"].dtype == torch.bfloat16
    np.testing.assert_array_equal(tensors["bf"].float().numpy(), obj["bf"].numpy().astype(np.float32))
    (length,) = struct.unpack("<Q", path.read_bytes()[:8])
    assert length % 8 == 0


def test_load_to_a_device(tmp_path):
    frost.save({"w": frost.ones(2)}, tmp_path / "d.safetensors")
    assert frost.load(tmp_path / "d.safetensors", device="cpu")["w"].device == "cpu"


@pytest.mark.cuda
def test_cuda_tensors_are_saved_from_and_loaded_to_the_gpu(tmp_path):
    w = frost.randn(4, 4).cuda()
    frost.save({"w": w, "step": 3}, tmp_path / "g.safetensors")
    cpu = frost.load(tmp_path / "g.safetensors")
    gpu = frost.load(tmp_path / "g.safetensors", device="cuda")
    assert cpu["w"].device == "cpu" and gpu["w"].device == "cuda:0"
    np.testing.assert_array_equal(cpu["w"].numpy(), w.numpy())
    np.testing.assert_array_equal(gpu["w"].numpy(), w.numpy())


# ---------------------------------------------------------------- atomic writes


def test_a_failed_save_leaves_the_old_file_intact(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.safetensors"
    frost.save({"w": frost.ones(1000), "step": 1}, path)
    old_bytes = path.read_bytes()

    def failing_writer(f, tensors):
        f.write(b"\0" * 100)  # part of the data is already out when the failure comes
        raise OSError("disk full")

    monkeypatch.setattr(io, "_write_tensors", failing_writer)
    with pytest.raises(OSError, match="disk full"):
        frost.save({"w": frost.zeros(1000), "step": 2}, path)
    assert path.read_bytes() == old_bytes
    assert frost.load(path)["step"] == 1
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]  # no temporary file left behind


def test_a_failed_first_save_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.setattr(io, "_write_tensors", lambda f, tensors: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        frost.save({"w": frost.ones(3)}, tmp_path / "new.safetensors")
    assert os.listdir(tmp_path) == []


def test_save_goes_through_a_temporary_file_and_a_rename(tmp_path, monkeypatch):
    calls = []
    real_replace, real_fsync = os.replace, os.fsync
    monkeypatch.setattr(io.os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(io.os, "replace", lambda a, b: (calls.append(("replace", os.path.dirname(a))),
                                                        real_replace(a, b))[1])
    frost.save({"w": frost.ones(3)}, tmp_path / "r.safetensors")
    assert calls[0] == "fsync" and calls[1] == ("replace", str(tmp_path))
    assert frost.load(tmp_path / "r.safetensors")["w"].shape == (3,)


def test_save_overwrites_and_errors_on_unsavable_values(tmp_path):
    path = tmp_path / "o.safetensors"
    frost.save({"a": 1}, path)
    frost.save({"a": 2}, path)
    assert frost.load(path) == {"a": 2}
    with pytest.raises(TypeError, match=r"cannot save a object at obj\['model'\]\['x'\]"):
        frost.save({"model": {"x": object()}}, path)
    with pytest.raises(TypeError, match=r"cannot save a ndarray at obj\['a'\]\[0\]"):
        frost.save({"a": [np.zeros(2)]}, path)
    with pytest.raises(TypeError, match=r"cannot save the dict key \(1, 2\)"):
        frost.save({(1, 2): 3}, path)
    with pytest.raises(FileNotFoundError, match="the folder .*missing does not exist"):
        frost.save({"a": 1}, tmp_path / "missing" / "x.safetensors")
    assert frost.load(path) == {"a": 2}


# ---------------------------------------------------------------- loading what is not a frost checkpoint


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="frost.load: no such file: .*nope.safetensors"):
        frost.load(tmp_path / "nope.safetensors")
    with pytest.raises(IsADirectoryError, match="is a folder"):
        frost.load(tmp_path)


def test_truncated_files_are_named_as_truncated(tmp_path):
    good = tmp_path / "good.safetensors"
    frost.save({"w": frost.randn(64, 64), "step": 3}, good)
    data = good.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    for cut, what in [(0, "empty or truncated"), (5, "empty or truncated"), (8 + length // 2, "truncated"),
                      (8 + length + 100, "truncated"), (len(data) - 1, "truncated")]:
        bad = tmp_path / f"cut{cut}.safetensors"
        bad.write_bytes(data[:cut])
        with pytest.raises(CheckpointError, match=f"frost.load: .*cut{cut}.safetensors .*{what}"):
            frost.load(bad)


def test_random_bytes(tmp_path):
    path = tmp_path / "random.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(CheckpointError, match="random.bin is not a frost checkpoint"):
        frost.load(path)


class _Boom:
    def __reduce__(self):
        return (os.mkdir, (str(_Boom.target),))


def test_a_pickle_is_refused_and_never_unpickled(tmp_path):
    _Boom.target = tmp_path / "unpickled"
    for protocol in (0, 2, 4):
        path = tmp_path / f"evil{protocol}.pkl"
        path.write_bytes(pickle.dumps({"w": _Boom()}, protocol=protocol))
        with pytest.raises(CheckpointError, match=f"evil{protocol}.pkl is not a frost checkpoint"):
            frost.load(path)
    assert not _Boom.target.exists()


def test_a_torch_save_file_is_refused(tmp_path):
    path = tmp_path / "model.pt"
    torch.save({"w": torch.ones(3)}, path)
    with pytest.raises(CheckpointError, match="model.pt is not a frost checkpoint: it looks like a pickle or a "
                                              "torch.save zip file"):
        frost.load(path)


def test_a_plain_safetensors_file_loads_as_a_dict_of_tensors(tmp_path):
    # more in tests/test_io_safetensors.py; a frost-format file without its structure is damaged
    path = tmp_path / "plain.safetensors"
    safetensors.numpy.save_file({"w": np.ones(3, dtype=np.float32)}, path, metadata={"format": "pt"})
    assert frost.load(path)["w"].tolist() == [1.0, 1.0, 1.0]
    safetensors.numpy.save_file({"w": np.ones(3, dtype=np.float32)}, path, metadata={"format": "frost"})
    with pytest.raises(CheckpointError, match="plain.safetensors is damaged: its metadata says format 'frost' but "
                                              "has no 'frost.structure'"):
        frost.load(path)


def _forge(path, tensors: dict, structure) -> None:
    """A safetensors file (written by the safetensors library) whose frost metadata says `structure`."""
    text = structure if isinstance(structure, str) else json.dumps(structure)
    safetensors.numpy.save_file(tensors, path, metadata={"format": "frost", io.STRUCTURE_KEY: text})


def test_damaged_frost_metadata(tmp_path):
    path = tmp_path / "bad.safetensors"
    w = {"w": np.ones(3, dtype=np.float32)}
    _forge(path, w, {"dict": [["w", {"tensor": "w", "dtype": "float32"}]]})
    assert frost.load(path)["w"].shape == (3,)  # the forgery itself is well formed
    for structure, what in [({"tensor": "missing", "dtype": "float32"}, "KeyError"),
                            ({"tensor": "w", "dtype": "int64"}, "is float32 in the data but int64 in the metadata"),
                            ({"set": [1, 2]}, "unknown tag 'set'"),
                            ({"dict": [[["unhashable"], 1]]}, "TypeError"),
                            ("{not json", "not valid JSON"),
                            ("[" * 100_000 + "]" * 100_000, "nests deeper than 512 levels"),  # a crafted header
                            ('{"list": [' * 3000 + "]}" * 3000, "nests deeper than 512 levels")]:
        _forge(path, w, structure)
        with pytest.raises(CheckpointError, match=f"bad.safetensors is damaged: .*{what}"):
            frost.load(path)


def test_damaged_header_entries(tmp_path):
    path = tmp_path / "h.safetensors"
    structure = json.dumps({"tensor": "w", "dtype": "float32"})

    def write(entry: dict, data: bytes = b"\0" * 12):
        header = {"__metadata__": {"format": "frost", io.STRUCTURE_KEY: structure}, "w": entry}
        text = json.dumps(header).encode()
        path.write_bytes(struct.pack("<Q", len(text)) + text + data)

    write({"dtype": "F32", "shape": [3], "data_offsets": [0, 12]})
    np.testing.assert_array_equal(frost.load(path).numpy(), np.zeros(3))
    write({"dtype": "F32", "shape": [4], "data_offsets": [0, 12]})
    with pytest.raises(CheckpointError, match=r"h.safetensors is damaged: tensor 'w' of shape \(4,\) and dtype "
                                              r"float32 needs 16 bytes but its entry spans 12"):
        frost.load(path)
    write({"dtype": "C64", "shape": [3], "data_offsets": [0, 12]})
    with pytest.raises(CheckpointError, match="bad header entry for tensor 'w'"):
        frost.load(path)
    write({"dtype": "F32", "shape": [-3], "data_offsets": [0, 12]})
    with pytest.raises(CheckpointError, match="bad header entry for tensor 'w'"):
        frost.load(path)
    write({"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}, data=b"\0" * 8)
    with pytest.raises(CheckpointError, match="truncated: its tensors need 12 bytes of data but the file has 8"):
        frost.load(path)
    path.write_bytes(struct.pack("<Q", 4) + b"[1] ")
    with pytest.raises(CheckpointError, match="not a safetensors file"):
        frost.load(path)
    path.write_bytes(struct.pack("<Q", 0) + b"{}")
    with pytest.raises(CheckpointError, match="header claims 0 bytes"):
        frost.load(path)
    path.write_bytes(struct.pack("<Q", 4) + b"{\xff\xfe}")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        frost.load(path)


def test_optimizer_and_model_checkpoint_round_trip(tmp_path):
    """The common case: {'model': ..., 'optimizer': ..., 'step': n} back into fresh objects."""
    from frost.optim import AdamW
    params = [frost.randn(3, 2, requires_grad=True), frost.randn(2, requires_grad=True)]
    opt = AdamW(params, lr=0.01)
    for p in params:
        p.grad = frost.ones_like(p)
    opt.step()
    frost.save({"model": {"w": params[0], "b": params[1]}, "optimizer": opt.state_dict(), "step": 1},
               tmp_path / "ckpt.safetensors")
    ckpt = frost.load(tmp_path / "ckpt.safetensors")
    assert ckpt["step"] == 1
    assert ckpt["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    assert_same(params[0], ckpt["model"]["w"])
    for key in ("exp_avg", "exp_avg_sq", "step"):
        assert_same(opt.state[params[1]][key], ckpt["optimizer"]["state"][1][key])


def test_training_resumes_bit_identically_from_a_checkpoint(tmp_path):
    """model + optimizer + scheduler saved at step 5 of 12 and resumed in fresh objects: same weights as
    uninterrupted."""
    rng = np.random.default_rng(0)
    x = frost.Tensor(rng.standard_normal((16, 3)).astype(np.float32))
    y = frost.Tensor(rng.standard_normal((16, 2)).astype(np.float32))

    def build(seed):
        frost.manual_seed(seed)
        model = nn.Sequential(nn.Linear(3, 8), nn.Linear(8, 2))
        opt = AdamW(model.parameters(), lr=0.01)
        sched = lr_scheduler.SequentialLR(opt, [lr_scheduler.LinearWarmup(opt, 3),
                                                lr_scheduler.CosineAnnealingLR(opt, 9)], [3])
        return model, opt, sched

    def train(model, opt, sched, steps):
        for _ in range(steps):
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
            sched.step()

    model, opt, sched = build(0)
    train(model, opt, sched, 5)
    frost.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                "step": 5}, tmp_path / "ckpt.safetensors")
    train(model, opt, sched, 7)

    ckpt = frost.load(tmp_path / "ckpt.safetensors")
    model2, opt2, sched2 = build(1)  # different initial weights: everything must come from the checkpoint
    model2.load_state_dict(ckpt["model"])
    opt2.load_state_dict(ckpt["optimizer"])
    sched2.load_state_dict(ckpt["scheduler"])
    train(model2, opt2, sched2, 12 - ckpt["step"])
    for (name, a), (_, b) in zip(model.state_dict().items(), model2.state_dict().items()):
        assert a.numpy().tobytes() == b.numpy().tobytes(), name
    assert sched2.get_last_lr() == sched.get_last_lr()


@pytest.mark.cuda
def test_a_jitted_cuda_run_resumes_bit_identically_from_model_optimizer_and_rng(tmp_path):
    """A frost.jit training step with dropout (the mask drawn on the device each replay) and AdamW on its flat
    buffers: saved at step 6 of 14 (model, optimizer, CUDA RNG state) and resumed in fresh objects under a fresh
    jit, the last 8 losses and the final weights equal the uninterrupted run's, bit for bit."""
    rng = np.random.default_rng(0)
    x = frost.tensor(rng.standard_normal((32, 16)).astype(np.float32), device="cuda")
    y = frost.tensor(rng.integers(0, 4, 32), device="cuda")

    def build(seed):
        frost.manual_seed(seed)
        model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 4)).to("cuda")
        opt = AdamW(model.parameters(), lr=1e-2)

        def step(x, y):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss
        return model, opt, frost.jit(step)

    def train(step, steps):
        return [step(x, y).item() for _ in range(steps)]

    model, opt, step = build(0)
    train(step, 6)
    frost.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "rng": frost.cuda.get_rng_state()},
               tmp_path / "ckpt.safetensors")
    losses = train(step, 8)

    ckpt = frost.load(tmp_path / "ckpt.safetensors")
    model2, opt2, step2 = build(1)  # other weights and another seed: everything must come from the checkpoint
    model2.load_state_dict(ckpt["model"])
    opt2.load_state_dict(ckpt["optimizer"])
    frost.cuda.set_rng_state(ckpt["rng"])
    assert train(step2, 8) == losses
    for (name, a), (_, b) in zip(model.state_dict().items(), model2.state_dict().items()):
        assert a.cpu().numpy().tobytes() == b.cpu().numpy().tobytes(), name


def test_load_keeps_requires_grad_and_tied_weights_share_one_tensor(tmp_path):
    """torch.load's behaviour: a saved parameter still requires grad, and one tied weight, reached through two
    state_dict entries (different detached Tensor objects over the same memory), is stored once and loads as one."""
    w = frost.ones(2, requires_grad=True)
    frost.save({"params": [w]}, tmp_path / "raw.frost")
    assert frost.load(tmp_path / "raw.frost")["params"][0].requires_grad
    emb, lin = frost.nn.Embedding(5, 3), frost.nn.Linear(3, 5, bias=False)
    lin.weight = emb.weight
    frost.save({"emb": emb.state_dict()["weight"], "lin": lin.state_dict()["weight"]}, tmp_path / "tied.frost")
    loaded = frost.load(tmp_path / "tied.frost")
    assert loaded["emb"] is loaded["lin"] and not loaded["emb"].requires_grad
    assert len(safetensors.numpy.load_file(tmp_path / "tied.frost")) == 1


def test_a_checkpoint_from_a_newer_frost_says_so(tmp_path):
    path = tmp_path / "newer.frost"
    frost.save({"w": frost.ones(2)}, path)
    (length,) = struct.unpack("<Q", path.read_bytes()[:8])
    header = json.loads(path.read_bytes()[8:8 + length])
    assert header["__metadata__"]["frost.version"] == "1"
    header["__metadata__"]["frost.version"] = "2"
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + path.read_bytes()[8 + length:])
    with pytest.raises(CheckpointError, match=r"newer.frost was written by a newer Frost \(checkpoint format 2"):
        frost.load(path)


@pytest.mark.parametrize("written", ["~/runs/ckpt.safetensors", "$RUNS/ckpt.safetensors", "${RUNS}/ckpt.safetensors"])
def test_save_and_load_expand_home_and_environment_variables(tmp_path, monkeypatch, written):
    (tmp_path / "runs").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("RUNS", str(tmp_path / "runs"))
    monkeypatch.chdir(tmp_path)  # a path taken literally would land in ./~ or ./$RUNS
    weights = frost.arange(6, dtype="float32").reshape(2, 3)
    frost.save({"w": weights}, written)
    assert sorted(os.listdir(tmp_path / "runs")) == ["ckpt.safetensors"]
    assert_same(frost.load(written)["w"], weights)
    assert_same(frost.load(tmp_path / "runs" / "ckpt.safetensors")["w"], weights)
    monkeypatch.delenv("FROST_UNSET_VARIABLE", raising=False)
    assert io.expand_path("$FROST_UNSET_VARIABLE/x") == "$FROST_UNSET_VARIABLE/x"  # left as written, as the shell


# ---------------------------------------------------------------- crafted headers: bounded work, clear errors


def _craft(path, entries: dict | str, data: bytes, metadata: dict | None = None) -> None:
    """A file with the header `entries` (a dict, or raw JSON text) as a hostile writer would make it."""
    meta = {"format": "frost", io.STRUCTURE_KEY: json.dumps({"tensor": "a", "dtype": "float32"}), **(metadata or {})}
    text = entries if isinstance(entries, str) else json.dumps({"__metadata__": meta, **entries})
    path.write_bytes(struct.pack("<Q", len(text)) + text.encode() + data)


def _f32(begin: int, end: int, shape=None) -> dict:
    return {"dtype": "F32", "shape": [(end - begin) // 4] if shape is None else shape, "data_offsets": [begin, end]}


_META = json.dumps({"format": "frost", io.STRUCTURE_KEY: json.dumps({"tensor": "a", "dtype": "float32"})})
CRAFTED = {
    "overlap": ({"a": _f32(0, 12), "b": _f32(0, 12)}, 12, {}, r"tensor 'b' spans bytes 0\.\.12 of the data, "
                                                             r"overlapping another tensor's bytes"),
    "gap": ({"a": _f32(4, 16)}, 16, {}, r"tensor 'a' spans bytes 4\.\.16 of the data, leaving bytes 0\.\.4 unused"),
    "huge_integer": ('{"__metadata__":' + _META + ',"a":{"dtype":"F32","shape":[' + "9" * 5000
                     + '],"data_offsets":[0,0]}}', 0, {}, "header is not valid JSON"),
    "bytes_after_the_last_tensor": ({"a": _f32(0, 12)}, 16, {}, "has 4 bytes after its last tensor"),
    "past_the_end": ({"a": _f32(0, 12), "b": _f32(12, 24)}, 20, {}, "truncated: its tensors need 24 bytes"),
    "bool_in_shape": ({"a": _f32(0, 12, [True, 3])}, 12, {}, r"entry for tensor 'a': the shape is not a list of "
                                                             r"non-negative integers"),
    "float_in_shape": ({"a": _f32(0, 12, [3.0])}, 12, {}, "entry for tensor 'a': the shape is not a list"),
    "negative_offset": ({"a": {"dtype": "F32", "shape": [0], "data_offsets": [-4, -4]}}, 0, {},
                        "entry for tensor 'a': data_offsets is not"),
    "100_dimensions": ({"a": _f32(0, 12, [1] * 99 + [3])}, 12, {},
                       "entry for tensor 'a': 100 dimensions, more than 32"),
    "empty_but_huge": ({"a": _f32(0, 0, [2 ** 62, 0])}, 0, {}, "entry for tensor 'a': the shape is too large"),
    "deep_nesting": ('{"__metadata__":' + _META + ',"a":' + "[" * 5000 + "]" * 5000 + "}", 0, {},
                     "header nests deeper than 3 levels"),
    "a_name_twice": ('{"__metadata__":' + _META + ',"a":' + json.dumps(_f32(0, 12)) + ',"a":'
                     + json.dumps(_f32(12, 24)) + "}", 24, {}, "names the entry 'a' twice"),
    "metadata_not_strings": ({"a": _f32(0, 12)}, 12, {"extra": 1}, "__metadata__ holds values that are not strings"),
}


@pytest.mark.parametrize("case", CRAFTED, ids=list(CRAFTED))
def test_crafted_headers_are_refused_naming_the_file_and_entry(case, tmp_path):
    """Each crafted header gives one CheckpointError before any tensor is allocated (on the code before: loaded
    anyway, or a RecursionError, TypeError or NumPy ValueError)."""
    entries, nbytes, metadata, message = CRAFTED[case]
    path = tmp_path / f"{case}.safetensors"
    _craft(path, entries, b"\0" * nbytes, metadata)
    with pytest.raises(CheckpointError, match=f"frost.load: .*{case}.safetensors .*{message}"):
        frost.load(path)


@pytest.mark.parametrize("case", CRAFTED, ids=list(CRAFTED))
def test_the_safetensors_library_refuses_the_same_files(case, tmp_path):
    """Frost validates headers itself (it never imports safetensors): its checks must be at least as strict as the
    reference library's, which refuses every one of these files too."""
    st = pytest.importorskip("safetensors.numpy")
    entries, nbytes, metadata, _ = CRAFTED[case]
    path = tmp_path / f"{case}.safetensors"
    _craft(path, entries, b"\0" * nbytes, metadata)
    with pytest.raises(Exception):
        st.load_file(path)


def test_overlapping_entries_cannot_load_a_file_many_times_over(tmp_path):
    """40 entries over the same 1 MiB would load as 40 MiB: refused before anything is allocated."""
    path = tmp_path / "overlap.safetensors"
    _craft(path, {f"t{i}": _f32(0, 1 << 20) for i in range(40)}, b"\0" * (1 << 20))
    with pytest.raises(CheckpointError, match="tensor 't1' spans bytes 0..1048576 .*overlapping"):
        frost.load(path)


def test_tensors_listed_in_any_order_load_when_they_tile_the_data(tmp_path):
    path = tmp_path / "order.safetensors"
    data = np.arange(6, dtype=np.float32).tobytes()
    _craft(path, {"b": _f32(12, 24), "a": _f32(0, 12)}, data)
    np.testing.assert_array_equal(frost.load(path).numpy(), [0.0, 1.0, 2.0])


def test_the_number_of_entries_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(io, "MAX_ENTRIES", 2)
    path = tmp_path / "many.safetensors"
    frost.save([frost.ones(1), frost.ones(2), frost.ones(3)], path)
    with pytest.raises(CheckpointError, match="many.safetensors is damaged: its header lists 3 tensors, more than "
                                              "the 2"):
        frost.load(path)


def test_save_refuses_what_load_would_refuse(tmp_path):
    path = tmp_path / "s.safetensors"
    with pytest.raises(ValueError, match=r"cannot save the 33-dimensional tensor at obj\['w'\]"):
        frost.save({"w": frost.ones(*[1] * 33)}, path)
    deep = nested = []
    for _ in range(300):
        nested.append([])
        nested = nested[0]
    with pytest.raises(ValueError, match="nests deeper than frost.load reads"):
        frost.save(deep, path)
    assert not path.exists()
    ok = nested = []
    for _ in range(200):
        nested.append([])
        nested = nested[0]
    frost.save(ok, path)
    assert frost.load(path) == ok


# ---------------------------------------------------------------- a save killed outright


_STALLED_SAVE = """
import sys, time
import frost
from frost import io

def stall(f, tensors):
    f.write(b"\\0" * 100)
    f.flush()
    print("writing", flush=True)
    time.sleep(120)

io._write_tensors = stall
frost.save({"w": frost.ones(10)}, sys.argv[1])
"""


@pytest.mark.skipif(os.name != "posix", reason="SIGKILL and pid probing are POSIX")
def test_the_next_save_removes_the_temporary_file_of_a_killed_save(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    child = subprocess.Popen([sys.executable, "-c", _STALLED_SAVE, str(path)], stdout=subprocess.PIPE, env=env)
    try:
        assert child.stdout.readline() == b"writing\n"
    finally:
        child.kill()  # SIGKILL: no handler runs, the temporary file stays
        child.wait()
    (left,) = os.listdir(tmp_path)
    assert left.startswith(".ckpt.safetensors.") and left.endswith(".tmp")
    frost.save({"w": frost.zeros(2)}, path)
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]
    np.testing.assert_array_equal(frost.load(path)["w"].numpy(), [0.0, 0.0])


def test_save_keeps_temporary_files_that_may_still_be_written(tmp_path):
    """A live process's file (this one's), another host's (its pid means nothing here) and other targets' stay."""
    kept = [io.temporary_name("ckpt.safetensors", io._HOST, os.getpid()),
            io.temporary_name("ckpt.safetensors", "another-host", 2 ** 22 + 1),
            io.temporary_name("other.safetensors", io._HOST, 2 ** 22 + 1)]
    for name in kept:
        (tmp_path / name).write_bytes(b"partial")
    frost.save({"w": frost.ones(1)}, tmp_path / "ckpt.safetensors")
    assert sorted(os.listdir(tmp_path)) == sorted(kept + ["ckpt.safetensors"])


@pytest.mark.parametrize("order", ["C", "F"])
def test_an_npz_member_reads_as_numpy_loads_it(tmp_path, order):
    x = np.asarray(np.arange(2 * 3 * 4, dtype=np.uint16).reshape(2, 3, 4), order=order)
    np.savez_compressed(tmp_path / "p.npz", x=x)
    got = io.read_npz_array(tmp_path / "p.npz", "x")
    want = np.load(tmp_path / "p.npz")["x"]
    assert got.dtype == want.dtype and got.flags.f_contiguous == want.flags.f_contiguous
    np.testing.assert_array_equal(got, want)


def test_an_npy_2_0_member_reads_as_numpy_loads_it(tmp_path):
    buf = BytesIO()
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    np.lib.format.write_array(buf, x, version=(2, 0))
    got = io.read_npz_array(_npz_with_member(tmp_path / "v2.npz", buf.getvalue()), "x")
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got, x)


def _npz_with_member(path, raw: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x.npy", raw)
    return path


def test_a_damaged_npz_member_is_named(tmp_path):
    buf = BytesIO()
    np.save(buf, np.zeros((4, 32, 32, 3), np.uint8))
    whole = buf.getvalue()
    cut = _npz_with_member(tmp_path / "cut.npz", whole[:-100])
    with pytest.raises(ValueError, match=r"cut.npz: x.npy ends after 12188 of its 12288 bytes"):
        io.read_npz_array(cut, "x")
    buf = BytesIO()   # a header that claims far more than the member holds is refused before anything is read
    np.lib.format.write_array_header_1_0(buf, {"descr": "|u1", "fortran_order": False, "shape": (10**6, 32, 32, 3)})
    big = _npz_with_member(tmp_path / "big.npz", buf.getvalue() + bytes(64))
    with pytest.raises(ValueError, match=r"big.npz: x.npy claims \(1000000, 32, 32, 3\) uint8, which it does not"):
        io.read_npz_array(big, "x")
    buf = BytesIO()
    np.lib.format.write_array(buf, np.zeros(3, np.dtype([("é", np.uint8)])), version=(3, 0))
    v3 = _npz_with_member(tmp_path / "v3.npz", buf.getvalue())
    with pytest.raises(ValueError, match=r"v3.npz: x.npy is not a readable .npy file: an .npy file of version "
                                         r"\(3, 0\), not 1.0 or 2.0"):
        io.read_npz_array(v3, "x")
    buf = BytesIO()
    np.save(buf, np.array([None, 1], dtype=object), allow_pickle=True)
    objects = _npz_with_member(tmp_path / "objects.npz", buf.getvalue())
    with pytest.raises(ValueError, match=r"objects.npz: x.npy holds Python objects \(object\), which frost never unp"):
        io.read_npz_array(objects, "x")


def test_an_npy_file_reads_under_the_parse_lock(tmp_path, monkeypatch):
    literal_eval, held = ast.literal_eval, []   # what NumPy parses a header with, and CPython 3.11 not in two threads

    def checked(text):
        held.append(io.PARSE_LOCK.locked())
        return literal_eval(text)
    monkeypatch.setattr(ast, "literal_eval", checked)
    np.save(tmp_path / "t.npy", np.arange(5, dtype=np.uint16))
    np.testing.assert_array_equal(io.read_npy(tmp_path / "t.npy"), np.arange(5))
    assert io.read_npy(tmp_path / "t.npy", mmap_mode="r").dtype == np.uint16 and held == [True, True]
    np.save(tmp_path / "o.npy", np.array([None], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match=r"o.npy holds Python objects \(object\), which frost never unpickles"):
        io.read_npy(tmp_path / "o.npy")
    with pytest.raises(ValueError, match="o.npy"):
        io.read_npy(tmp_path / "o.npy", mmap_mode="r")
    with open(tmp_path / "z.npy", "wb") as f:   # a zip under an .npy name: np.load would give a lazy NpzFile
        np.savez(f, x=np.zeros(2))
    with pytest.raises(ValueError, match=r"z.npy: not an .npy file \(np.load found NpzFile\)"):
        io.read_npy(tmp_path / "z.npy", mmap_mode="r")
    with pytest.raises(ValueError, match="z.npy is not a readable .npy file: the magic string is not correct"):
        io.read_npy(tmp_path / "z.npy")
    bad = BytesIO()   # a header without the keys NumPy needs
    np.lib.format.write_array_header_1_0(bad, {"descr": "<f8", "fortran_order": False, "shape": (2,)})
    (tmp_path / "bad.npy").write_bytes(bad.getvalue().replace(b"descr", b"descX") + bytes(16))
    with pytest.raises(ValueError, match="bad.npy is not a readable .npy file: Header does not contain the correct"):
        io.read_npy(tmp_path / "bad.npy")


def test_arrays_read_from_npy_and_npz_files_are_writable(tmp_path):
    np.save(tmp_path / "t.npy", np.arange(6, dtype=np.int16).reshape(2, 3))
    np.savez_compressed(tmp_path / "t.npz", x=np.arange(4.0))
    for array in (io.read_npy(tmp_path / "t.npy"), io.read_npz_array(tmp_path / "t.npz", "x")):
        assert array.flags.writeable
        array[0] = 7
    big = BytesIO()   # a header claiming far more than the file holds allocates nothing
    np.lib.format.write_array_header_1_0(big, {"descr": "<f8", "fortran_order": False, "shape": (10**9,)})
    (tmp_path / "big.npy").write_bytes(big.getvalue() + bytes(16))
    with pytest.raises(ValueError, match=r"big.npy claims \(1000000000,\) float64, which it does not hold"):
        io.read_npy(tmp_path / "big.npy")
