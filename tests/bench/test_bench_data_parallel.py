import json
import subprocess
import sys
from pathlib import Path

import pytest

from frost import cli
from test_bench_gpt import load_script


def test_resnet_bench_on_two_processes_reports_the_global_batch(tmp_path, capsys):
    pytest.importorskip("mpi4py")
    out = tmp_path / "dp.json"
    status = cli.main(["bench", "resnet-cifar10", "--device", "cpu", "--steps", "4", "--nproc-per-node", "2",
                       "--quiet", "--out", str(out)])
    assert status == 0
    result = json.loads(out.read_text())
    assert result["world_size"] == 2 and result["global_batch"] == 64
    (run,) = result["runs"]
    assert run["steps_timed"] == 3 and run["images_per_s"] > 0
    assert all(loss == loss for _, loss in run["loss_curve"])  # finite, not NaN


def test_data_parallel_bench_refuses_the_loader_pipeline():
    with pytest.raises(SystemExit, match="--pipeline resident"):
        cli.main(["--verbose", "bench", "resnet-cifar10", "--device", "cpu", "--steps", "4", "--nproc-per-node", "2",
                  "--pipeline", "loader"])


def test_gpt_bench_on_two_processes_trains_as_one_process_on_the_global_batch(tmp_path):
    """2 processes of batch 2 take the steps of 1 process of batch 4 (dropout 0): the same held-out loss."""
    pytest.importorskip("mpi4py")
    sizes = ["--device", "cpu", "--steps", "4", "--block-size", "16", "--dropout", "0", "--eval-iters", "2", "--quiet"]
    two, one = tmp_path / "two.json", tmp_path / "one.json"
    assert cli.main(["bench", "gpt", *sizes, "--batch-size", "2", "--nproc-per-node", "2", "--out", str(two)]) == 0
    assert cli.main(["bench", "gpt", *sizes, "--batch-size", "4", "--out", str(one)]) == 0
    parallel, single = json.loads(two.read_text()), json.loads(one.read_text())
    assert parallel["protocol"]["processes"] == 2 and single["protocol"]["processes"] == 1
    (p,), (s,) = parallel["runs"], single["runs"]
    assert p["val_loss"] == pytest.approx(s["val_loss"], rel=1e-5)  # float32: the averaging's rounding only
    assert p["tokens_per_s"] > 0


def test_one_process_runs_the_data_parallel_path_and_trains_as_without_it(tmp_path):
    """--nproc-per-node 1: one rank under frost run with DistributedDataParallel (no averaging at world size 1),
    the same held-out loss as the plain run."""
    pytest.importorskip("mpi4py")
    sizes = ["--device", "cpu", "--steps", "3", "--block-size", "16", "--batch-size", "2", "--dropout", "0",
             "--eval-iters", "2", "--quiet"]
    ddp, plain = tmp_path / "ddp.json", tmp_path / "plain.json"
    assert cli.main(["bench", "gpt", *sizes, "--nproc-per-node", "1", "--out", str(ddp)]) == 0
    assert cli.main(["bench", "gpt", *sizes, "--out", str(plain)]) == 0
    wrapped, single = json.loads(ddp.read_text()), json.loads(plain.read_text())
    assert wrapped["protocol"]["processes"] == single["protocol"]["processes"] == 1
    assert wrapped["runs"][0]["val_loss"] == single["runs"][0]["val_loss"]


def test_the_scaling_against_a_one_process_baseline_is_added_to_the_result(tmp_path, capsys):
    """--scaling-baseline: the N-process run's throughput over one process's, and over N times it (efficiency)."""
    pytest.importorskip("mpi4py")
    sizes = ["--device", "cpu", "--steps", "3", "--block-size", "16", "--batch-size", "2", "--dropout", "0",
             "--eval-iters", "1", "--quiet"]
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    assert cli.main(["bench", "gpt", *sizes, "--out", str(one)]) == 0
    assert cli.main(["bench", "gpt", *sizes, "--nproc-per-node", "2", "--out", str(two),
                     "--scaling-baseline", str(one)]) == 0
    baseline, result = json.loads(one.read_text()), json.loads(two.read_text())
    s = result["scaling"]
    assert s["throughput_key"] == "tokens_per_s" and s["world_size"] == 2
    assert s["throughput"] == pytest.approx(result["runs"][0]["tokens_per_s"])
    assert s["baseline_throughput"] == pytest.approx(baseline["runs"][0]["tokens_per_s"])
    assert s["ratio"] == pytest.approx(s["throughput"] / s["baseline_throughput"])
    assert s["efficiency"] == pytest.approx(s["ratio"] / 2)
    assert "scaling over 2 processes" in capsys.readouterr().out


def test_scaling_refuses_a_baseline_of_another_benchmark_or_of_several_processes():
    from frost.bench import common
    gpt_one = {"benchmark": "gpt", "protocol": {"processes": 1}, "runs": [{"tokens_per_s": 100.0}]}
    gpt_two = {"benchmark": "gpt", "protocol": {"processes": 2}, "runs": [{"tokens_per_s": 150.0}]}
    resnet = {"benchmark": "resnet-cifar10", "world_size": 1, "runs": [{"images_per_s": 80.0}]}
    assert common.scaling(gpt_two, gpt_one, 2)["efficiency"] == pytest.approx(0.75)
    for bad in (gpt_two, resnet):
        with pytest.raises(SystemExit, match="not a one-process result of the same benchmark"):
            common.scaling(gpt_two, bad, 2)
    with pytest.raises(SystemExit, match="--scaling-baseline needs --nproc-per-node"):
        cli.main(["--verbose", "bench", "gpt", "--device", "cpu", "--scaling-baseline", "x.json"])
    with pytest.raises(SystemExit, match="--scaling-baseline needs --out"):
        cli.main(["--verbose", "bench", "gpt", "--device", "cpu", "--nproc-per-node", "2", "--scaling-baseline",
                  "x.json"])


def test_the_pytorch_twin_on_two_processes_trains_as_one_process_on_the_global_batch(tmp_path):
    """benchmarks/torch_gpt.py --nproc-per-node 2 (torch's DistributedDataParallel over gloo, started by frost run):
    2 processes of batch 2 take the steps of 1 process of batch 4 (dropout 0, two micro-batches a step), the same
    held-out loss, as Frost's."""
    pytest.importorskip("torch")
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "torch_gpt.py"
    sizes = ["--device", "cpu", "--steps", "4", "--block-size", "16", "--dropout", "0", "--eval-iters", "2", "--quiet",
             "--grad-accum", "2"]   # the first micro-batch's gradients stay local (no_sync)
    two, one = tmp_path / "two.json", tmp_path / "one.json"
    for batch, processes, out in (("2", ["--nproc-per-node", "2"], two), ("4", [], one)):
        command = [sys.executable, str(script), *sizes, "--batch-size", batch, *processes, "--out", str(out)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
    parallel, single = json.loads(two.read_text()), json.loads(one.read_text())
    assert parallel["framework"] == "pytorch" and parallel["protocol"]["processes"] == 2
    (p,), (s,) = parallel["runs"], single["runs"]
    assert p["val_loss"] == pytest.approx(s["val_loss"], rel=1e-5)   # float32: the averaging's rounding only
    assert p["val_loss"] != pytest.approx(p["first_loss"], rel=1e-3)   # it trained


def test_the_pytorch_resnet_twin_on_two_processes_keeps_its_ranks_in_step(tmp_path):
    """benchmarks/torch_resnet_cifar10.py --nproc-per-node 2 (resident data, torch's DDP over gloo): a global batch of
    64, and both ranks end with the same weights (bit for bit: the averaged gradients are the same on each), not the
    one process's (a global batch of 32)."""
    pytest.importorskip("torch")
    from test_cli import write_cifar_binary
    cifar = write_cifar_binary(tmp_path / "cifar-10-batches-bin", per_batch=64, n_test=96)
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "torch_resnet_cifar10.py"
    common = ["--mode", "resident-eager", "--device", "cpu", "--steps", "3", "--seeds", "0", "--data", str(cifar),
              "--eval-batch", "96", "--quiet"]
    two, one = tmp_path / "two.json", tmp_path / "one.json"
    for processes, out in ((["--nproc-per-node", "2"], two), (["--nproc-per-node", "1"], one)):
        done = subprocess.run([sys.executable, str(script), *common, *processes, "--out", str(out)],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
    parallel, single = json.loads(two.read_text()), json.loads(one.read_text())
    assert parallel["world_size"] == 2 and parallel["global_batch"] == 64 and single["world_size"] == 1
    (p,), (s,) = parallel["runs"], single["runs"]
    assert len(p["rank_weight_sums"]) == 2 and p["rank_weight_sums"][0] == p["rank_weight_sums"][1]
    assert p["rank_weight_sums"][0] != s["rank_weight_sums"][0]   # other images: other weights
    assert p["images_per_s"] > 0


def test_the_pytorch_twins_refuse_data_parallel_from_the_loader():
    pytest.importorskip("torch")
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "torch_resnet_cifar10.py"
    done = subprocess.run([sys.executable, str(script), "--mode", "eager", "--device", "cpu", "--nproc-per-node", "2"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--nproc-per-node trains from resident data" in done.stderr


def test_the_resnet_twins_ranks_take_the_one_process_global_batch_between_them():
    """Resident batches and the graphed step's lanes: the ranks' 32 images of each step, side by side, are the global
    batch of 64 a one-process walk over the same permutations takes, epoch after epoch."""
    torch = pytest.importorskip("torch")
    twin = load_script("torch_resnet_cifar10")
    x = torch.arange(320).reshape(320, 1, 1, 1).to(torch.uint8).expand(320, 3, 2, 2).contiguous()
    y = torch.arange(320) % 10
    ranks = [twin.resident_batches(x, y, 32, torch.Generator().manual_seed(5), rank, 2) for rank in (0, 1)]
    whole = twin.resident_batches(x, y, 64, torch.Generator().manual_seed(5))
    for _ in range(7):   # 5 steps an epoch: into the second
        (x0, y0), (x1, y1), (xw, yw) = next(ranks[0]), next(ranks[1]), next(whole)
        assert torch.equal(torch.cat([x0, x1]), xw) and torch.equal(torch.cat([y0, y1]), yw)
    lanes = [twin.GraphedTrainer(None, None, x, y, 32, "fp32", False, None, 11, rank, 2) for rank in (0, 1)]
    assert [t.lanes.tolist() for t in lanes] == [list(range(32)), list(range(32, 64))]
    assert lanes[0].step_images == 64 and lanes[0].per_epoch == 5
