"""One training step of the seed ResNet on the CPU (batch 32, forward + backward + AdamW): Frost vs PyTorch.

Both run in this process with the same thread count, the same initial weights and the same batch;
after warm-up steps, the median of N repeats is reported, and the ratio Frost / PyTorch (goal: <= 3).

    python benchmarks/cpu_step.py                 # 20 repeats, all cores; prints the table
    python benchmarks/cpu_step.py --threads 1 --repeats 10
    python benchmarks/cpu_step.py --profile       # also a cProfile of one Frost step, top functions
    python benchmarks/cpu_step.py --out benchmarks/results/cpu_step.json   # also the result as JSON, there
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import frost  # noqa: E402
import torch  # noqa: E402

from frost.bench import common  # noqa: E402


# ---------------------------------------------------------------- BLAS threads


def _openblas():
    """NumPy's OpenBLAS library and its symbol prefix/suffix, found through this process's memory map."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower() and line.split()[-1].startswith("/")}
    except OSError:
        return None
    for path in sorted(paths):
        lib = ctypes.CDLL(path)
        for get, set_ in (("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
                          ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
                          ("openblas_get_num_threads", "openblas_set_num_threads")):
            if hasattr(lib, get):
                return getattr(lib, get), getattr(lib, set_), Path(path).name
    return None


def set_threads(n: int) -> dict:
    """Same thread count for PyTorch (intra-op) and NumPy's BLAS; returns what each reports afterwards."""
    torch.set_num_threads(n)
    blas = _openblas()
    info = {"torch_threads": torch.get_num_threads(), "numpy_blas_threads": None, "numpy_blas": None}
    if blas is not None:
        get, set_, name = blas
        set_.argtypes = [ctypes.c_int]
        set_(n)
        info["numpy_blas_threads"] = int(get())
        info["numpy_blas"] = name
    return info


# ---------------------------------------------------------------- the two steps


def frost_setup(seed: int):
    from frost.models.resnet import cifar_resnet
    frost.manual_seed(seed)
    model = cifar_resnet(num_classes=10)
    p = common.PROTOCOL
    from frost.optim import AdamW
    opt = AdamW(model.parameters(), lr=p["lr"], betas=tuple(p["betas"]), eps=p["eps"],
                            weight_decay=p["weight_decay"])
    return model, opt


def torch_setup(frost_model):
    from torch_resnet_cifar10 import make_model
    model = make_model(10)
    copied = copy_weights(frost_model, model)
    p = common.PROTOCOL
    opt = torch.optim.AdamW(model.parameters(), lr=p["lr"], betas=tuple(p["betas"]), eps=p["eps"],
                            weight_decay=p["weight_decay"])
    return model, opt, copied


def copy_weights(frost_model, torch_model) -> bool:
    """Frost's initial parameters and buffers into the torch model (by name, else by order and shape)."""
    src = {k: v.numpy() for k, v in frost_model.state_dict().items()}
    dst = torch_model.state_dict()
    if set(src) != set(dst):
        src_list = [v for k, v in src.items() if not k.endswith("num_batches_tracked")]
        dst_keys = [k for k in dst if not k.endswith("num_batches_tracked")]
        if len(src_list) != len(dst_keys) or any(a.shape != tuple(dst[k].shape) for a, k in zip(src_list, dst_keys)):
            return False
        src = dict(zip(dst_keys, src_list))
    with torch.no_grad():
        for k, v in src.items():
            if k in dst:
                if tuple(dst[k].shape) != v.shape:
                    return False
                dst[k].copy_(torch.from_numpy(np.array(v)))
    return True


def frost_step(model, opt, x: np.ndarray, y: np.ndarray):
    import frost.nn.functional as F
    xb, yb = frost.Tensor(x), frost.Tensor(y)

    def step():
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return float(loss.item())
    return step


def torch_step(model, opt, x: np.ndarray, y: np.ndarray):
    import torch.nn.functional as F
    xb, yb = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return float(loss.item())
    return step


def time_steps(step, warmup: int, repeats: int) -> tuple[list[float], list[float]]:
    """Milliseconds per step over `repeats` steps after `warmup` steps, and all the losses."""
    losses = [step() for _ in range(warmup)]
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        losses.append(step())
        times.append(1000 * (time.perf_counter() - t0))
    return times, losses


def profile_step(step, top: int) -> str:
    """cProfile of one step: the functions with the most own time (tottime) and cumulative time."""
    import cProfile
    import io
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    step()
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    # file names relative to the repository and the environment, not to this machine
    return out.getvalue().replace(str(HERE.parent) + os.sep, "").replace(sys.prefix + os.sep, "<env>/")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="write the result as JSON here (default: not written)")
    p.add_argument("--profile", action="store_true", help="print a cProfile of one Frost step")
    p.add_argument("--profile-top", type=int, default=30)
    args = p.parse_args(argv)
    common.check_output_path("--out", args.out)  # before minutes of timing
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)

    threads = set_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    x = rng.random((common.PROTOCOL["batch_size"], 3, 32, 32), dtype=np.float32)
    y = rng.integers(0, 10, size=common.PROTOCOL["batch_size"]).astype(np.int64)

    f_model, f_opt = frost_setup(args.seed)
    t_model, t_opt, same_weights = torch_setup(f_model)
    f_step, t_step = frost_step(f_model, f_opt, x, y), torch_step(t_model, t_opt, x, y)
    # alternate short runs so that neither framework gets a quieter machine than the other
    f_times, t_times, f_losses, t_losses = [], [], [], []
    half = max(1, args.repeats // 2)
    for warm in (args.warmup, 0):
        ft, fl = time_steps(f_step, warm, half)
        tt, tl = time_steps(t_step, warm, half)
        f_times += ft
        t_times += tt
        f_losses += fl
        t_losses += tl
    f_ms, t_ms = statistics.median(f_times), statistics.median(t_times)
    result = {
        "benchmark": "cpu_step", "model": "seed CIFAR ResNet", "batch_size": common.PROTOCOL["batch_size"],
        "optimizer": "AdamW", "warmup": args.warmup, "repeats": len(f_times),
        "frost_ms_median": f_ms, "torch_ms_median": t_ms, "ratio_frost_over_torch": f_ms / t_ms,
        "frost_ms_min": min(f_times), "torch_ms_min": min(t_times),
        "frost_ms": f_times, "torch_ms": t_times,
        "same_initial_weights": same_weights,
        "first_loss": {"frost": f_losses[0], "torch": t_losses[0]},
        "threads": threads, "cpu": common.cpu_name(), "commit": common.git_commit(HERE),
        "versions": common.versions({"torch": torch.__version__}),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    rows = [["frost", f"{f_ms:.1f}", f"{min(f_times):.1f}"], ["pytorch", f"{t_ms:.1f}", f"{min(t_times):.1f}"]]
    print(f"one training step, seed ResNet, batch 32, AdamW, CPU ({common.cpu_name()}); "
          f"torch threads {threads['torch_threads']}, numpy BLAS threads {threads['numpy_blas_threads']}")
    print(common.format_table(rows, ["framework", "median ms", "best ms"]))
    print(f"ratio frost / pytorch (median): {f_ms / t_ms:.2f}x  (goal <= 3x)")
    if same_weights:
        print(f"first-step loss with the same weights and batch: frost {f_losses[0]:.6f}, torch {t_losses[0]:.6f}")
    if args.profile:
        report = profile_step(f_step, args.profile_top)
        result["profile"] = report
        print(report)
    common.keep_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
