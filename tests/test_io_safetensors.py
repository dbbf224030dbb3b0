"""frost.load of Hugging Face safetensors files (a plain model.safetensors and a sharded index, written here by the
safetensors package) and of frost checkpoints with PyTorch's map_location."""
import json

import numpy as np
import pytest
import safetensors.numpy

import frost
from frost.io import CheckpointError

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")


def _weights() -> dict:
    g = torch.Generator().manual_seed(0)
    return {"embed.weight": torch.randn(5, 4, generator=g), "layer.0.bias": torch.randn(4, generator=g).double(),
            "layer.0.weight": torch.randn(4, 4, generator=g).to(torch.bfloat16),
            "positions": torch.arange(7, dtype=torch.int64), "mask": torch.tensor([True, False]),
            "scalar": torch.tensor(2.5, dtype=torch.float16)}


def _assert_same(loaded: dict, expected: dict) -> None:
    assert sorted(loaded) == sorted(expected)
    for name, t in expected.items():
        assert loaded[name].dtype.name == str(t.dtype).removeprefix("torch."), name
        np.testing.assert_array_equal(loaded[name].float().numpy(), t.float().numpy(), err_msg=name)


def test_a_plain_model_safetensors_loads_as_a_dict(tmp_path):
    weights = _weights()
    path = tmp_path / "model.safetensors"
    safetensors_torch.save_file(weights, path, metadata={"format": "pt"})
    loaded = frost.load(path)
    _assert_same(loaded, weights)
    model = frost.nn.Linear(4, 4)
    model.load_state_dict({"weight": loaded["layer.0.weight"].float(), "bias": loaded["layer.0.bias"].float()})
    np.testing.assert_array_equal(model.weight.detach().numpy(), weights["layer.0.weight"].float().numpy())


def _write_sharded(folder, weights: dict, shards: list[list[str]]) -> str:
    weight_map = {}
    for i, names in enumerate(shards):
        shard = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        safetensors_torch.save_file({n: weights[n] for n in names}, folder / shard, metadata={"format": "pt"})
        weight_map.update({n: shard for n in names})
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return str(index)


def test_a_sharded_checkpoint_loads_through_its_index(tmp_path):
    weights = _weights()
    index = _write_sharded(tmp_path, weights, [["embed.weight", "positions"], ["layer.0.bias", "layer.0.weight"],
                                               ["mask", "scalar"]])
    loaded = frost.load(index)
    _assert_same(loaded, weights)
    assert list(loaded) == list(json.loads(open(index).read())["weight_map"])  # the index's order


def test_sharded_errors_name_the_index_and_the_shard(tmp_path):
    weights = _weights()
    index = _write_sharded(tmp_path, weights, [["embed.weight"], ["positions"]])
    content = json.loads(open(index).read())
    bad = tmp_path / "bad.safetensors.index.json"
    for weight_map, error, what in [
            ({"x": "../model-00001-of-00002.safetensors"}, CheckpointError, "names the shard '../model-00001"),
            ({"x": "/etc/passwd"}, CheckpointError, "names the shard '/etc/passwd'"),
            ({"x": "missing.safetensors"}, FileNotFoundError, "names the shard missing.safetensors, which is not"),
            ({"embed.weight": content["weight_map"]["positions"]}, CheckpointError,
             "puts tensor 'embed.weight' in model-00002-of-00002.safetensors, which does not hold it"),
            ([1, 2], CheckpointError, "is not a safetensors index: it has no weight_map")]:
        bad.write_text(json.dumps({"weight_map": weight_map}))
        with pytest.raises(error, match=f"frost.load: .*bad.safetensors.index.json {what}"):
            frost.load(bad)
    bad.write_text("{not json")
    with pytest.raises(CheckpointError, match="bad.safetensors.index.json is not a safetensors index: not valid JSON"):
        frost.load(bad)


def test_a_damaged_shard_is_named(tmp_path):
    index = _write_sharded(tmp_path, _weights(), [["embed.weight"], ["positions"]])
    shard = tmp_path / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-3])
    with pytest.raises(CheckpointError, match="read_safetensors: .*model-00002-of-00002.safetensors is truncated"):
        frost.load(index)


def test_numpy_written_files_load_too(tmp_path):
    path = tmp_path / "np.safetensors"
    arrays = {"a": np.arange(6, dtype=np.int32).reshape(2, 3), "b": np.ones((0, 2), np.float32)}
    safetensors.numpy.save_file(arrays, path)
    loaded = frost.load(path)
    np.testing.assert_array_equal(loaded["a"].numpy(), arrays["a"])
    assert loaded["b"].shape == (0, 2)


# ---------------------------------------------------------------- map_location


def test_map_location_forms_on_the_cpu(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    frost.save({"w": frost.ones(2, 3), "tied": [frost.zeros(1)]}, path)
    for where in ("cpu", frost.Device("cpu"), frost.device("cpu"), {"cpu": "cpu"}, {"cuda:0": "cpu"}, None):
        loaded = frost.load(path, map_location=where)
        assert loaded["w"].device == "cpu" and loaded["w"].tolist() == [[1.0] * 3] * 2
    seen = []

    def to_double(t, location):
        seen.append(location)
        return t.double()

    loaded = frost.load(path, map_location=to_double)
    assert loaded["w"].dtype == frost.float64 and loaded["tied"][0].dtype == frost.float64 and seen == ["cpu"] * 2
    assert frost.load(path, map_location=lambda t, loc: None)["w"].dtype == frost.float32
    assert frost.load(path, "cpu", weights_only=True)["w"].shape == (2, 3)


def test_map_location_also_places_safetensors_files(tmp_path):
    path = tmp_path / "model.safetensors"
    safetensors_torch.save_file({"w": torch.ones(2)}, path)
    assert frost.load(path, map_location=lambda t, loc: t * 3)["w"].tolist() == [3.0, 3.0]


def test_bad_map_location_is_refused(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    frost.save({"w": frost.ones(2)}, path)
    with pytest.raises(TypeError, match="frost.load: give device or map_location, not both"):
        frost.load(path, "cpu", map_location="cpu")
    with pytest.raises(TypeError, match="frost.load: map_location must be a device, a dict or a callable, got int"):
        frost.load(path, map_location=3)
    with pytest.raises(TypeError, match="frost.load: map_location returned a list"):
        frost.load(path, map_location=lambda t, loc: [t])
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        frost.load(path, map_location="tpu")


@pytest.mark.cuda
def test_map_location_cuda_matches_the_cpu_load(tmp_path):
    path = tmp_path / "model.safetensors"
    safetensors_torch.save_file(_weights(), path)
    on_cpu = frost.load(path)
    for where in ("cuda", "cuda:0", frost.device("cuda", 0), {"cpu": "cuda:0"}):
        on_gpu = frost.load(path, map_location=where)
        for name, t in on_cpu.items():
            assert on_gpu[name].device == "cuda:0"
            np.testing.assert_array_equal(on_gpu[name].cpu().float().numpy(), t.float().numpy())
