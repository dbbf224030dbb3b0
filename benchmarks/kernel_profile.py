"""Where a training step's GPU time goes, kernel by kernel, from Nsight Compute's CSV: the kernels grouped by name
with their launches and time per step, largest first; with a second CSV (the opponent's), both side by side.

Profile the steady steps only: the step loop of `frost bench gpt` and benchmarks/torch_gpt.py marks each timed step
with an NVTX range when FROST_NVTX_STEPS=1, which ncu keeps with `--nvtx --nvtx-include step/`:

    FROST_NVTX_STEPS=1 ncu --clock-control none --nvtx --nvtx-include step/ --metrics gpu__time_duration.sum \\
        --csv --print-units base python -m frost bench gpt ... --steps 6 --warmup 4 > frost.csv
    python benchmarks/kernel_profile.py frost.csv [torch.csv] --steps 2 [--top 40] [--out FILE.json]

ncu runs each kernel alone (serialized, caches flushed by default), so the sum is the kernels' own time, not the
step's wall time (which overlaps nothing on one stream but adds launch gaps); it shows where the difference lies.
"""
from __future__ import annotations

import argparse
import csv
import io
import re
from pathlib import Path

from frost.bench import common

TIME_METRIC = "gpu__time_duration.sum"
# how a kernel's name is shortened for grouping: template arguments and parameter lists dropped
_TEMPLATE = re.compile(r"<.*>")
_PARAMS = re.compile(r"\(.*\)")


def read_kernel_times(text: str) -> list[tuple[str, float]]:
    """(kernel name, nanoseconds) of every profiled launch in ncu's --csv output (lines before its header, which
    the profiled program printed, are skipped)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError("kernel_profile: no ncu CSV header (a line starting with \"ID\") in the input")
    rows = []
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if row.get("Metric Name") != TIME_METRIC:
            continue
        value = float(row["Metric Value"].replace(",", ""))
        scale = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6}.get(
            row.get("Metric Unit", "nsecond"), 1.0)
        rows.append((row["Kernel Name"], value * scale))
    return rows


def short_name(name: str) -> str:
    """A kernel's name without template arguments and parameters (CUTLASS's and cuDNN's run to pages)."""
    previous = None
    while previous != name:
        previous, name = name, _TEMPLATE.sub("", name)
    return _PARAMS.sub("", name).strip()[:80]


def group(times: list[tuple[str, float]], steps: int) -> dict[str, dict]:
    """name -> launches and microseconds per step."""
    out: dict[str, dict] = {}
    for name, ns in times:
        entry = out.setdefault(short_name(name), {"launches": 0, "us": 0.0})
        entry["launches"] += 1
        entry["us"] += ns / 1e3
    for entry in out.values():
        entry["launches"] /= steps
        entry["us"] /= steps
    return out


def table(groups: list[dict[str, dict]], labels: list[str], top: int) -> str:
    totals = [sum(e["us"] for e in g.values()) for g in groups]
    names = sorted(set().union(*groups), key=lambda n: -max(g.get(n, {"us": 0})["us"] for g in groups))
    header = ["kernel"] + [f"{label} {what}" for label in labels for what in ("us/step", "launches")]
    rows = []
    for name in names[:top]:
        row = [name]
        for g in groups:
            e = g.get(name)
            row += ["" if e is None else f"{e['us']:.1f}", "" if e is None else f"{e['launches']:g}"]
        rows.append(row)
    rows.append(["total (all kernels)"] + [cell for t, g in zip(totals, groups)
                                           for cell in (f"{t:.1f}", f"{sum(e['launches'] for e in g.values()):g}")])
    return common.format_table(rows, header)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv", type=Path, nargs="+", help="ncu --csv output (one or two files)")
    p.add_argument("--steps", type=int, required=True, help="training steps inside the profiled ranges")
    p.add_argument("--labels", default=None, help="names of the columns, comma-separated (default: file names)")
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--out", type=Path, default=None, help="write the grouped times as JSON here")
    args = p.parse_args(argv)
    common.check_output_path("--out", args.out)
    if args.steps < 1:
        raise SystemExit("kernel_profile: --steps must be at least 1")
    labels = args.labels.split(",") if args.labels else [f.stem for f in args.csv]
    if len(labels) != len(args.csv):
        raise SystemExit(f"kernel_profile: {len(labels)} labels for {len(args.csv)} files")
    groups = []
    for path in args.csv:
        try:
            groups.append(group(read_kernel_times(path.read_text(errors="replace")), args.steps))
        except (OSError, ValueError) as exc:
            raise SystemExit(f"kernel_profile: {path}: {exc}") from None
    print(table(groups, labels, args.top))
    result = {"steps": args.steps, "labels": labels, "groups": dict(zip(labels, groups))}
    common.keep_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
