"""LayerNorm and GELU at GPT-2 shapes: Frost's kernels (frost/accel/layer_norm.py, frost/accel/gelu.py) against
Frost's reference path (frost/ops: the same ops with the fast paths switched off) and PyTorch, eager and
torch.compile, forward + backward, float32 and bf16.

Run on a CUDA machine:  python benchmarks/transformer_kernels.py [--quick] [--out FILE.json]
Each row times `--iters` calls of forward + backward after `--warmup` (wall clock between device synchronizations,
host time included) and, where the calls can be captured, the GPU time of the same calls replayed from a CUDA graph
(Frost: frost.backend.cuda.graph_time_us; PyTorch eager: torch.cuda.CUDAGraph), and reports milliseconds and the
effective bandwidth: the bytes a fused implementation must move (LayerNorm: read x,
write out, read x and dout, write dx; GELU: read x, write out, read x and dout, write dx) over the time. Each Frost
kernel row first checks its output and input gradient against the reference path. For bf16, "one value a thread"
is the A/B of the 16-bit vector accesses (load8/store8: the kernels before them). PyTorch rows need a CUDA build of
torch (they are left out, with a line saying so, without one).
"""
import argparse
import contextlib
from pathlib import Path

import numpy as np

import frost
from frost import dispatch
from frost.accel import gelu as gelu_accel, layer_norm as ln_accel
from frost.backend import cuda as cuda_backend
from frost.bench import common
from frost.ops.elementwise import gelu
from frost.ops.norm import layer_norm

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # PyTorch is an optional opponent here
    torch = None

# (name, rows B*T, width C): nanoGPT's shakespeare-char, GPT-2 small (batch 16), medium (batch 8), XL (batch 4)
SHAPES = [("shakespeare-char", 64 * 256, 384), ("gpt2-124m", 16 * 1024, 768), ("gpt2-350m", 8 * 1024, 1024),
          ("gpt2-1.5b", 4 * 1024, 1600)]
DTYPES = ("float32", "bfloat16")
FAST_OPS = ("layer_norm", "gelu")


def reference_path():
    """The ops' own reference code for the duration: dispatch finds no fast path for layer_norm and gelu."""
    return dispatch.disabled(*FAST_OPS)


@contextlib.contextmanager
def one_value_kernels():
    """The kernels as they were before 16-bit vector accesses: bf16/fp16 rows and elements one value a thread (the
    A/B of load8/store8; float32 keeps its 16-byte kernels)."""
    saved_moves, saved_gelu = ln_accel.moves_16_bytes, dict(gelu_accel.GELU_VECTOR_KERNELS)
    ln_accel.moves_16_bytes = lambda C, itemsize, *arrays: itemsize == 4 and saved_moves(C, itemsize, *arrays)
    for name in ("bfloat16", "float16"):
        gelu_accel.GELU_VECTOR_KERNELS[name] = (1, *gelu_accel.GELU_KERNELS[name])
    try:
        yield
    finally:
        ln_accel.moves_16_bytes = saved_moves
        gelu_accel.GELU_VECTOR_KERNELS.update(saved_gelu)


def frost_inputs(op: str, rows: int, C: int, dtype: str) -> list:
    """x (rows, C) for layer_norm, (rows, 4C) for gelu (the MLP's hidden width), its parameters and dout."""
    rng = np.random.default_rng(0)
    width = C if op == "layer_norm" else 4 * C
    np_dtype = frost.dtype.to_dtype(dtype).np
    x = frost.tensor(rng.standard_normal((rows, width)).astype(np_dtype), device="cuda", requires_grad=True)
    dout = frost.tensor(rng.standard_normal((rows, width)).astype(np_dtype), device="cuda")
    if op == "gelu":
        return [x, dout]
    w = frost.tensor((1 + 0.1 * rng.standard_normal(C)).astype(np_dtype), device="cuda", requires_grad=True)
    b = frost.tensor((0.1 * rng.standard_normal(C)).astype(np_dtype), device="cuda", requires_grad=True)
    return [x, w, b, dout]


def frost_step(op: str, tensors: list, reference: bool, switch=None):
    """A forward + backward closure of the Frost op (reference: with the fast paths switched off; switch: another
    context for the calls)."""
    *leaves, dout = tensors
    switch = switch or (reference_path if reference else contextlib.nullcontext)

    def step():
        for t in leaves:
            t.grad = None
        with switch():
            out = layer_norm(leaves[0], leaves[0].shape[-1:], *leaves[1:]) if op == "layer_norm" \
                else gelu(leaves[0], "tanh")
        out.backward(dout)
        return out
    return step


def check_against_reference(op: str, rows: int, C: int, dtype: str) -> float:
    """The largest |kernel - reference| over the output and dx (bf16: expect a few bf16 ulps of O(1) values)."""
    results = []
    for reference in (False, True):
        tensors = frost_inputs(op, rows, C, dtype)
        out = frost_step(op, tensors, reference)()
        results.append([a.detach().cpu().numpy().astype(np.float64) for a in (out, tensors[0].grad)])
    return max(float(np.abs(a - b).max()) for a, b in zip(*results))


def torch_step(op: str, rows: int, C: int, dtype: str, compiled: bool):
    width = C if op == "layer_norm" else 4 * C
    tdtype = getattr(torch, dtype)
    x = torch.randn(rows, width, device="cuda", dtype=tdtype, requires_grad=True)
    dout = torch.randn(rows, width, device="cuda", dtype=tdtype)
    w = torch.ones(C, device="cuda", dtype=tdtype, requires_grad=True)
    b = torch.zeros(C, device="cuda", dtype=tdtype, requires_grad=True)
    leaves = [x, w, b] if op == "layer_norm" else [x]

    def forward(x, w, b):
        return F.layer_norm(x, (C,), w, b) if op == "layer_norm" else F.gelu(x, approximate="tanh")
    fn = torch.compile(forward) if compiled else forward

    def step():
        for t in leaves:
            t.grad = None
        fn(x, w, b).backward(dout)
    return step


def torch_available() -> bool:
    if torch is None:
        print("(PyTorch is not installed: its rows are left out)")
        return False
    if not torch.cuda.is_available():
        print("(this PyTorch has no CUDA: its rows are left out)")
        return False
    return True


def bytes_moved(op: str, rows: int, C: int, dtype: str) -> int:
    """The compulsory traffic of forward + backward: 5 passes over the activation (x, out; x, dout, dx)."""
    width = C if op == "layer_norm" else 4 * C
    return 5 * rows * width * frost.dtype.to_dtype(dtype).np.itemsize


def frost_graph_ms(step) -> float | None:
    """GPU milliseconds of one call, its launches captured in a CUDA graph (no host time); None where the capture
    fails (the reference path's host reads)."""
    try:
        return cuda_backend.graph_time_us(step) / 1e3
    except Exception as exc:  # a benchmark row, not a result: say why and go on
        print(f"(graph timing failed: {type(exc).__name__}: {str(exc)[:120]})")
        return None


def torch_graph_ms(step) -> float | None:
    """The same for a PyTorch step: torch.cuda.CUDAGraph over 10 calls after a warm-up on a side stream."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(10):
                step()
        graph.replay()
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(10):
            start.record()
            graph.replay()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) / 10)
        return float(np.median(times))
    except Exception as exc:
        print(f"(torch graph timing failed: {type(exc).__name__}: {str(exc)[:120]})")
        return None


def time_shape(op: str, name: str, rows: int, C: int, dtype: str, with_torch: bool, iters: int,
               warmup: int) -> list[dict]:
    error = check_against_reference(op, rows, C, dtype)
    frost_impls = {"frost kernel": None, "frost reference": reference_path}
    if dtype != "float32":
        frost_impls["frost kernel, one value a thread"] = one_value_kernels
    impls = {label: (frost_step(op, frost_inputs(op, rows, C, dtype), False, switch), frost.cuda.synchronize,
                     frost_graph_ms) for label, switch in frost_impls.items()}
    if with_torch:
        for label, compiled in (("torch eager", False), ("torch.compile", True)):
            impls[label] = (torch_step(op, rows, C, dtype, compiled), torch.cuda.synchronize,
                            torch_graph_ms if not compiled else lambda step: None)
    rows_out = []
    for impl, (step, sync, graph_ms) in impls.items():
        seconds = common.seconds_per_call(step, sync, iters, warmup)
        gpu_ms = graph_ms(step)
        rows_out.append(dict(op=op, shape=name, rows=rows, width=C if op == "layer_norm" else 4 * C, dtype=dtype,
                             impl=impl, forward_backward_ms=1e3 * seconds,
                             gb_per_s=bytes_moved(op, rows, C, dtype) / seconds / 1e9, graph_ms=gpu_ms,
                             graph_gb_per_s=None if gpu_ms is None else bytes_moved(op, rows, C, dtype) / gpu_ms / 1e6,
                             max_abs_diff_vs_reference=error if impl == "frost kernel" else None))
    return rows_out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="GPT-2 small's shape only, fewer iterations")
    ap.add_argument("--iters", type=int, default=None, help="timed calls per row (default 50, 10 with --quick)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed calls first (torch.compile compiles in them)")
    ap.add_argument("--out", type=Path, default=None, help="write the result as JSON here (default: not written)")
    args = ap.parse_args()
    common.check_output_path("--out", args.out)
    common.require_cuda("benchmarks/transformer_kernels.py")
    iters = args.iters or (10 if args.quick else 50)
    shapes = SHAPES[1:2] if args.quick else SHAPES
    with_torch = torch_available()
    results = [row for op in FAST_OPS for dtype in DTYPES for name, rows, C in shapes
               for row in time_shape(op, name, rows, C, dtype, with_torch, iters, args.warmup)]
    header = ["op", "shape", "rows x width", "dtype", "impl", "fwd+bwd ms", "GB/s", "graph ms", "graph GB/s",
              "max |diff| vs ref"]
    table = [[r["op"], r["shape"], f"{r['rows']} x {r['width']}", r["dtype"], r["impl"],
              f"{r['forward_backward_ms']:.3f}", f"{r['gb_per_s']:.0f}",
              "" if r["graph_ms"] is None else f"{r['graph_ms']:.3f}",
              "" if r["graph_gb_per_s"] is None else f"{r['graph_gb_per_s']:.0f}",
              "" if r["max_abs_diff_vs_reference"] is None else f"{r['max_abs_diff_vs_reference']:.2e}"]
             for r in results]
    device = cuda_backend.device_name()
    print(f"LayerNorm and GELU (tanh), forward + backward, on {device} ({iters} calls a row)")
    print(common.format_table(table, header))
    common.keep_result(args.out, dict(device=device, commit=common.git_commit(), versions=common.versions(),
                                      iters=iters, warmup=args.warmup, results=results))


if __name__ == "__main__":
    main()
