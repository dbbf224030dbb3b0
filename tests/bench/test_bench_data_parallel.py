import json

import pytest

from frost import cli


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
