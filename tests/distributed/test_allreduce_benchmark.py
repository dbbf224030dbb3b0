import json

from dist_launch import ROOT, frost_run


def test_the_benchmark_runs_both_sides_and_writes_json(tmp_path, needs_mpi):
    out = tmp_path / "allreduce.json"
    done = frost_run("--launcher", "mpi", "--nproc-per-node", 2, ROOT / "benchmarks" / "allreduce.py",
                     "--max-bytes", 4096, "--iters", 2, "--warmup", 1, "--out", out)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["world_size"] == 2 and result["frost_backend"] == "mpi" and result["torch_backend"] == "gloo"
    assert [(r["dtype"], r["bytes"]) for r in result["rows"]] == [
        (d, b) for d in ("bfloat16", "float32") for b in (1024, 4096)]
    for r in result["rows"]:
        assert r["frost_busbw_gbs"] > 0 and r["torch_busbw_gbs"] > 0
        assert abs(r["frost_busbw_gbs"] - r["frost_algbw_gbs"]) < 1e-12  # 2(n-1)/n = 1 for two processes
