"""Frost's CPU conv2d against PyTorch's, forward + backward, on the shapes of a small CIFAR ResNet; prints a table."""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as TF

import frost
from frost.ops.conv import conv2d

# (name, Cin, Cout, H, kernel, stride, padding, input needs grad)
SHAPES = [
    ("stem 3->16 @32", 3, 16, 32, 3, 1, 1, False),
    ("16->16 @32", 16, 16, 32, 3, 1, 1, True),
    ("16->32 s2 @32", 16, 32, 32, 3, 2, 1, True),
    ("32->32 @16", 32, 32, 16, 3, 1, 1, True),
    ("32->64 s2 @16", 32, 64, 16, 3, 2, 1, True),
    ("64->64 @8", 64, 64, 8, 3, 1, 1, True),
    ("1x1 16->32 s2 @32", 16, 32, 32, 1, 2, 0, True),
    ("1x1 32->64 s2 @16", 32, 64, 16, 1, 2, 0, True),
]


def best_of(fns, repeats: int) -> list:
    """The best time of each function, run alternately so that both see the same machine load."""
    for fn in fns:
        fn()  # warm-up
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [min(ts) for ts in times]


def frost_step(x, w, g, stride, padding):
    x.grad = w.grad = None
    out = conv2d(x, w, None, stride, padding)
    out.backward(g)


def torch_step(x, w, g, stride, padding):
    x.grad = w.grad = None
    out = TF.conv2d(x, w, None, stride, padding)
    out.backward(g)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    print(f"batch {args.batch}, float32, torch threads {threads}, best of {args.repeats} (ms, forward+backward)")
    print(f"{'shape':<20} {'frost':>8} {'torch':>8} {'ratio':>6}")
    total_f = total_t = 0.0
    for name, cin, cout, h, k, s, p, x_grad in SHAPES:
        xa = rng.standard_normal((args.batch, cin, h, h), dtype=np.float32)
        wa = rng.standard_normal((cout, cin, k, k), dtype=np.float32) * 0.1
        ho = (h + 2 * p - k) // s + 1
        ga = rng.standard_normal((args.batch, cout, ho, ho), dtype=np.float32)
        fx, fw = frost.Tensor(xa, requires_grad=x_grad), frost.Tensor(wa, requires_grad=True)
        tx, tw = torch.tensor(xa, requires_grad=x_grad), torch.tensor(wa, requires_grad=True)
        tf, tt = best_of([lambda: frost_step(fx, fw, frost.Tensor(ga), s, p),
                          lambda: torch_step(tx, tw, torch.tensor(ga), s, p)], args.repeats)
        total_f, total_t = total_f + tf, total_t + tt
        print(f"{name:<20} {tf * 1e3:8.2f} {tt * 1e3:8.2f} {tf / tt:6.2f}")
    print(f"{'total':<20} {total_f * 1e3:8.2f} {total_t * 1e3:8.2f} {total_f / total_t:6.2f}")


if __name__ == "__main__":
    main()
