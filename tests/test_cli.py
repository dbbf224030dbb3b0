"""The `frost` command: `frost bench resnet-cifar10` on a small generated CIFAR-10 in the binary format and on the
embedded sample; what it says about its device and data; errors in one line; progress off a terminal."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import frost
from frost.bench import resnet_cifar10
from frost.cli import main
from frost.data import cifar

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
                           "--steps", "3", "--seeds", "0", "--data", str(cifar_dir), "--out", str(out),
                           "--pipeline", "loader", "--workers", "2"],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    # stderr is a pipe, not a terminal: progress comes as whole lines (the first and the last step here), not as
    # tqdm's carriage-return updates
    assert "\r" not in proc.stderr
    progress = [line for line in proc.stderr.splitlines() if line.startswith("seed 0: step")]
    assert progress[0].startswith("seed 0: step 1/3 (33%), loss ")
    assert progress[-1].startswith("seed 0: step 3/3 (100%)")
    assert proc.stdout.startswith("device: cpu (--device cpu)\n")
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


def test_no_command_prints_help_and_bench_alone_lists_the_benchmarks(capsys):
    assert main([]) == 2
    assert capsys.readouterr().out.startswith("usage: frost [-h] [--version] [--verbose] command ...")
    assert main(["bench"]) == 0
    listing = capsys.readouterr().out
    assert listing.startswith("benchmarks (frost bench NAME --help for the options):\n"
                              "  resnet-cifar10  the seed ResNet")
    assert "\n  optimizers      the seed ResNet on CIFAR-10 with each optimizer" in listing
    assert "usage:" not in listing
    with pytest.raises(SystemExit) as exit_info:  # argparse's action="version"
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out == f"frost {frost.__version__}\n"


def test_python_dash_m_frost(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = lambda *args: subprocess.run([sys.executable, "-m", "frost", *args], capture_output=True, text=True,  # noqa: E731
                                       env=env, timeout=120, cwd=tmp_path)
    version = run("--version")
    assert version.returncode == 0 and version.stdout == f"frost {frost.__version__}\n"
    listing = run("bench")
    assert listing.returncode == 0 and "resnet-cifar10" in listing.stdout and "optimizers" in listing.stdout
    assert run().returncode == 2


# ---------------------------------------------------------------- device, data and errors, said in one line each


def no_gpu(monkeypatch, why: str = "CuPy is not installed") -> None:
    """Make the machine look GPU-less (the tests run on GPU machines too)."""
    monkeypatch.setattr(resnet_cifar10.cuda_backend, "unavailable_reason", lambda: why)


def offline(monkeypatch, tmp_path) -> Path:
    """An empty cache and a download URL nothing answers on (a closed local port): what a machine without network
    sees, without needing one. Returns the cache folder."""
    monkeypatch.setenv("FROST_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cifar, "BINARY_URL", "http://127.0.0.1:9/cifar-10-binary.tar.gz")
    return tmp_path / "cache" / "cifar10"


def test_no_gpu_and_no_data_runs_the_embedded_sample_briefly(tmp_path, monkeypatch, capsys):
    # `frost bench resnet-cifar10` alone on a CPU-only machine without the data: the sample, a short run, said so;
    # nothing is downloaded (the full data could only serve a run of hours here)
    cache = offline(monkeypatch, tmp_path)
    no_gpu(monkeypatch)
    monkeypatch.setattr(resnet_cifar10, "SAMPLE_STEPS", 3)  # the real default takes a minute
    downloads = []
    monkeypatch.setattr(cifar, "download_binary", lambda *a, **k: downloads.append(a))
    out = tmp_path / "result.json"
    assert main(["bench", "resnet-cifar10", "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[:3] == [
        "device: cpu (no GPU: CuPy is not installed)",
        f"no CIFAR-10 in {cache}, and no GPU for the full benchmark",
        "using the embedded CIFAR-10 sample (2,000 train / 500 test images): a short run, 3 steps, 1 seed; pass "
        "--data DIR for the full benchmark"]
    assert downloads == [] and not cache.exists()
    result = json.loads(out.read_text())
    assert result["data"] == "embedded sample" and result["n_train"] == 2000 and result["n_test"] == 500
    assert result["seeds"] == [0] and result["protocol"]["steps"] == 3 and result["device"] == "cpu"
    (run,) = result["runs"]
    assert len(run["loss_curve"]) == 3 and 0.0 <= run["acc_10k"] <= 1.0
    assert printed[-2].startswith("(the embedded sample: accuracy over its 500 test images after 3 steps")


def test_a_failed_download_falls_back_to_the_sample_at_once(tmp_path, monkeypatch, capsys):
    # --device cpu asks for the full protocol on the CPU: the download is tried, and offline it fails fast
    cache = offline(monkeypatch, tmp_path)
    args = argparse.Namespace(sample=False, data=None, device="cpu", steps=None, seeds=None)
    assert resnet_cifar10.choose_data(args, "cpu") is None
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"downloading CIFAR-10 (170 MB) from http://127.0.0.1:9/cifar-10-binary.tar.gz into {cache}"
    assert lines[1].startswith(f"no CIFAR-10 in {cache}, and the download failed (") and len(lines) == 2
    assert "refused" in lines[1].lower()  # the socket's own words: [Errno 111] Connection refused
    assert list(cache.iterdir()) == []  # no partial archive left
    resnet_cifar10.settle_defaults(args, None, "cpu")
    assert (args.steps, args.seeds, args.short_run) == (resnet_cifar10.SAMPLE_STEPS, [0], True)
    explicit = argparse.Namespace(sample=True, data=None, device=None, steps=7, seeds=[4, 5])
    resnet_cifar10.settle_defaults(explicit, resnet_cifar10.choose_data(explicit, "cpu"), "cpu")
    assert (explicit.steps, explicit.seeds, explicit.short_run) == (7, [4, 5], False)  # --sample with its own sizes


def cache_holding(data: Path, tmp_path: Path, monkeypatch) -> Path:
    """A cache whose cifar10/ folder holds `data` (a cifar-10-batches-bin folder), as a download leaves it."""
    monkeypatch.setenv("FROST_CACHE", str(tmp_path / "cache"))
    cache = tmp_path / "cache" / "cifar10"
    cache.mkdir(parents=True)
    (cache / "cifar-10-batches-bin").symlink_to(data)
    return cache


def test_cached_full_data_is_used_without_a_download(cifar_dir, tmp_path, monkeypatch):
    cache = cache_holding(cifar_dir, tmp_path, monkeypatch)
    monkeypatch.setattr(cifar, "download_binary", lambda *a, **k: pytest.fail("downloaded"))
    args = argparse.Namespace(sample=False, data=None, device=None, steps=None, seeds=None)
    assert resnet_cifar10.choose_data(args, "cuda") == cache
    assert resnet_cifar10.choose_data(args, "cpu") == cache  # then settle_defaults refuses the run of hours


@pytest.mark.parametrize("cached", [False, True])
def test_the_full_data_on_an_implicit_cpu_is_refused_in_one_line(cifar_dir, tmp_path, monkeypatch, capsys, cached):
    # no GPU, no --device and no --steps: 20,000 steps x 3 seeds would take hours; say so instead of starting
    no_gpu(monkeypatch)
    _no_training(monkeypatch)
    monkeypatch.setattr(resnet_cifar10, "load_data", lambda *a, **k: pytest.fail("loaded the data first"))
    if cached:
        cache_holding(cifar_dir, tmp_path, monkeypatch)
        command = ["bench", "resnet-cifar10"]
    else:
        command = ["bench", "resnet-cifar10", "--data", str(cifar_dir)]
    with pytest.raises(SystemExit) as exit_info:
        main(command)
    message = str(exit_info.value.code)
    assert message == ("frost bench: the full protocol (20,000 steps x 3 seed(s)) on the CPU takes about 4.5 hours on "
                       "a 2-core CPU; pass --device cpu to run it anyway, --steps N for a shorter run, or --sample "
                       "for a one-minute run on the embedded sample")
    assert capsys.readouterr().out.startswith("device: cpu (no GPU: CuPy is not installed)\n")


def test_the_optimizer_zoo_counts_its_optimizers_in_the_warning(cifar_dir, monkeypatch):
    no_gpu(monkeypatch)
    with pytest.raises(SystemExit, match=r"\(20,000 steps x 1 seed\(s\)\) on the CPU takes about 3 hours"):
        main(["bench", "optimizers", "--data", str(cifar_dir), "--seeds", "0", "--optimizers", "sgd,adamw"])


def test_device_cuda_without_a_gpu_is_one_line(monkeypatch):
    no_gpu(monkeypatch)
    with pytest.raises(SystemExit, match=r"^frost bench: --device cuda, but CuPy is not installed \(a GPU needs pip "):
        main(["bench", "resnet-cifar10", "--device", "cuda", "--steps", "1"])


def test_the_reason_for_no_gpu_names_cupy_or_cudas_error(monkeypatch):
    def missing():
        raise resnet_cifar10.cuda_backend.CudaUnavailableError("CuPy is not installed")
    monkeypatch.setattr(resnet_cifar10.cuda_backend, "cupy", missing)
    assert resnet_cifar10.cuda_backend.unavailable_reason() == "CuPy is not installed"
    assert resnet_cifar10.choose_device(None) == ("cpu", "no GPU: CuPy is not installed")
    assert resnet_cifar10.choose_device("cpu") == ("cpu", "--device cpu")

    class Runtime:
        @staticmethod
        def getDeviceCount():
            raise OSError("cudaErrorInsufficientDriver: CUDA driver version is insufficient\nmore detail")

    fake_cupy = argparse.Namespace(cuda=argparse.Namespace(runtime=Runtime))
    monkeypatch.setattr(resnet_cifar10.cuda_backend, "cupy", lambda: fake_cupy)
    assert resnet_cifar10.choose_device(None) == (
        "cpu", "no GPU: CuPy reports cudaErrorInsufficientDriver: CUDA driver version is insufficient")


def test_an_error_is_one_line_and_verbose_shows_the_traceback(tmp_path, monkeypatch, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    command = ["bench", "resnet-cifar10", "--device", "cpu", "--steps", "1", "--data", str(empty)]
    assert main(command) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"frost: FileNotFoundError: CIFAR10: no CIFAR-10 files in {empty}")
    assert err.endswith("(--verbose shows the traceback)\n")
    for verbose in (["--verbose", *command], [*command, "--verbose"]):
        with pytest.raises(FileNotFoundError, match="no CIFAR-10 files"):
            main(verbose)


def test_an_interrupt_is_one_line(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(resnet_cifar10, "run", interrupted)
    assert main(["bench", "resnet-cifar10"]) == 130
    assert capsys.readouterr().err == "frost: interrupted\n"


def test_missing_data_offline_in_a_subprocess_is_one_line(tmp_path):
    # what a user sees: no traceback on stderr, a non-zero exit status
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "frost", "bench", "resnet-cifar10", "--device", "cpu", "--data",
                           str(tmp_path / "nowhere")], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr == f"frost bench: --data {tmp_path / 'nowhere'} does not exist\n"


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
