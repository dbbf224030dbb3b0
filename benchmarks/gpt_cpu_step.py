"""One GPT training step on the CPU (forward + backward + AdamW), frost.models.gpt against a PyTorch twin.

The model is nanoGPT's shakespeare-char configuration (6 layers, 6 heads, 384 wide, block 256, dropout 0.2,
no biases, 65 characters) in float32, batch 8 of random tokens; both frameworks start from the same weights,
run in this process with the same thread count, and alternate short runs; the median of the repeats is reported
with the ratio Frost / PyTorch. JSON is written only with --out.

    python benchmarks/gpt_cpu_step.py
    python benchmarks/gpt_cpu_step.py --threads 1 --repeats 6 --out benchmarks/results/gpt_cpu_step.json
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REFERENCE_MODEL = HERE.parent / "tests" / "models" / "torch_gpt.py"
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import frost  # noqa: E402
import torch  # noqa: E402

from cpu_step import set_threads, time_steps  # noqa: E402
from frost.bench import common  # noqa: E402
from frost.models import GPT, GPTConfig  # noqa: E402

WEIGHT_DECAY, LR, BETAS = 0.1, 1e-3, (0.9, 0.99)  # nanoGPT's train_shakespeare_char settings


def load_twin_class() -> type:
    """nanoGPT's model in PyTorch: tests/models/torch_gpt.py's, the oracle frost.models.gpt is tested against."""
    spec = importlib.util.spec_from_file_location("frost_torch_gpt_reference", REFERENCE_MODEL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TorchGPT


TorchGPT = load_twin_class()


def torch_twin(model: GPT) -> tuple[TorchGPT, torch.optim.AdamW]:
    twin = TorchGPT(model.config)
    twin.load_state_dict({k: torch.from_numpy(v.numpy().copy()) for k, v in model.state_dict().items()})
    params = list(twin.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": WEIGHT_DECAY},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=LR, betas=BETAS)
    return twin, opt


def frost_step(model: GPT, opt, x: np.ndarray, y: np.ndarray):
    xb, yb = frost.tensor(x), frost.tensor(y)

    def step() -> float:
        _, loss = model(xb, yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return float(loss.item())
    return step


def torch_step(model: TorchGPT, opt, x: np.ndarray, y: np.ndarray):
    xb, yb = torch.from_numpy(x), torch.from_numpy(y)

    def step() -> float:
        _, loss = model(xb, yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return float(loss.item())
    return step


def eval_losses(model: GPT, twin: TorchGPT, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Both models' loss on the batch without dropout: the same weights give the same loss (float32)."""
    model.eval()
    twin.eval()
    with frost.no_grad(), torch.no_grad():
        ours = model(frost.tensor(x), frost.tensor(y))[1].item()
        theirs = twin(torch.from_numpy(x), torch.from_numpy(y))[1].item()
    model.train()
    twin.train()
    return ours, theirs


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    args = p.parse_args(argv)

    threads = set_threads(args.threads)
    config = GPTConfig.shakespeare_char()
    rng = np.random.default_rng(args.seed)
    x = rng.integers(0, config.vocab_size, size=(args.batch, config.block_size))
    y = rng.integers(0, config.vocab_size, size=(args.batch, config.block_size))
    frost.manual_seed(args.seed)
    torch.manual_seed(args.seed)
    model = GPT(config)
    opt = model.configure_optimizers(WEIGHT_DECAY, LR, BETAS)
    twin, twin_opt = torch_twin(model)
    first_loss = eval_losses(model, twin, x, y)
    steps = {"frost": frost_step(model, opt, x, y), "pytorch": torch_step(twin, twin_opt, x, y)}
    times: dict[str, list[float]] = {name: [] for name in steps}
    half = max(1, args.repeats // 2)
    for warm in (args.warmup, 0):  # alternate, so that neither framework gets a quieter machine
        for name, step in steps.items():
            times[name] += time_steps(step, warm, half)[0]
    median = {name: statistics.median(t) for name, t in times.items()}
    ratio = median["frost"] / median["pytorch"]
    print(f"one GPT training step (shakespeare-char: 6x384, block 256, dropout 0.2), batch {args.batch}, float32, "
          f"AdamW, CPU ({common.cpu_name()}); torch threads {threads['torch_threads']}, numpy BLAS threads "
          f"{threads['numpy_blas_threads']}")
    rows = [[name, f"{median[name]:.1f}", f"{min(t):.1f}"] for name, t in times.items()]
    print(common.format_table(rows, ["framework", "median ms", "best ms"]))
    print(f"ratio frost / pytorch (median): {ratio:.2f}x")
    print(f"loss before training, same weights, no dropout: frost {first_loss[0]:.6f}, pytorch {first_loss[1]:.6f}")
    result = {
        "benchmark": "gpt_cpu_step", "model": "GPT shakespeare-char (nanoGPT)", "batch_size": args.batch,
        "block_size": config.block_size, "dtype": "float32", "optimizer": "AdamW", "warmup": args.warmup,
        "repeats": len(times["frost"]), "frost_ms_median": median["frost"], "torch_ms_median": median["pytorch"],
        "ratio_frost_over_torch": ratio, "frost_ms": times["frost"], "torch_ms": times["pytorch"],
        "eval_loss_same_weights": {"frost": first_loss[0], "torch": first_loss[1]},
        "threads": threads, "cpu": common.cpu_name(), "commit": common.git_commit(HERE),
        "versions": common.versions({"torch": torch.__version__}),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"written to {args.out}")
    return result


if __name__ == "__main__":
    main()
