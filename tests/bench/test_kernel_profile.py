"""benchmarks/kernel_profile.py (ncu CSV -> kernel time per step) on a CSV written here in ncu's --csv layout, and
the NVTX step range that marks what it profiles."""
from __future__ import annotations

import json
import types

import pytest
from test_benchmark_scripts import load_script

from frost.bench import common

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def _row(i: int, kernel: str, value: str, unit: str = "nsecond", metric: str = "gpu__time_duration.sum") -> str:
    return (f'"{i}","7","python","h","{kernel}","1","7","(256, 1, 1)","(64, 1, 1)","0","9.0","Command line profiler '
            f'metrics","{metric}","{unit}","{value}"')


def _csv(rows: list[str]) -> str:
    # what the profiled program printed comes first; ncu's table follows
    return "\n".join(["step 1/6 loss 4.2", "==PROF== Connected to process", HEADER] + rows) + "\n"


def test_kernels_are_grouped_by_name_per_step(tmp_path):
    profile = load_script("kernel_profile")
    frost_csv = tmp_path / "frost.csv"
    frost_csv.write_text(_csv([
        _row(0, "layer_norm_forward_vec8", "1,500"), _row(1, "void cutlass::Kernel<cutlass::gemm<128, 64>>(Params)",
                                                            "20", "usecond"),
        _row(2, "layer_norm_forward_vec8", "2,500"), _row(3, "void cutlass::Kernel<cutlass::gemm<64, 64>>(Params)",
                                                            "0.03", "msecond"),
        _row(4, "layer_norm_forward_vec8", "99", metric="sm__cycles_elapsed.avg")]))
    torch_csv = tmp_path / "torch.csv"
    torch_csv.write_text(_csv([_row(0, "vectorized_layer_norm_kernel", "1000"),
                               _row(1, "vectorized_layer_norm_kernel", "1000")]))
    out = tmp_path / "profile.json"
    result = profile.main([str(frost_csv), str(torch_csv), "--steps", "2", "--labels", "frost,torch",
                           "--out", str(out)])
    frost = result["groups"]["frost"]
    assert frost["layer_norm_forward_vec8"] == {"launches": 1.0, "us": 2.0}  # (1.5 + 2.5) us over 2 steps
    assert frost["void cutlass::Kernel"] == {"launches": 1.0, "us": 25.0}  # (20 + 30) us, templates dropped
    assert result["groups"]["torch"] == {"vectorized_layer_norm_kernel": {"launches": 1.0, "us": 1.0}}
    assert json.loads(out.read_text())["labels"] == ["frost", "torch"]


def test_bad_input_names_the_file(tmp_path):
    profile = load_script("kernel_profile")
    text = tmp_path / "not_ncu.csv"
    text.write_text("just a log\n")
    with pytest.raises(SystemExit, match=r"not_ncu.csv: kernel_profile: no ncu CSV header"):
        profile.main([str(text), "--steps", "1"])
    with pytest.raises(SystemExit, match=r"--steps must be at least 1"):
        profile.main([str(text), "--steps", "0"])


def test_step_range_marks_timed_steps_only_when_asked(monkeypatch):
    calls = []
    nvtx = types.SimpleNamespace(RangePush=lambda name: calls.append(("push", name)),
                                 RangePop=lambda: calls.append(("pop",)))
    fake_cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(nvtx=nvtx))
    monkeypatch.setattr(common.cuda_backend, "cupy", lambda: fake_cupy)
    monkeypatch.delenv(common.NVTX_STEPS, raising=False)
    with common.step_range(timed=True):
        pass
    monkeypatch.setenv(common.NVTX_STEPS, "1")
    with common.step_range(timed=False):
        pass
    assert calls == []
    with pytest.raises(RuntimeError):
        with common.step_range(timed=True):
            raise RuntimeError("the step failed")
    assert calls == [("push", "step"), ("pop",)]  # the range closes even when the step raises
