"""Flash attention: Frost's kernels (frost/accel/flash_attention.py) and Frost's path through cuDNN's graphs
(frost/accel/cudnn_attention.py, "frost cuDNN") against Frost's composed path and PyTorch's SDPA (flash and cuDNN
backends), bf16, at GPT-2-like shapes (H=12, L=1024, D=64, batch 8 to 64; --heads, --length and
--head-dim change them), causal and not. "frost flash" is the mma.sync kernels (FROST_FLASH_BULK=0); on a Hopper GPU
"frost flash wgmma" is the same on warpgroup MMA (FROST_FLASH_WGMMA=1: the forward and backward kernels of
frost/accel/flash_wgmma.py), and "frost flash bulk" its defaults for bf16 there: the warp-specialized forward fed by
the copy engine (flash_bulk.py), and the fused one-kernel backward (flash_fused_backward.py) from FUSED_FROM_LENGTH
queries (the two warpgroup-MMA kernels below).

Run on a CUDA machine:  python benchmarks/flash_attention.py [--quick | --sweep [--head-dims 128] [--lengths ...]]
[--out FILE.json]
--sweep times FlashAttention's own shapes (the issue's): head dims 64 and 128, lengths 512 to 16k at batch x length =
16k tokens and heads x dim = 2048, against PyTorch's flash and cuDNN backends, with the peak memory of Frost's
forward + backward (no L x S matrix: it would take gigabytes at 16k).
Each row times the forward alone (no autograd graph) and forward + backward: the time one more call adds to `--iters`
calls queued back to back after `--warmup` (common.steady_seconds_per_call: a loop's one-time costs, such as the first
call's host time before the GPU has work, left out). TFLOP/s counts 4 B H L^2 D for the forward and 2.5 times that for
the backward (FlashAttention's convention), halved when causal. The composed path is scaled_dot_product_attention with
FROST_CUDNN_ATTENTION=0 and FROST_FLASH_ATTENTION=0. Each Frost row first checks its output against the composed
path's. PyTorch rows need a CUDA build of torch (they are left out, with a line saying so, without one). `--dropout P`
times every row with attention dropout (Frost's kernels and cuDNN draw the mask inside; the output check against the
composed path is skipped: the masks differ).
"""
import argparse
import contextlib
import os
from pathlib import Path

import numpy as np

import frost
from frost.bench import common
from frost.accel import flash_attention as fa
from frost.ops.attention import scaled_dot_product_attention as sdpa

HEADS, LENGTH, HEAD_DIM = 12, 1024, 64
BATCHES = (8, 16, 32, 64)


@contextlib.contextmanager
def environment(name: str, value: str):
    """An environment variable for the duration (the op reads FROST_FLASH_ATTENTION and FROST_FLASH_WGMMA at each
    call)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


PATHS = ("cudnn", "flash", "wgmma", "bulk", "composed")


def attention_switch(path: str):
    """Which of Frost's attention paths runs: cuDNN's graphs (frost/accel/cudnn_attention.py), the flash kernels on
    mma.sync or on wgmma (the Hopper ones; "bulk": their defaults, the forward fed by the copy engine and the
    default backward), or the composed path."""
    if path not in PATHS:
        raise ValueError(f"attention_switch: path must be one of {PATHS}, got {path!r}")
    stack = contextlib.ExitStack()
    stack.enter_context(environment("FROST_CUDNN_ATTENTION", "1" if path == "cudnn" else "0"))
    stack.enter_context(environment("FROST_FLASH_ATTENTION", "0" if path == "composed" else "1"))
    stack.enter_context(environment("FROST_FLASH_WGMMA", "1" if path == "wgmma" else "0"))
    stack.enter_context(environment("FROST_FLASH_BULK", "1" if path == "bulk" else "0"))
    return stack


def frost_calls(shape: tuple, causal: bool, path: str, dropout: float = 0.0):
    """(forward, forward + backward) closures over fresh bf16 CUDA tensors of shape (batch, heads, length, dim), by
    one of Frost's attention paths (attention_switch)."""
    rng = np.random.default_rng(0)
    q, k, v, do = (frost.Tensor(rng.standard_normal(shape).astype(frost.bfloat16.np)).to("cuda") for _ in range(4))
    for t in (q, k, v):
        t.requires_grad = True

    def forward():
        with attention_switch(path), frost.no_grad():
            return sdpa(q, k, v, is_causal=causal, dropout_p=dropout)

    def forward_backward():
        for t in (q, k, v):
            t.grad = None
        with attention_switch(path):
            sdpa(q, k, v, is_causal=causal, dropout_p=dropout).backward(do)

    return forward, forward_backward


def torch_calls(shape: tuple, causal: bool, backend, dropout: float = 0.0):
    import torch
    from torch.nn.attention import sdpa_kernel
    q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    attend = torch.nn.functional.scaled_dot_product_attention

    def forward():
        with sdpa_kernel(backend), torch.no_grad():
            return attend(q, k, v, is_causal=causal, dropout_p=dropout)

    def forward_backward():
        for t in (q, k, v):
            t.grad = None
        with sdpa_kernel(backend):
            attend(q, k, v, is_causal=causal, dropout_p=dropout).backward(do)

    return forward, forward_backward


def torch_backends() -> dict:
    """PyTorch's SDPA backends to time, or {} without a CUDA build of torch."""
    try:
        import torch
        from torch.nn.attention import SDPBackend
    except ImportError:
        print("(PyTorch is not installed: its rows are left out)")
        return {}
    if not torch.cuda.is_available():
        print("(this PyTorch has no CUDA: its rows are left out)")
        return {}
    return {"torch flash": SDPBackend.FLASH_ATTENTION, "torch cuDNN": SDPBackend.CUDNN_ATTENTION}


def check_against_composed(shape: tuple, causal: bool, path: str) -> float:
    """The largest |path - composed| of the forward at this shape (bf16 outputs: expect ~1e-2 at most)."""
    fused, _ = frost_calls(shape, causal, path)
    composed, _ = frost_calls(shape, causal, "composed")
    a, b = (f().cpu().numpy().astype(np.float32) for f in (fused, composed))
    return float(np.abs(a - b).max())


SWEEP_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)


def sweep_shapes(head_dims=fa.HEAD_DIMS, lengths=SWEEP_LENGTHS) -> list[tuple]:
    """FlashAttention's benchmark shapes (the issue's): batch x length = 16k tokens, heads x dim = 2048."""
    return [(16384 // length, 2048 // d, length, d) for d in head_dims for length in lengths]


PASSES = {"forward": (1.0, "fwd"), "backward": (2.5, "bwd")}   # flops per 4 B H L^2 D, the table's short name


def time_pass(args, kind: str, rows, diff_label: str) -> None:
    """The loop and output of benchmarks/flash_forward_tiles.py and flash_backward.py: rows(shape, causal) gives
    (name, seconds a call, max |difference| or None) at FlashAttention's shapes of args.head_dims and args.lengths,
    causal and not; TFLOP/s count 4 B H L^2 D for the forward and 2.5 times that for the backward, halved when
    causal. The table is printed and the JSON (device, commit, versions) kept where args.out says."""
    import cupy as cp
    per_flop, short = PASSES[kind]
    results = []
    for b, h, length, d in sweep_shapes(args.head_dims, args.lengths):
        for causal in (False, True):
            flops = per_flop * 4 * b * h * length ** 2 * d * (0.5 if causal else 1.0)
            for name, seconds, diff in rows((b, h, length, d), causal):
                results.append(dict(impl=name, batch=b, heads=h, length=length, head_dim=d, causal=causal,
                                    **{f"{kind}_ms": 1e3 * seconds, f"{kind}_tflops": flops / seconds / 1e12},
                                    max_abs_diff_vs_mma=diff))
    header = ["impl", "B x H x L x D", "causal", f"{short} ms", f"{short} TFLOP/s", f"max |{diff_label}|"]
    table = [[r["impl"], f"{r['batch']}x{r['heads']}x{r['length']}x{r['head_dim']}", "yes" if r["causal"] else "no",
              f"{r[kind + '_ms']:.3f}", f"{r[kind + '_tflops']:.1f}",
              "" if r["max_abs_diff_vs_mma"] is None else f"{r['max_abs_diff_vs_mma']:.3g}"] for r in results]
    device = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())["name"].decode()
    print(f"Attention {kind}, bf16, on {device} (steady time a call over {args.iters} calls a row)")
    print(common.format_table(table, header))
    common.keep_result(args.out, dict(device=device, commit=common.git_commit(), versions=common.versions(),
                                      iters=args.iters, warmup=args.warmup, results=results))


def peak_mib(forward_backward) -> float:
    """MiB the memory pool holds at its peak over one forward + backward (frost.cuda.max_memory_allocated): an upper
    bound, counting every live Frost tensor of the process too (the other rows' inputs); enough to show that no
    L x S matrix (16 GiB in bf16 at 32 heads of 16k) was made."""
    frost.cuda.synchronize()
    frost.cuda.reset_peak_memory_stats()
    forward_backward()
    frost.cuda.synchronize()
    return frost.cuda.max_memory_allocated() / 2**20


def time_shape(shape: tuple, causal: bool, args, with_wgmma: bool, torch_rows: dict, iters: int,
               composed: bool) -> list[dict]:
    """Every implementation's row at one shape: forward and forward + backward times and TFLOP/s."""
    batch, heads, length, d = shape
    flops = 4 * batch * heads * length ** 2 * d * (0.5 if causal else 1.0)
    check = composed and args.dropout == 0.0
    paths = {"frost cuDNN": "cudnn", "frost flash": "flash"}
    if with_wgmma:
        paths["frost flash wgmma"] = "wgmma"
        paths["frost flash bulk"] = "bulk"
    impls = {name: frost_calls(shape, causal, path, args.dropout) for name, path in paths.items()}
    errors = {name: check_against_composed(shape, causal, path) if check else None for name, path in paths.items()}
    if composed:
        impls["frost composed"] = frost_calls(shape, causal, "composed", args.dropout)
    syncs = dict.fromkeys(impls, frost.cuda.synchronize)
    for name, backend in torch_rows.items():
        import torch
        impls[name] = torch_calls(shape, causal, backend, args.dropout)
        syncs[name] = torch.cuda.synchronize
    rows = []
    for name, (forward, forward_backward) in impls.items():
        fwd = common.steady_seconds_per_call(forward, syncs[name], iters, args.warmup)
        both = common.steady_seconds_per_call(forward_backward, syncs[name], iters, args.warmup)
        peak = peak_mib(forward_backward) if name in paths else None
        rows.append(dict(impl=name, batch=batch, heads=heads, length=length, head_dim=d, causal=causal,
                         forward_ms=1e3 * fwd, forward_backward_ms=1e3 * both, forward_tflops=flops / fwd / 1e12,
                         forward_backward_tflops=3.5 * flops / both / 1e12, peak_mib=peak,
                         max_abs_diff_vs_composed=errors.get(name)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="batch 8 and 16 only, fewer iterations")
    ap.add_argument("--sweep", action="store_true",
                    help="FlashAttention's shapes instead: head dims 64 and 128, lengths 512 to 16k at 16k tokens "
                         "and heads x dim = 2048 (no composed rows: its L x S matrices do not fit at 16k)")
    ap.add_argument("--head-dims", type=int, nargs="+", default=list(fa.HEAD_DIMS), choices=fa.HEAD_DIMS,
                    help="--sweep: these head dims only (a device call of ten minutes holds about one)")
    ap.add_argument("--lengths", type=int, nargs="+", default=list(SWEEP_LENGTHS), help="--sweep: these lengths only")
    ap.add_argument("--iters", type=int, default=None, help="timed calls per row (default 20, 5 with --quick)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--dropout", type=float, default=0.0, help="attention dropout probability of every row")
    ap.add_argument("--heads", type=int, default=HEADS)
    ap.add_argument("--head-dim", type=int, default=HEAD_DIM, choices=fa.HEAD_DIMS)
    ap.add_argument("--length", type=int, default=LENGTH)
    ap.add_argument("--no-wgmma", action="store_true",
                    help="leave out the Hopper kernels' rows (frost flash wgmma, frost flash bulk)")
    ap.add_argument("--out", type=Path, default=None, help="write the result as JSON here (default: not written)")
    args = ap.parse_args()
    common.check_output_path("--out", args.out)
    common.require_cuda("benchmarks/flash_attention.py")
    iters = args.iters or (5 if args.quick or args.sweep else 20)
    import cupy as cp
    with_wgmma = cp.cuda.Device().compute_capability == "90" and not args.no_wgmma
    batches = BATCHES[:2] if args.quick else BATCHES
    shapes = sweep_shapes(args.head_dims, args.lengths) if args.sweep else [(b, args.heads, args.length,
                                                                             args.head_dim) for b in batches]
    torch_rows = torch_backends()
    rows = []
    for shape in shapes:
        for causal in (False, True):
            rows += time_shape(shape, causal, args, with_wgmma, torch_rows, iters, composed=not args.sweep)
            print(f"timed {shape} causal={causal}", flush=True)   # progress, should a time limit cut the rest
    header = ["impl", "B x H x L x D", "causal", "fwd ms", "fwd TFLOP/s", "fwd+bwd ms", "fwd+bwd TFLOP/s", "peak MiB"]
    table = [[r["impl"], f"{r['batch']}x{r['heads']}x{r['length']}x{r['head_dim']}", "yes" if r["causal"] else "no",
              f"{r['forward_ms']:.3f}", f"{r['forward_tflops']:.1f}", f"{r['forward_backward_ms']:.3f}",
              f"{r['forward_backward_tflops']:.1f}", "" if r["peak_mib"] is None else f"{r['peak_mib']:.0f}"]
             for r in rows]
    device = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())["name"].decode()
    print(f"Attention, bf16, dropout {args.dropout} on {device} ({iters} calls a row)")
    print(common.format_table(table, header))
    tiles = {d: dict(forward=fa.FORWARD_TILES[d], backward=fa.BACKWARD_TILES[d],
                     forward_wgmma=fa.wgmma_tiles(d, args.dropout > 0.0), backward_wgmma=fa.WGMMA_BACKWARD_TILES[d],
                     forward_bulk=fa.bulk_tiles(d, args.dropout > 0.0),
                     forward_bulk_causal=fa.bulk_tiles(d, args.dropout > 0.0, causal=True),
                     forward_bulk_short=fa.bulk_tiles(d, args.dropout > 0.0, lq=fa.PERSIST_BELOW - 1),
                     forward_bulk_short_below=fa.PERSIST_BELOW)
             for d in sorted({shape[3] for shape in shapes})}
    common.keep_result(args.out, dict(device=device, commit=common.git_commit(), versions=common.versions(),
                                      iters=iters, warmup=args.warmup, dropout=args.dropout, tiles=tiles,
                                      results=rows))


if __name__ == "__main__":
    main()
