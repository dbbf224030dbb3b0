"""benchmarks/report.py: RESULTS.md from synthetic result files (Frost and PyTorch) in a temporary folder."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from frost.bench import common

REPO = Path(__file__).resolve().parents[1]


def _report_module():
    spec = importlib.util.spec_from_file_location("bench_report", REPO / "benchmarks" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _result(framework: str, mode: str, accs: list[float], times: list[float]) -> dict:
    r = common.new_result(framework, mode, "fp32", "cuda", "Synthetic GPU", 20000, list(range(len(accs))))
    for seed, (acc, t) in enumerate(zip(accs, times)):
        r["runs"].append({"seed": seed, "acc_10k": acc, "acc_9984": acc + 0.001, "train_time_s": t,
                          "ms_per_step": 1000 * t / 19997, "startup_s": 5.0 + seed, "steps_timed": 19997,
                          "warmup_steps": 3, "loss_curve": [[1, 2.3], [101, 1.9], [201, 1.5]]})
    r["summary"] = common.summarize(r["runs"])
    return r


def test_report_writes_the_table_from_measured_numbers_only(tmp_path):
    report = _report_module()
    frost_file, torch_file = tmp_path / "frost.json", tmp_path / "torch.json"
    common.write_json(frost_file, _result("frost", "resident-jit", [0.75, 0.74, 0.76], [20.0, 21.0, 22.0]))
    loader = _result("pytorch", "eager", [0.7376, 0.7513, 0.7281], [35.0, 35.5, 36.0])
    for run in loader["runs"]:
        run.update(waited_share=0.25, data_wait_s=3.0, wait_threshold_s=2e-4)
    common.write_json(torch_file, loader)
    out = report.main([str(frost_file), str(torch_file), "--out-dir", str(tmp_path), "--title", "Synthetic"])
    text = out.read_text()
    assert text.startswith("# Synthetic")
    rows = [line for line in text.splitlines() if line.startswith("| frost") or line.startswith("| pytorch")]
    assert len(rows) == 2
    # mean +- sample std over the three seeds, in percent and seconds
    assert "75.00 +- 1.00" in rows[0] and "75.10 +- 1.00" in rows[0] and "21.0 +- 1.0" in rows[0]
    assert "73.90 +- 1.17" in rows[1] and "35.5 +- 0.5" in rows[1]
    assert "waited for data in 25.0 +- 0.0 % of steps" in text
    assert "Synthetic GPU" in text and "resident-jit" in text
    (tmp_path / "RESULTS.md").write_text(text + "\n" + report.HAND_WRITTEN + "\n## Notes kept\n")
    again = report.main([str(frost_file), "--out-dir", str(tmp_path), "--title", "Again"]).read_text()
    assert again.startswith("# Again") and again.count("| pytorch") == 0
    assert again.endswith(report.HAND_WRITTEN + "\n## Notes kept\n")
    png = list(tmp_path.glob("*.png"))
    try:
        import matplotlib  # noqa: F401
        assert {p.name for p in png} == {"loss_curves.png", "step_time.png"}
    except ImportError:
        assert png == []


def test_report_refuses_foreign_files(tmp_path):
    report = _report_module()
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({"hello": 1}))
    with pytest.raises(SystemExit, match="not a benchmark result"):
        report.main([str(bad), "--out-dir", str(tmp_path)])
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(SystemExit, match="cannot read"):
        report.main([str(broken), "--out-dir", str(tmp_path)])


def test_mean_std_is_the_sample_deviation():
    assert common.mean_std([1.0, 2.0, 3.0]) == pytest.approx((2.0, 1.0))
    assert common.mean_std([4.0]) == (4.0, 0.0)


def test_frost_and_pytorch_result_files_share_the_schema(tmp_path):
    """Tiny CPU runs of both benchmarks on the same generated data; report.py reads both."""
    pytest.importorskip("torch")
    import sys
    from test_cli import write_cifar_binary
    from frost.cli import main as frost_main
    data = write_cifar_binary(tmp_path / "cifar", per_batch=32, n_test=32)
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import torch_resnet_cifar10
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    frost_file, torch_file = tmp_path / "frost.json", tmp_path / "torch.json"
    frost_main(["bench", "resnet-cifar10", "--device", "cpu", "--steps", "2", "--seeds", "0", "--data", str(data),
                "--out", str(frost_file), "--quiet"])
    torch_resnet_cifar10.main(["--mode", "resident-eager", "--device", "cpu", "--steps", "2", "--seeds", "0",
                               "--data", str(data), "--out", str(torch_file), "--quiet"])
    f, t = json.loads(frost_file.read_text()), json.loads(torch_file.read_text())
    assert f["framework"] == "frost" and t["framework"] == "pytorch"
    assert f["protocol"] == t["protocol"] and f["n_train"] == t["n_train"] == 160
    assert set(f["runs"][0]) - {"jit"} == set(t["runs"][0])
    assert set(f["summary"]) == set(t["summary"])
    text = _report_module().main([str(frost_file), str(torch_file), "--out-dir", str(tmp_path)]).read_text()
    assert "| frost resident-eager | fp32 |" in text and "| pytorch resident-eager | fp32 |" in text


def test_rows_say_when_a_run_left_the_protocols_random_streams_or_tf32():
    report = _report_module()
    plain = _result("frost", "resident-jit", [0.74], [20.0])
    assert report.label(plain) == "frost resident-jit"
    streams = dict(plain, streams="/data/streams", tf32=True)
    assert report.label(streams) == "frost resident-jit (PyTorch's streams)"
    assert report.label(dict(plain, tf32=False)) == "frost resident-jit (TF32 off)"
    assert report.label(dict(streams, tf32=False)) == "frost resident-jit (PyTorch's streams, TF32 off)"


def test_loss_curves_panel_the_seeds_both_frameworks_ran_with_the_newest_run_of_each_kind():
    report = _report_module()
    newer = _result("frost", "resident-jit", [0.75, 0.74, 0.76], [20.0, 21.0, 22.0])
    older = _result("frost", "resident-jit", [0.70, 0.71, 0.72], [30.0, 31.0, 32.0])
    torch = _result("pytorch", "graphed", [0.73, 0.74], [40.0, 41.0])
    for run in torch["runs"]:
        run["seed"] += 1                                   # PyTorch ran seeds 1 and 2 only
    panels = report.loss_curve_panels([newer, older, torch])
    assert [seed for seed, _ in panels] == [1, 2]
    for seed, curves in panels:
        assert [(kind, j) for kind, j, _ in curves] == [("frost resident-jit fp32", 0), ("pytorch graphed fp32", 2)]
        assert curves[0][2] is newer["runs"][seed] and curves[1][2] is torch["runs"][seed - 1]
    assert [seed for seed, _ in report.loss_curve_panels([newer])] == [0, 1, 2]   # no PyTorch run: every seed
