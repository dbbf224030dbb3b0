"""Our tensor-core convolutions against cuDNN's in one process: the seed ResNet's bf16 channels-last jit step time.

Run on a GPU machine:  python benchmarks/conv_kernels_ab.py [--rounds 3] [--out FILE.json]
Variants (switched by the environment that frost.accel.conv_fprop_mma and conv_wgrad read at every call): cudnn
(FROST_CONV_FPROP_MMA=0), forward (our forward convolutions where faster), forward+dgrad (also our input gradients
where faster: FROST_CONV_DGRAD_MMA=1, the default), and the same with every weight gradient's finalize in a launch of
its own (FROST_CONV_WGRAD_CARRY=0) instead of riding with the next weight-gradient launch.
Each round builds the model and captures the step anew for every variant, in turn (machines drift within a process:
alternating keeps the comparison fair); the step time is benchmarks/step_time.py's (median of 5 runs of 200 steps).
"""
import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from frost.bench import common  # noqa: E402

VARIANTS = {"cudnn": {"FROST_CONV_FPROP_MMA": "0", "FROST_CONV_DGRAD_MMA": "0", "FROST_CONV_WGRAD_CARRY": "1"},
            "forward": {"FROST_CONV_FPROP_MMA": "1", "FROST_CONV_DGRAD_MMA": "0", "FROST_CONV_WGRAD_CARRY": "1"},
            "forward+dgrad, own finalizes": {"FROST_CONV_FPROP_MMA": "1", "FROST_CONV_DGRAD_MMA": "1",
                                             "FROST_CONV_WGRAD_CARRY": "0"},
            "forward+dgrad": {"FROST_CONV_FPROP_MMA": "1", "FROST_CONV_DGRAD_MMA": "1", "FROST_CONV_WGRAD_CARRY": "1"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="write the result as JSON here (default: not written)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import step_time
    runs: dict = {name: [] for name in VARIANTS}
    for rnd in range(args.rounds):
        for name, env in VARIANTS.items():
            os.environ.update(env)
            ms = step_time.frost_rows(200, 5, "bf16", True, channels_last=True)["ms_per_step"]
            runs[name].append(ms)
            print(f"round {rnd}  {name:29s} {ms:.4f} ms/step", flush=True)
    print("\n| variant | ms/step, each round | median |\n|---|---|---|")
    for name, ms in runs.items():
        print(f"| {name} | {', '.join(f'{m:.3f}' for m in ms)} | {statistics.median(ms):.3f} |")
    choices = per_shape_choices()
    common.keep_result(args.out, {"variants": VARIANTS, "ms_per_step": runs, "per_shape": choices})


def per_shape_choices() -> list[dict]:
    """What `conv_fprop_mma.choose` decided at each shape (forward, and input gradient for the dgrad variant): our
    best candidate's and cuDNN's us per call, as it timed them. Printed as a table; returned for the JSON."""
    from frost.accel import conv_fprop_mma
    rows = []
    print("\n| x shape | w shape | padding | pass | ours us | cuDNN us | runs |\n|---|---|---|---|---|---|---|")
    for key, c in sorted(conv_fprop_mma._choices.load().items()):
        x_shape, w_shape, padding, _dtype, *flip = json.loads(key)
        row = {"x": x_shape, "w": w_shape, "padding": padding, "pass": "dgrad" if flip else "forward",
               "ours_us": c["ours_us"], "cudnn_us": c["cudnn_us"], "runs": "ours" if c["ours"] else "cuDNN"}
        rows.append(row)
        print(f"| {x_shape} | {w_shape} | {padding} | {row['pass']} | {c['ours_us']:.2f} | {c['cudnn_us']:.2f} | "
              f"{row['runs']} |")
    return rows


if __name__ == "__main__":
    main()
