"""Does compute-sanitizer's initcheck see the stores of a kernel whose first launch was inside a CUDA-graph capture?

Why: initcheck reported every element of two conv results as uninitialized in one run (test_conv_fprop_mma's TF32
test, H100, 2e9921c) and nothing in five others that logged or forced the kernel picked; the NaN-filled allocator
(`pytest --poison-gpu-memory`) shows every element written. The suspect is that `choose` first ran the picked kernel
inside its CUDA-graph timing. Run each mode under the tool and compare:

    for m in frost_plain frost_graph_first cupy_plain cupy_graph_first; do
        compute-sanitizer --tool initcheck --report-api-errors no python3 benchmarks/initcheck_graph_first.py $m
    done

Each mode fills a fresh array with a Frost kernel (frost_*) or a CuPy elementwise kernel (cupy_*), after first
running that kernel in a captured and replayed graph (*_graph_first) or not (*_plain), then reads every element with
CuPy's copy kernel and checks the values; "values right" with initcheck reports means the tool missed the stores."""
from __future__ import annotations

import argparse

import numpy as np

from frost.backend import cuda
from frost.kernel import Array, bdx, bx, f32, i32, kernel, tx

MODES = ("frost_plain", "frost_graph_first", "cupy_plain", "cupy_graph_first")
N = 1 << 12


@kernel
def fill_with_index(out: Array[f32], n: i32):
    i = bx * bdx + tx
    if i < n:
        out[i] = f32(i)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=MODES)
    mode = parser.parse_args().mode
    cp = cuda.cupy()
    cupy_fill = cp.ElementwiseKernel("", "float32 y", "y = (float)i", "fill_with_index")

    def launch(out) -> None:
        if mode.startswith("frost"):
            fill_with_index[N // 256, 256](out, N)
        else:
            cupy_fill(out)

    if mode.endswith("graph_first"):
        stream = cp.cuda.Stream(non_blocking=True)
        scratch = cp.empty(N, cp.float32)
        with stream:
            stream.begin_capture()
            launch(scratch)
            graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
    out = cp.empty(N, cp.float32)
    launch(out)
    got = cp.asnumpy(out.reshape(64, 64).T.copy())   # CuPy's copy kernel reads every element
    if not np.array_equal(got, np.arange(N, dtype=np.float32).reshape(64, 64).T):
        raise SystemExit(f"{mode}: wrong values")
    print(f"{mode}: values right")


if __name__ == "__main__":
    main()
