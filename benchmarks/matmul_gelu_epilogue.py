"""Is GELU worth moving into the matrix product's epilogue? GPT-2 124M's MLP at batch 16 x 1024 in bf16, each variant
captured in a CUDA graph and replayed (frost.backend.cuda.graph_time_us), GPU microseconds a call:

  forward   today: c_fc's product with its bias in cuDNN's epilogue, then Frost's GELU kernel (gelu_forward_vec8)
            fused: one cuDNN graph, matmul -> bias -> gelu_approx_tanh, writing GELU's input (kept for the backward)
            and its output (frost.backend.cudnn.matmul(activation="gelu_tanh"), what a jitted linear layer runs unless
            FROST_CUDNN_MATMUL_GELU=0); and writing the output only (what a backward that recomputes the product
            would need)
  backward  today: c_proj's input gradient (dY @ W), then Frost's GELU backward with the c_fc bias's column sums
            (gelu_backward_sum_rows, then sum_rows' finalize)
            fused: one cuDNN graph, matmul -> gelu_approx_tanh_backward(., GELU's input); and with a column-sum
            reduction beside it (the bias gradient)

Each fused result is compared with today's (max |difference| over max |value|). Usage:
    python benchmarks/matmul_gelu_epilogue.py [--rows 16384] [--width 768] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time

import numpy as np

import frost
from frost.accel.bias import SUM_ROWS_THREADS, row_chunks, sum_rows_kernels_call
from frost.accel.gelu import GELU_SUM_ROWS_KERNELS, GELU_THREADS, GELU_VECTOR_KERNELS
from frost.backend import cuda
from frost.backend import cudnn as frost_cudnn
from frost.kernel import cdiv


class EpilogueGraph(frost_cudnn._Graph):
    """One cuDNN graph the backend does not build: kind "gelu_only" (A @ B + bias -> GELU's output only), "dgelu"
    (A @ B, times GELU's slope at X), "dgelu_sums" (that, and its column sums in float32). The fused forward that a
    linear layer runs (GELU's input and output) is the backend's own, frost.backend.cudnn.matmul(activation=)."""

    def __init__(self, kind: str, arrays: tuple) -> None:
        import cudnn
        g, dt = frost_cudnn._new_graph(arrays[0].dtype, "matmul")
        self.graph = g
        names = {"gelu_only": "A B bias", "dgelu": "A B X", "dgelu_sums": "A B X"}[kind].split()
        inputs = [frost_cudnn._declare(g, n, a, frost_cudnn._data_type(a.dtype, "matmul"))
                  for n, a in zip(names, arrays)]
        product = g.matmul(inputs[0], inputs[1], compute_data_type=cudnn.data_type.FLOAT)
        outputs = arrays[len(names):]
        if kind.startswith("gelu"):
            pre = g.bias(input=product, bias=inputs[2], compute_data_type=cudnn.data_type.FLOAT)
            result = [g.gelu_approx_tanh(input=pre, compute_data_type=cudnn.data_type.FLOAT)]
        else:
            dx = g.gelu_approx_tanh_backward(loss=product, input=inputs[2], compute_data_type=cudnn.data_type.FLOAT)
            result = [dx]
            if kind == "dgelu_sums":
                result.append(g.reduction(input=dx, mode=cudnn.reduction_mode.ADD,
                                          compute_data_type=cudnn.data_type.FLOAT))
        for t, a in zip(result, outputs):
            frost_cudnn._output(t, a, frost_cudnn._data_type(a.dtype, "matmul"))
        self._finish((*inputs, *result), arrays[0].dtype)


def fused(kind: str, arrays: tuple):
    key = frost_cudnn._key("epilogue_" + kind, arrays, [str(a.dtype) for a in arrays])
    return frost_cudnn._built(key, lambda: EpilogueGraph(kind, arrays), arrays)


def time_fused(cp, direction: str, kind: str, arrays: tuple, checks: list) -> dict:
    """GPU microseconds a call of the fused graph `kind` on `arrays`, and each (suffix, output, today's output)
    check's relative difference; the error where cuDNN builds no such graph."""
    try:
        graph = fused(kind, arrays)
        graph.run(arrays)
        row = {f"{direction}_{kind}_us": cuda.graph_time_us(lambda: graph.run(arrays))}
        row.update({f"{direction}_{kind}{suffix}_diff": relative_difference(cp, got, want)
                    for suffix, got, want in checks})
        return row
    except Exception as e:   # cuDNN builds no such graph here: say so
        return {f"{direction}_{kind}_error": f"{type(e).__name__}: {e}"[:300]}


def time_backend_gelu(cp, x, w, bias, pre_today, y_today) -> dict:
    """The fused forward a linear layer runs (frost.backend.cudnn.matmul with activation="gelu_tanh": GELU's input
    and output in one graph): GPU microseconds a call, and both outputs' relative differences from today's."""
    def forward():
        return frost_cudnn.matmul(x, w, bias=bias, activation="gelu_tanh")
    fused_outputs = forward()
    if fused_outputs is None:
        return {"forward_gelu_error": f"cuDNN builds no such graph: {frost_cudnn.refusals()}"[:300]}
    return {"forward_gelu_us": cuda.graph_time_us(forward),
            "forward_gelu_diff": relative_difference(cp, fused_outputs[1], y_today),
            "forward_gelu_pre_diff": relative_difference(cp, fused_outputs[0], pre_today)}


def relative_difference(cp, got, want) -> float:
    got, want = (frost.Tensor(a).float().data for a in (got, want))
    return float(cp.abs(got - want).max() / cp.abs(want).max())


def run(rows: int, width: int) -> dict:
    cp = cuda.cupy()
    hidden = 4 * width
    frost.manual_seed(0)

    def normal(shape, scale=1.0):    # bf16 CuPy arrays made by Frost's casts
        return (frost.randn(*shape, device="cuda") * scale).to(frost.bfloat16).data

    x, dy = normal((1, rows, width)), normal((1, rows, width), 0.01)
    bf = x.dtype
    w_fc, b_fc, w_proj = normal((hidden, width), 0.02), normal((1, 1, hidden), 0.02), normal((width, hidden), 0.02)
    b_fc_t, w_fc_t = b_fc, w_fc.T[None]          # the linear layer's x @ w.T: a transposed view
    per_thread, gelu_vec8, _ = GELU_VECTOR_KERNELS["bfloat16"]
    n = rows * hidden
    results = {"rows": rows, "width": width, "hidden": hidden}

    y = cp.empty((1, rows, hidden), bf)

    def forward_today():
        h = frost_cudnn.matmul(x, w_fc_t, bias=b_fc_t.reshape(-1))
        gelu_vec8[cdiv(n, per_thread * GELU_THREADS), GELU_THREADS](h.reshape(-1), y.reshape(-1), n, TANH=True)
        return h

    h_today = forward_today()
    y_today = y.copy()
    results["forward_today_us"] = cuda.graph_time_us(forward_today)
    results.update(time_backend_gelu(cp, x, w_fc_t, b_fc_t.reshape(-1), h_today, y_today))
    results.update(time_fused(cp, "forward", "gelu_only", (x, w_fc_t, b_fc_t, y), [("", y, y_today)]))

    dx = cp.empty((1, rows, hidden), bf)
    chunk, parts = row_chunks(rows)
    part = cp.empty((parts, hidden), cp.float32)
    sums_kernel = GELU_SUM_ROWS_KERNELS["bfloat16"]

    def backward_today():
        dh = frost_cudnn.matmul(dy, w_proj[None])
        sums_kernel[(cdiv(hidden // 8, SUM_ROWS_THREADS), parts), SUM_ROWS_THREADS](
            dh.reshape(-1), h_today.reshape(-1), dx.reshape(-1), part.reshape(-1), rows, hidden, chunk, TANH=True)
        return sum_rows_kernels_call(dx.reshape(rows, hidden), np.float32, partials=part)

    sums_today = backward_today()
    dx_today = dx.copy()
    results["backward_today_us"] = cuda.graph_time_us(backward_today)
    sums = cp.empty((1, 1, hidden), cp.float32)
    for kind in ("dgelu", "dgelu_sums"):
        extra = (sums,) if kind == "dgelu_sums" else ()
        checks = [("", dx, dx_today)] + ([("_sums", sums.reshape(-1), sums_today)] if extra else [])
        results.update(time_fused(cp, "backward", kind, (dy, w_proj[None], h_today, dx, *extra), checks))
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=16384, help="batch x sequence (default 16 x 1024)")
    p.add_argument("--width", type=int, default=768, help="the model's width (GPT-2 124M: 768)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args()
    if not (cuda.is_available() and frost_cudnn.available()):
        print("matmul_gelu_epilogue: needs a CUDA GPU and the cuDNN frontend", file=sys.stderr)
        return 1
    results = run(args.rows, args.width)
    for k, v in results.items():
        print(f"{k:28s} {v:.4g}" if isinstance(v, float) else f"{k:28s} {v}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    results.update(device=cuda.device_name(), commit=commit,
                   date=time.strftime("%Y-%m-%d"), python=platform.python_version())
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
