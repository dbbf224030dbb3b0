"""Which stores does compute-sanitizer's initcheck see? A probe for reading its reports on Frost's GPU tests.

Why: initcheck reported every element of some results as uninitialized (cuBLASLt's bf16 products, a cuDNN float32
strided convolution in test_conv_fprop_mma) while the NaN-filled allocator (`pytest --poison-gpu-memory`) shows
every element written and the values are right. Each mode writes a fresh array one way, then reads every element
with CuPy's copy kernel and checks the values; "values right" with initcheck reports means the tool missed the
stores. Run each mode under the tool:

    for m in frost_plain frost_graph_first cupy_plain cupy_graph_first bulk_store cudnn_conv; do
        compute-sanitizer --tool initcheck --report-api-errors no python3 benchmarks/initcheck_probe.py $m
    done

frost_* fill with a Frost kernel, cupy_* with a CuPy elementwise kernel, each first run inside a captured and
replayed CUDA graph (*_graph_first) or not (*_plain); bulk_store writes through the copy engine (PTX
cp.async.bulk from shared to global memory, the tensor-memory-accelerator path Hopper's library kernels use for
their epilogues); cudnn_conv is Frost's conv2d_forward on a shape's first call (cuDNN runs it)."""
from __future__ import annotations

import argparse

import numpy as np

from frost.backend import cuda
from frost.kernel import Array, bdx, bx, f32, i32, kernel, tx
from frost.ops.conv import conv2d_forward

MODES = ("frost_plain", "frost_graph_first", "cupy_plain", "cupy_graph_first", "bulk_store", "cudnn_conv")
N = 1 << 12
CHUNK = 1024   # floats one block of bulk_store stores

# a probe of the tool, not product code: the store direction of cp.async.bulk is not in the kernel language
BULK_STORE = r"""
extern "C" __global__ void bulk_store(float* out) {
    __shared__ __align__(128) float s[1024];
    for (int i = threadIdx.x; i < 1024; i += blockDim.x) s[i] = (float)(blockIdx.x * 1024 + i);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned src = (unsigned)__cvta_generic_to_shared(s);
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], 4096;" :: "l"(out + blockIdx.x * 1024),
                     "r"(src) : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    }
}
"""


@kernel
def fill_with_index(out: Array[f32], n: i32):
    i = bx * bdx + tx
    if i < n:
        out[i] = f32(i)


def filled(mode: str, cp):
    """A fresh array of N floats that `mode` wrote with 0, 1, 2, ..."""
    cupy_fill = cp.ElementwiseKernel("", "float32 y", "y = (float)i", "fill_with_index")

    def launch(out) -> None:
        if mode.startswith("frost"):
            fill_with_index[N // 256, 256](out, N)
        elif mode.startswith("cupy"):
            cupy_fill(out)
        else:
            cp.RawKernel(BULK_STORE, "bulk_store")((N // CHUNK,), (128,), (out,))

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
    return out


def conv_reference(x: np.ndarray, w: np.ndarray, stride: int, pad: int) -> np.ndarray:
    n, c, h, _ = x.shape
    k = w.shape[-1]
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ho = (h + 2 * pad - k) // stride + 1
    cols = np.stack([xp[:, :, i:i + stride * ho:stride, j:j + stride * ho:stride]
                     for i in range(k) for j in range(k)], axis=2)          # n, c, k*k, ho, ho
    return np.einsum("nckhw,ock->nohw", cols, w.reshape(w.shape[0], c, k * k).astype(np.float64))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=MODES)
    mode = parser.parse_args().mode
    cp = cuda.cupy()
    if mode == "cudnn_conv":
        rng = np.random.default_rng(0)
        x = rng.standard_normal((32, 16, 32, 32)).astype(np.float32)
        w = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
        y = conv2d_forward(cp.asarray(x), cp.asarray(w), 2, 1)
        got = cp.asnumpy(cp.ascontiguousarray(y))
        want = conv_reference(x, w, 2, 1)
        ok = np.abs(got - want).max() <= 1e-3 * np.abs(want).max()
    else:
        out = filled(mode, cp)
        got = cp.asnumpy(out.reshape(64, 64).T.copy())   # CuPy's copy kernel reads every element
        ok = np.array_equal(got, np.arange(N, dtype=np.float32).reshape(64, 64).T)
    if not ok:
        raise SystemExit(f"{mode}: wrong values")
    print(f"{mode}: values right")


if __name__ == "__main__":
    main()
