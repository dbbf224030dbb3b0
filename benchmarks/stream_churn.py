"""Does what a process did before it captured its training step change the step's replay time? One row per run.

Runs benchmarks/step_time.py's frost jit fp32 channels-last row (warm caches assumed: run once without --before to
fill them) after one of these, in this process:
  none               nothing
  streams_N          N CuPy streams made, each used for one kernel and dropped
  streams_kept       300 streams made and kept
  side_eager_N       N kernels launched (not captured) on one non-default stream
  side_captured_N    N graphs of two kernels captured and replayed on one non-default stream, nothing launched outside
                     a capture there
  graphs_one_stream  300 CUDA graphs captured, launched and dropped, all on one stream
  timings            300 calls of frost.backend.cuda.graph_time_us (as kernel choices are timed)
  events, pools      600 CUDA events recorded; 300 CuPy memory pools used once

    python benchmarks/stream_churn.py --before side_eager_300 --out row.json
    FROST_CACHE_DIR=$(mktemp -d) python benchmarks/stream_churn.py --models 3   # a start-up that chooses kernels

Run each --before in a new process (the effect lasts for the process). What it found (H200, runs at 9042a70 and
fe68b64, 2026-11-30): more than about five kernels launched outside a capture on non-default streams, before the step
is captured, make the captured step ~6 % slower for the rest of the process (0.670-0.678 against 0.632-0.647 ms); the
same work captured into graphs on that stream, or launched on the legacy default stream, does not; neither do streams
kept, events or memory pools. A start-up with empty caches used to time each candidate's first, uncaptured call on the
timing stream (0.670 ms, against 0.635 since it runs on the caller's stream), and frost.jit copied each capture's
static inputs on the graph stream (a process's third model slow again; on the caller's stream since 075dab7). Rows:
results/stream_churn_h200_9042a70.json and results/stream_churn_h200_c00b9a4.json.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import step_time  # noqa: E402


def _count(before: str) -> int:
    """N of a --before NAME_N."""
    name, count = before.rsplit("_", 1)
    if not count.isdigit():
        raise SystemExit(f"stream_churn: --before {before!r}: {name}_N needs a whole number N")
    return int(count)


def churn(before: str) -> list:
    """Do `before` (see the module docstring) on the current GPU; returns what must stay alive (the kept streams)."""
    import cupy as cp
    from frost.backend import cuda
    x = cp.zeros(1 << 20, cp.float32)
    if before == "streams_kept":
        return [cp.cuda.Stream(non_blocking=True) for _ in range(300)]
    if before.startswith("streams_"):
        for _ in range(_count(before)):
            stream = cp.cuda.Stream(non_blocking=True)
            with stream:
                x *= 1.0
            stream.synchronize()
    elif before.startswith(("side_eager_", "side_captured_")):
        stream = cuda.kept_stream("churn")
        with stream:
            for _ in range(_count(before)):
                if before.startswith("side_eager_"):
                    x *= 1.0
                else:
                    stream.begin_capture()
                    x *= 1.0
                    x *= 1.0
                    stream.end_capture().launch(stream)
                stream.synchronize()
    elif before == "graphs_one_stream":
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            for _ in range(300):
                stream.begin_capture()
                x *= 1.0
                stream.end_capture().launch(stream)
                stream.synchronize()
    elif before == "timings":
        for _ in range(300):
            cuda.graph_time_us(lambda: x.__imul__(1.0), calls=2, repeats=2, warmup=1)
    elif before == "events":
        for _ in range(600):
            event = cp.cuda.Event()
            event.record()
            event.synchronize()
    elif before == "pools":
        for _ in range(300):
            pool = cp.cuda.MemoryPool()
            with cp.cuda.using_allocator(pool.malloc):
                cp.empty(1 << 16, cp.float32)
    elif before != "none":
        raise SystemExit(f"stream_churn: unknown --before {before!r}")
    return []


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", default="none")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--models", type=int, default=1,
                   help="models built, captured and timed one after another in this process (a benchmark's seeds)")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.models < 1:
        raise SystemExit(f"stream_churn: --models must be at least 1, got {args.models}")
    kept = churn(args.before)  # alive while the step is timed
    rows = [step_time.frost_rows(args.steps, args.repeats, "fp32", True, channels_last=True)
            for _ in range(args.models)]
    row = rows[0]
    result = {"before": args.before, "ms_per_step": row["ms_per_step"], "runs_ms": row["runs_ms"],
              "startup_s": row["startup_s"], "streams_kept": len(kept),
              "models_ms_per_step": [r["ms_per_step"] for r in rows]}
    per_model = " / ".join(f"{r['ms_per_step']:.4f}" for r in rows)
    print(f"| {args.before} | {per_model} | {[round(t, 4) for t in row['runs_ms']]} |")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
