"""Milliseconds per training step of the seed ResNet (batch 32, AdamW): Frost eager/jit vs PyTorch eager/graphed.

Run on a GPU machine: `python benchmarks/step_time.py [--out FILE.json]`. Prints a table (and writes the result as
JSON with --out). Each row is the median over --repeats timed runs of --steps steps,
after warm-up; all rows run in one process on the same GPU.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from frost.bench import common  # noqa: E402

BATCH = 32
ADAMW = dict(lr=1e-4, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.01)


def _batches(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.random((n, BATCH, 3, 32, 32), dtype=np.float32), rng.integers(0, 10, (n, BATCH))


def _time(run_steps, steps: int, repeats: int, sync) -> list[float]:
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        run_steps(steps)
        sync()
        times.append((time.perf_counter() - t0) / steps * 1e3)
    return times


def _memory_format(channels_last: bool):
    import frost
    return frost.channels_last if channels_last else frost.contiguous_format


def frost_rows(steps: int, repeats: int, precision: str, jit: bool, channels_last: bool = False) -> dict:
    import frost
    import frost.nn.functional as F
    from frost.backend import cuda
    from frost.models.resnet import cifar_resnet
    frost.manual_seed(0)
    model = cifar_resnet().to("cuda", memory_format=_memory_format(channels_last))
    opt = frost.optim.AdamW(model.parameters(), **ADAMW)
    xs, ys = _batches(8)
    x_dev = [frost.tensor(x, device="cuda").contiguous(_memory_format(channels_last)) for x in xs]
    y_dev = [frost.tensor(y, device="cuda") for y in ys]

    def step(x, y):
        opt.zero_grad()
        if precision == "bf16":
            with frost.autocast(frost.bfloat16):
                loss = F.cross_entropy(model(x), y)
        else:
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    fn = frost.jit(step) if jit else step
    before = common.startup_counters()
    t0 = time.perf_counter()
    for i in range(5):
        fn(x_dev[i % 8], y_dev[i % 8])
    cuda.synchronize()
    startup = time.perf_counter() - t0
    detail = common.startup_delta(before)

    def run(n):
        for i in range(n):
            fn(x_dev[i % 8], y_dev[i % 8])
    times = _time(run, steps, repeats, cuda.synchronize)
    return {"framework": "frost", "mode": "jit" if jit else "eager", "precision": precision,
            "memory_format": "channels_last" if channels_last else "nchw",
            "ms_per_step": statistics.median(times), "runs_ms": times, "startup_s": startup,
            "startup_detail": detail}


def torch_rows(steps: int, repeats: int, precision: str, graphed: bool) -> dict:
    import torch
    from tests.nn.torch_resnet import cifar_resnet
    torch.manual_seed(0)
    model = cifar_resnet().cuda()
    if precision == "bf16":
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), **ADAMW, capturable=graphed)
    xs, ys = _batches(8)
    x_dev = [torch.tensor(x, device="cuda") for x in xs]
    y_dev = [torch.tensor(y, device="cuda") for y in ys]
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x, y):
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cuda", torch.bfloat16, enabled=precision == "bf16"):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    t0 = time.perf_counter()
    if graphed:
        static_x, static_y = x_dev[0].clone(), y_dev[0].clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                step(static_x, static_y)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step(static_x, static_y)

        def run(n):
            for i in range(n):
                static_x.copy_(x_dev[i % 8])
                static_y.copy_(y_dev[i % 8])
                graph.replay()
    else:
        for i in range(3):
            step(x_dev[i], y_dev[i])

        def run(n):
            for i in range(n):
                step(x_dev[i % 8], y_dev[i % 8])
    torch.cuda.synchronize()
    startup = time.perf_counter() - t0
    times = _time(run, steps, repeats, torch.cuda.synchronize)
    return {"framework": "pytorch", "mode": "graphed" if graphed else "eager", "precision": precision,
            "ms_per_step": statistics.median(times), "runs_ms": times, "startup_s": startup}


def kernel_breakdown(precision: str = "fp32", channels_last: bool = False, top: int = 25) -> list[dict]:
    """Kernels of one replayed Frost jit step with their GPU times (CUPTI through torch.profiler sees CuPy's too)."""
    from torch.profiler import ProfilerActivity, profile
    import frost
    import frost.nn.functional as F
    from frost.backend import cuda
    from frost.models.resnet import cifar_resnet
    model = cifar_resnet().to("cuda", memory_format=_memory_format(channels_last))
    opt = frost.optim.AdamW(model.parameters(), **ADAMW)
    x, y = _batches(1)
    x = frost.tensor(x[0], device="cuda").contiguous(_memory_format(channels_last))
    y = frost.tensor(y[0], device="cuda")

    @frost.jit
    def step(x, y):
        opt.zero_grad()
        with frost.autocast(frost.bfloat16, enabled=precision == "bf16"):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss
    for _ in range(5):
        step(x, y)
    cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            step(x, y)
        cuda.synchronize()
    rows = {}
    for e in prof.events():
        if e.device_type.name != "CUDA":
            continue
        r = rows.setdefault(e.name, [0, 0.0])
        r[0] += 1
        r[1] += e.device_time if hasattr(e, "device_time") else e.cuda_time
    table = sorted(({"kernel": k[:90], "calls_per_step": c / 10, "us_per_step": t / 10}
                    for k, (c, t) in rows.items()), key=lambda r: -r["us_per_step"])
    return table[:top] + [{"kernel": "TOTAL", "calls_per_step": sum(r["calls_per_step"] for r in table),
                           "us_per_step": sum(r["us_per_step"] for r in table)}]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--only", default="", help="comma list of row names to run, e.g. frost-jit-fp32")
    p.add_argument("--breakdown", action="store_true", help="also profile one replayed Frost jit step")
    p.add_argument("--breakdown-of", default="fp32", help="the step --breakdown profiles: fp32, bf16, fp32-cl "
                   "or bf16-cl (-cl: channels-last)")
    p.add_argument("--out", type=Path, default=None, help="write the result as JSON here (default: not written)")
    args = p.parse_args(argv)
    plan = [("frost-eager-fp32", lambda: frost_rows(max(args.steps // 10, 10), args.repeats, "fp32", False)),
            ("frost-jit-fp32", lambda: frost_rows(args.steps, args.repeats, "fp32", True)),
            ("frost-eager-bf16", lambda: frost_rows(max(args.steps // 10, 10), args.repeats, "bf16", False)),
            ("frost-jit-bf16", lambda: frost_rows(args.steps, args.repeats, "bf16", True)),
            ("frost-jit-fp32-cl", lambda: frost_rows(args.steps, args.repeats, "fp32", True, channels_last=True)),
            ("frost-jit-bf16-cl", lambda: frost_rows(args.steps, args.repeats, "bf16", True, channels_last=True)),
            ("pytorch-eager-fp32", lambda: torch_rows(max(args.steps // 10, 10), args.repeats, "fp32", False)),
            ("pytorch-graphed-fp32", lambda: torch_rows(args.steps, args.repeats, "fp32", True)),
            ("pytorch-graphed-bf16", lambda: torch_rows(args.steps, args.repeats, "bf16", True))]
    only = set(filter(None, args.only.split(",")))
    results = []
    for name, fn in plan:
        if only and name not in only:
            continue
        try:
            r = fn()
        except Exception as e:  # a failing row is reported, not hidden
            r = {"name": name, "error": f"{type(e).__name__}: {e}"}
        r["name"] = name
        results.append(r)
        print(f"{name:24s} " + (f"{r['ms_per_step']:8.3f} ms/step  startup {r['startup_s']:.1f} s"
                                if "ms_per_step" in r else r["error"]), flush=True)
        if r.get("startup_detail"):
            print(f"{'':24s} start-up detail: {r['startup_detail']}", flush=True)
    precision, _, layout = args.breakdown_of.partition("-")
    breakdown = kernel_breakdown(precision, channels_last=layout == "cl") if args.breakdown else None
    ref = {r["name"]: r.get("ms_per_step") for r in results}
    print("\n| row | ms/step | vs PyTorch graphed (same precision) | start-up s |\n|---|---|---|---|")
    for r in results:
        if "ms_per_step" not in r:
            print(f"| {r['name']} | error | | |")
            continue
        base = ref.get(f"pytorch-graphed-{r['precision']}")
        ratio = f"{base / r['ms_per_step']:.2f}x faster" if base else ""
        print(f"| {r['name']} | {r['ms_per_step']:.3f} | {ratio} | {r['startup_s']:.1f} |")
    if breakdown:
        print(f"\nOne replayed Frost jit step ({args.breakdown_of}), kernels by GPU time:")
        for b in breakdown:
            print(f"{b['us_per_step']:9.1f} us  {b['calls_per_step']:6.1f} calls  {b['kernel']}")
    common.keep_result(args.out, {"rows": results, "breakdown": breakdown,
                                  "breakdown_of": args.breakdown_of if breakdown else None})


if __name__ == "__main__":
    main()
