#!/usr/bin/env bash
# Issue 30's accuracy protocol on the GPU, Frost and PyTorch one after the other: nanoGPT's shakespeare-char run
# (5,000 steps, lr 1e-3 cosine to 1e-4 after 100 warm-up steps, AdamW (0.9, 0.99), an evaluation of 200 batches
# of each split every 250 steps), bf16, three seeds: Frost's captured step (frost.jit, evaluations captured too),
# then torch.compile. Each JSON holds the best validation loss, its step and the wall time to reach 1.48; compare
# with `python benchmarks/report.py OUTDIR/gpt_protocol_*.json --out-dir OUTDIR`. About eight minutes on an H100.
# Usage: bash benchmarks/gpu_gpt_protocol.sh OUTDIR TEXT_FILE
set -u
out=${1:?usage: bash benchmarks/gpu_gpt_protocol.sh OUTDIR TEXT_FILE}
text=${2:?usage: bash benchmarks/gpu_gpt_protocol.sh OUTDIR TEXT_FILE}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
same=(--preset shakespeare-char --data "$text" --precision bf16 --seeds 0,1,2 --quiet)
timeout 220 python3 -m frost bench gpt "${same[@]}" --jit --out "$out/gpt_protocol_frost.json" 2>&1 | tail -8
timeout 360 python3 benchmarks/torch_gpt.py "${same[@]}" --mode compile --out "$out/gpt_protocol_torch.json" 2>&1 \
    | tail -8
