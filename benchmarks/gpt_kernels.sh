#!/usr/bin/env bash
# Where a GPT step spends its GPU time, kernel by kernel: Nsight Compute over two timed steps (NVTX-marked:
# FROST_NVTX_STEPS=1) of Frost's captured step and of torch.compile's, the same `frost bench gpt` arguments, summed
# side by side by benchmarks/kernel_profile.py into OUTDIR/NAME_kernels.json (the raw CSVs beside it).
# Usage: bash benchmarks/gpt_kernels.sh OUTDIR NAME TOP GPT_ARGS...   (PYTHONPATH as the caller's)
set -u
out=${1:?usage: bash benchmarks/gpt_kernels.sh OUTDIR NAME TOP GPT_ARGS...}
name=$2
top=$3
shift 3
if ! command -v ncu > /dev/null; then
    echo "(no ncu on this machine: the kernel profile is left out)"
    exit 0
fi
ncu_args=(--clock-control none --nvtx --nvtx-include "step/" --metrics gpu__time_duration.sum --csv --print-units base)
FROST_NVTX_STEPS=1 timeout 120 ncu "${ncu_args[@]}" python3 -m frost bench gpt "$@" --jit \
    > "$out/ncu_${name}_frost.csv" 2>&1
FROST_NVTX_STEPS=1 timeout 150 ncu "${ncu_args[@]}" python3 benchmarks/torch_gpt.py "$@" --mode compile \
    > "$out/ncu_${name}_torch.csv" 2>&1
python3 benchmarks/kernel_profile.py "$out/ncu_${name}_frost.csv" "$out/ncu_${name}_torch.csv" --steps 2 \
    --labels frost_jit,torch_compile --top "$top" --out "$out/${name}_kernels.json" 2>&1 | tail -$((top + 4))
