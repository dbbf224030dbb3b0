"""The `frost` command: `frost bench resnet-cifar10` on a small generated CIFAR-10 in the binary format."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from frost.cli import main

REPO = Path(__file__).resolve().parents[1]

# ten distinct colours; class k paints an 8x8 patch of colour k at position k of a 2x5 grid
PALETTE = np.array([[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 0], [255, 0, 255],
                    [0, 255, 255], [255, 128, 0], [128, 0, 255], [255, 255, 255], [0, 128, 128]], np.uint8)


def make_images(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """n images (N, 32, 32, 3) uint8 of dim noise with the class written as a coloured patch; labels (N,)."""
    labels = rng.integers(0, 10, n)
    images = rng.integers(0, 60, (n, 32, 32, 3)).astype(np.uint8)
    for i, k in enumerate(labels):
        r, c = 4 + 16 * (k // 5), 1 + 6 * (k % 5)
        images[i, r:r + 8, c:c + 6] = PALETTE[k]
    return images, labels


def write_cifar_binary(root: Path, per_batch: int, n_test: int, seed: int = 0) -> Path:
    """The official binary layout: data_batch_1..5.bin and test_batch.bin, records of label + CHW pixels."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    names = [(f"data_batch_{k}.bin", per_batch) for k in range(1, 6)] + [("test_batch.bin", n_test)]
    for name, n in names:
        images, labels = make_images(n, rng)
        records = np.concatenate([labels.astype(np.uint8)[:, None],
                                  images.transpose(0, 3, 1, 2).reshape(n, 3 * 32 * 32)], axis=1)
        (root / name).write_bytes(records.tobytes())
    return root


@pytest.fixture(scope="module")
def cifar_dir(tmp_path_factory) -> Path:
    return write_cifar_binary(tmp_path_factory.mktemp("cifar") / "cifar-10-batches-bin", per_batch=64, n_test=96)


def _check_result(result: dict, steps: int) -> None:
    for key in ("schema", "framework", "mode", "precision", "device", "device_name", "commit", "command",
                "versions", "protocol", "runs", "summary", "data_load_s"):
        assert key in result, key
    assert result["framework"] == "frost" and result["device"] == "cpu" and result["precision"] == "fp32"
    assert result["protocol"]["batch_size"] == 32 and result["protocol"]["steps"] == steps
    assert result["protocol"]["lr"] == 1e-4 and result["protocol"]["betas"] == [0.9, 0.98]
    assert result["n_train"] == 5 * 64 and result["n_test"] == 96
    (run,) = result["runs"]
    for key in ("seed", "acc_10k", "acc_9984", "train_time_s", "startup_s", "ms_per_step", "loss_curve",
                "steps_timed", "warmup_steps"):
        assert key in run, key
    assert run["seed"] == 0
    assert 0.0 <= run["acc_10k"] <= 1.0 and 0.0 <= run["acc_9984"] <= 1.0
    assert run["train_time_s"] > 0 and run["startup_s"] > 0
    assert run["steps_timed"] + run["warmup_steps"] == steps
    detail = run["startup_detail"]  # where the start-up went: one wall time per warm-up step
    assert len(detail["warmup_step_s"]) == run["warmup_steps"] and detail["build_s"] >= 0
    assert sum(detail["warmup_step_s"]) + detail["build_s"] <= run["setup_s"] + 1e-3
    assert result["summary"]["acc_10k"]["mean"] == pytest.approx(run["acc_10k"])


def test_bench_resnet_cifar10_loss_falls(cifar_dir, tmp_path, capsys):
    out = tmp_path / "result.json"
    main(["bench", "resnet-cifar10", "--device", "cpu", "--steps", "50", "--seeds", "0",
          "--data", str(cifar_dir), "--out", str(out), "--quiet", "--eval-batch", "96"])
    result = json.loads(out.read_text())
    _check_result(result, 50)
    curve = result["runs"][0]["loss_curve"]
    assert [s for s, _ in curve] == list(range(1, 51))  # every step sampled at this size
    losses = [v for _, v in curve]
    assert np.isfinite(losses).all()
    assert np.mean(losses[-10:]) < np.mean(losses[:10]), losses
    printed = capsys.readouterr().out
    assert "acc 10k %" in printed and "results written to" in printed


def test_console_entry_point_in_subprocess_with_the_png_loader(cifar_dir, tmp_path):
    """`python -m frost.cli`, with the loader pipeline: the data is written once as the seed's PNG files
    (into FROST_CACHE) and decoded by DataLoader worker threads."""
    out = tmp_path / "result.json"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               FROST_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-m", "frost.cli", "bench", "resnet-cifar10", "--device", "cpu",
                           "--steps", "3", "--seeds", "0", "--data", str(cifar_dir), "--out", str(out), "--quiet",
                           "--pipeline", "loader", "--workers", "2"],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    _check_result(result, 3)
    assert result["pipeline"] == "loader" and result["workers"] == 2 and result["decode"] == "cpu"  # no GPU: CPU
    run = result["runs"][0]
    assert 0.0 <= run["waited_share"] <= 1.0 and run["data_wait_s"] >= 0.0
    (png_dir,) = (tmp_path / "cache").glob("cifar10-png-*")
    assert len(list((png_dir / "train").glob("*.png"))) == 5 * 64
    assert len(list((png_dir / "test").glob("*.png"))) == 96
    assert "mean +- std" not in proc.stdout  # one seed: no summary row
    assert "seed" in proc.stdout


def test_bad_arguments_are_reported(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["bench", "resnet-cifar10", "--seeds", "a,b"])
    assert "--seeds" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="does not exist"):
        main(["bench", "resnet-cifar10", "--device", "cpu", "--data", str(tmp_path / "missing")])
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "resnet-cifar10", "--device", "tpu"])
    assert exit_info.value.code == 2 and "argument --device: invalid choice: 'tpu'" in capsys.readouterr().err


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "bench" in capsys.readouterr().out
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("frost ")


@pytest.mark.parametrize("pipeline", ["resident", "loader"])
def test_bench_channels_last_trains_as_nchw_does(cifar_dir, tmp_path, pipeline, monkeypatch):
    """--memory-format channels_last (the default on cuda) changes memory layouts only: same losses on the CPU."""
    monkeypatch.setenv("FROST_CACHE", str(tmp_path / "cache"))  # the loader's PNG copy goes there
    curves = {}
    for fmt in ("nchw", "channels_last"):
        out = tmp_path / f"{fmt}.json"
        main(["bench", "resnet-cifar10", "--device", "cpu", "--steps", "4", "--seeds", "0", "--data", str(cifar_dir),
              "--out", str(out), "--quiet", "--eval-batch", "96", "--memory-format", fmt, "--pipeline", pipeline,
              "--workers", "1"])
        result = json.loads(out.read_text())
        assert result["memory_format"] == fmt
        curves[fmt] = [v for _, v in result["runs"][0]["loss_curve"]]
    np.testing.assert_allclose(curves["channels_last"], curves["nchw"], rtol=1e-4)


def test_result_files_name_the_commit_from_frost_commit_when_set(monkeypatch):
    # a copy of the tree on a benchmark machine may carry a stale git folder: the runner's word wins
    from frost.bench import common
    monkeypatch.setenv("FROST_COMMIT", "abc1234")
    assert common.git_commit() == "abc1234"
    monkeypatch.delenv("FROST_COMMIT")
    commit = common.git_commit()
    assert commit is None or len(commit.split("-")[0]) == 40


def test_bench_saves_its_own_streams_and_a_run_from_them_is_the_run_itself(cifar_dir, tmp_path):
    # --save-streams writes the weights and orders a seed's run draws; trained from them (--streams), the run is
    # the same run, loss for loss, into its third epoch: so a mix of one framework's weights and the other's orders
    # changes exactly one of the two
    from frost.bench import resnet_cifar10 as bench
    streams, args = tmp_path / "own", ["--device", "cpu", "--steps", "23", "--seeds", "1", "--data", str(cifar_dir),
                                       "--tf32", "off", "--quiet"]
    main(["bench", "resnet-cifar10", *args, "--save-streams", str(streams)])
    weights, orders = bench.load_streams(streams, 1)
    assert orders.shape == (3, 320) and all(sorted(row) == list(range(320)) for row in orders)  # 10 steps/epoch
    assert not (orders[0] == orders[1]).all()
    main(["bench", "resnet-cifar10", *args, "--out", str(tmp_path / "own.json")])
    main(["bench", "resnet-cifar10", *args, "--streams", str(streams), "--out", str(tmp_path / "again.json")])
    own, again = (json.loads((tmp_path / f).read_text())["runs"][0] for f in ("own.json", "again.json"))
    assert len(own["loss_curve"]) == 23 and own["loss_curve"] == again["loss_curve"]
    assert own["acc_10k"] == again["acc_10k"]
    with pytest.raises(SystemExit, match="--save-streams need --pipeline resident"):
        main(["bench", "resnet-cifar10", *args, "--pipeline", "loader", "--save-streams", str(streams)])


def test_bench_trains_from_pytorchs_random_streams(cifar_dir, tmp_path):
    # --save-streams writes what PyTorch's run of a seed draws (initial weights, per-epoch orders); --streams makes
    # Frost start from and walk through the same, so that only the two frameworks' arithmetic differs
    torch = pytest.importorskip("torch")
    import frost
    from frost.bench import resnet_cifar10 as bench
    from frost.bench.common import load_cifar10_arrays
    repo = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(repo / "benchmarks"))
    try:
        import torch_resnet_cifar10
    finally:
        sys.path.remove(str(repo / "benchmarks"))
    streams = tmp_path / "streams"
    torch_resnet_cifar10.main(["--mode", "resident-eager", "--device", "cpu", "--steps", "23", "--seeds", "0,1",
                               "--data", str(cifar_dir), "--save-streams", str(streams), "--quiet"])
    weights, orders = bench.load_streams(streams, 1)
    assert orders.shape == (3, 320) and all(sorted(row) == list(range(320)) for row in orders)  # 23 steps, 10/epoch
    torch.manual_seed(1)
    reference = torch_resnet_cifar10.make_model(10).state_dict()
    model = bench.build_model(1, "cpu", False, weights)
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), reference[name].numpy(), err_msg=name)
    x, y = load_cifar10_arrays(cifar_dir, train=True)
    torch_batches = torch_resnet_cifar10.resident_batches(torch.from_numpy(x), torch.from_numpy(y), 32,
                                                         torch.Generator().manual_seed(1))
    frost_batches = bench.resident_batches(320, 32, "cpu", orders)
    for _ in range(12):  # into the second epoch
        (idx,), (_, labels) = next(frost_batches), next(torch_batches)
        np.testing.assert_array_equal(y[idx.numpy()], labels.numpy())
    with pytest.raises(SystemExit, match="cover 3 epochs"):
        for _ in range(30):
            next(frost_batches)
    with pytest.raises(SystemExit, match="permutations of .320,. images; the training set has 160"):
        next(bench.resident_batches(160, 32, "cpu", orders))
    out = tmp_path / "frost.json"
    main(["bench", "resnet-cifar10", "--device", "cpu", "--steps", "6", "--seeds", "0", "--data", str(cifar_dir),
          "--streams", str(streams), "--tf32", "off", "--out", str(out), "--quiet"])
    result = json.loads(out.read_text())
    assert result["streams"] == str(streams) and result["tf32"] is False and frost.backends.allow_tf32 is True
    with pytest.raises(SystemExit, match="seed2_weights.npz is missing"):
        main(["bench", "resnet-cifar10", "--device", "cpu", "--steps", "2", "--seeds", "2", "--data", str(cifar_dir),
              "--streams", str(streams), "--quiet"])


def _no_training(monkeypatch):
    """Make training fail loudly: a bad argument must be refused before it."""
    from frost.bench import resnet_cifar10

    def train_one_seed(*args, **kwargs):
        raise AssertionError("trained before refusing the arguments")
    monkeypatch.setattr(resnet_cifar10, "train_one_seed", train_one_seed)


@pytest.mark.parametrize("eval_batch", ["0", "-5"])
def test_eval_batch_below_one_is_refused_before_the_data_is_read(tmp_path, eval_batch):
    with pytest.raises(SystemExit, match=f"--eval-batch must be at least 1, got {eval_batch}"):
        main(["bench", "resnet-cifar10", "--device", "cpu", "--steps", "1", "--data", str(tmp_path / "missing"),
              "--eval-batch", eval_batch])


@pytest.mark.parametrize("split, per_batch, n_test, message", [
    ("test", 8, 0, "holds no test images"),
    ("train", 0, 16, "holds 0 training images, fewer than one batch of 32"),
    ("train", 4, 16, "holds 20 training images, fewer than one batch of 32")])
def test_data_without_a_training_batch_or_test_images_is_refused_when_loaded(tmp_path, monkeypatch, split,
                                                                              per_batch, n_test, message):
    data = write_cifar_binary(tmp_path / f"no-{split}", per_batch=per_batch, n_test=n_test)
    _no_training(monkeypatch)
    with pytest.raises(SystemExit, match=f"--data {data} {message}"):
        main(["bench", "resnet-cifar10", "--device", "cpu", "--steps", "1", "--seeds", "0", "--data", str(data),
              "--quiet"])


def test_out_is_checked_before_training(cifar_dir, tmp_path, monkeypatch):
    _no_training(monkeypatch)
    run = ["bench", "resnet-cifar10", "--device", "cpu", "--steps", "1", "--seeds", "0", "--data", str(cifar_dir),
           "--quiet", "--out"]
    (tmp_path / "folder").mkdir()
    with pytest.raises(SystemExit, match=r"--out .*folder is a folder; give a file path"):
        main(run + [str(tmp_path / "folder")])
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit, match=r"--out .*file/sub/r\.json: .*file is a file, not a folder"):
        main(run + [str(tmp_path / "file" / "sub" / "r.json")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "folder"]  # nothing written, no .tmp left
