"""`frost bench gpt` and its PyTorch twin (benchmarks/torch_gpt.py) in one call, with the ratios.

The same arguments go to both (the preset, data, sizes, precision, seeds); Frost runs first (with --jit if given),
then PyTorch in each of --torch-modes. Each prints its own table; then one line per PyTorch mode gives Frost's
ms/step over PyTorch's (below 1: Frost is faster), the tokens/s ratio and the held-out losses (means over the
seeds). JSON (both results and the ratios) only with --out.

    python benchmarks/gpt.py --preset shakespeare-char --data input.txt --precision bf16 --jit --out gpt.json
    python benchmarks/gpt.py --device cpu --steps 5 --batch-size 2 --block-size 32   # a CPU smoke run
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from frost.bench import common, gpt  # noqa: E402


def load_torch_twin():
    spec = importlib.util.spec_from_file_location("benchmarks_torch_gpt", HERE / "torch_gpt.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


torch_gpt = load_torch_twin()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    gpt.add_arguments(p)
    p.add_argument("--torch-modes", default=None,
                   help=f"comma-separated PyTorch modes out of {', '.join(torch_gpt.MODES)} (default: all on cuda, "
                        f"eager on cpu)")
    args = p.parse_args(argv)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    default_modes = ",".join(torch_gpt.MODES) if args.device == "cuda" else "eager"
    args.torch_modes = [m.strip() for m in (args.torch_modes or default_modes).split(",") if m.strip()]
    unknown = [m for m in args.torch_modes if m not in torch_gpt.MODES]
    if unknown or not args.torch_modes:
        p.error(f"--torch-modes: {unknown or 'none given'}; choose from {', '.join(torch_gpt.MODES)}")
    common.check_output_path("--out", args.out)
    return args


def mean_of(result: dict, key: str) -> float | None:
    entry = result["summary"].get(key)
    return entry["mean"] if entry else None


def ratios(frost_result: dict, torch_result: dict) -> dict:
    """Frost over PyTorch: step time and throughput, and both held-out losses (means over the seeds)."""
    return {"ms_per_step": mean_of(frost_result, "ms_per_step") / mean_of(torch_result, "ms_per_step"),
            "tokens_per_s": mean_of(frost_result, "tokens_per_s") / mean_of(torch_result, "tokens_per_s"),
            "val_loss_frost": mean_of(frost_result, "val_loss"), "val_loss_pytorch": mean_of(torch_result, "val_loss")}


def ratio_table(frost_result: dict, compared: dict[str, dict]) -> str:
    rows = [[f"frost {frost_result['mode']} / pytorch {mode}", f"{r['ms_per_step']:.2f}x", f"{r['tokens_per_s']:.2f}x",
             f"{r['val_loss_frost']:.4f}", f"{r['val_loss_pytorch']:.4f}"] for mode, r in compared.items()]
    header = ["", "ms/step ratio", "tokens/s ratio", "frost val loss", "pytorch val loss"]
    return f"Frost against PyTorch ({frost_result['precision']})\n" + common.format_table(rows, header)


def main(argv=None) -> dict:
    args = parse_args(argv)
    frost_result = gpt.run(argparse.Namespace(**{**vars(args), "out": None}))
    torch_results = {mode: torch_gpt.run(argparse.Namespace(**{**vars(args), "out": None, "jit": False, "mode": mode}))
                     for mode in args.torch_modes}
    compared = {mode: ratios(frost_result, r) for mode, r in torch_results.items()}
    print(ratio_table(frost_result, compared))
    result = {"schema": common.SCHEMA, "benchmark": "gpt-compare", "frost": frost_result, "pytorch": torch_results,
              "ratios": compared}
    common.keep_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
