#!/usr/bin/env bash
# Where the GPT's step spends its GPU time, kernel by kernel, Frost (frost.jit) against torch.compile, and the
# transformer kernels' A/B, each result in OUTDIR. Usage: bash benchmarks/gpu_profile.sh OUTDIR [TEXT_FILE]
#   1. Nsight Compute over two steady steps of each (NVTX-marked: FROST_NVTX_STEPS=1), summed per kernel by
#      benchmarks/kernel_profile.py (OUTDIR/gpt_kernels.json; the raw CSVs beside it)
#   2. benchmarks/transformer_kernels.py --quick: LayerNorm and GELU, with the GPU time of graph replays and the
#      one-value-a-thread A/B of the 16-bit vector accesses
#   3. benchmarks/flash_attention.py --quick
# Each step has its own time limit; the whole fits one ten-minute device call.
set -u
out=${1:?usage: bash benchmarks/gpu_profile.sh OUTDIR [TEXT_FILE]}
text=${2:-}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"  # benchmarks/*.py import frost from this tree
data=()
[ -n "$text" ] && data=(--data "$text")
gpt=(--preset shakespeare-char ${data[@]+"${data[@]}"} --precision bf16 --steps 6 --warmup 4 --eval-interval 0
     --eval-iters 2 --quiet)
ncu_args=(--clock-control none --nvtx --nvtx-include "step/" --metrics gpu__time_duration.sum --csv
          --print-units base)
if command -v ncu > /dev/null; then
    FROST_NVTX_STEPS=1 timeout 200 ncu "${ncu_args[@]}" python3 -m frost bench gpt "${gpt[@]}" --jit \
        > "$out/ncu_gpt_frost.csv" 2>&1
    FROST_NVTX_STEPS=1 timeout 200 ncu "${ncu_args[@]}" python3 benchmarks/torch_gpt.py "${gpt[@]}" --mode compile \
        > "$out/ncu_gpt_torch.csv" 2>&1
    python3 benchmarks/kernel_profile.py "$out/ncu_gpt_frost.csv" "$out/ncu_gpt_torch.csv" --steps 2 \
        --labels frost_jit,torch_compile --top 45 --out "$out/gpt_kernels.json" 2>&1 | tail -50
else
    echo "(no ncu on this machine: the kernel profile is left out)"
fi
timeout 120 python3 benchmarks/transformer_kernels.py --quick --out "$out/transformer_kernels.json" 2>&1 | tail -14
timeout 90 python3 benchmarks/flash_attention.py --quick --out "$out/flash_attention.json" 2>&1 | tail -12
