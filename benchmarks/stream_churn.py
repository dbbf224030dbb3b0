"""Does what a process did before it captured its training step change the step's replay time? One row per run.

Runs benchmarks/step_time.py's frost jit fp32 channels-last row (warm caches assumed: run once without --before to
fill them) after one of these, in this process:
  none               nothing
  streams_N          N CuPy streams made, each used for one kernel and dropped (a kernel-timing start-up made a new
                     stream per timing)
  streams_kept       300 streams made and kept
  graphs_one_stream  300 CUDA graphs captured, launched and dropped, all on one stream
  timings            300 calls of frost.backend.cuda.graph_time_us (as kernel choices are timed)
  events, pools      600 CUDA events recorded; 300 CuPy memory pools used once

    python benchmarks/stream_churn.py --before streams_8 --out row.json

Run each --before in a new process (the effect lasts for the process). Session 10 (H200): none 0.638-0.639 ms per
step; streams_1 0.631, streams_4 0.633, streams_8 0.670, streams_16 0.666, streams_300 0.666, streams_kept 0.639,
events 0.638, pools 0.634, graphs_one_stream 0.628, timings 0.675 (0.669 with one timing stream for all timings:
tried and left out); a start-up with empty caches, 0.667-0.694 (results/stream_churn_session10_h200.json).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import step_time  # noqa: E402


def churn(before: str) -> list:
    """Do `before` (see the module docstring) on the current GPU; returns what must stay alive (the kept streams)."""
    import cupy as cp
    from frost.backend import cuda
    x = cp.zeros(1 << 20, cp.float32)
    if before == "streams_kept":
        return [cp.cuda.Stream(non_blocking=True) for _ in range(300)]
    if before.startswith("streams_"):
        count = before.split("_", 1)[1]
        if not count.isdigit():
            raise SystemExit(f"stream_churn: --before {before!r}: streams_N needs a whole number N")
        for _ in range(int(count)):
            stream = cp.cuda.Stream(non_blocking=True)
            with stream:
                x *= 1.0
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
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    kept = churn(args.before)  # alive while the step is timed
    row = step_time.frost_rows(args.steps, args.repeats, "fp32", True, channels_last=True)
    result = {"before": args.before, "ms_per_step": row["ms_per_step"], "runs_ms": row["runs_ms"],
              "startup_s": row["startup_s"], "streams_kept": len(kept)}
    print(f"| {args.before} | {row['ms_per_step']:.4f} | {[round(t, 4) for t in row['runs_ms']]} |")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
