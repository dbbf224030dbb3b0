#!/usr/bin/env bash
# The fused attention backward on a Hopper GPU, in one device call of under ten minutes: the GPU suite (its tests
# check the fused backward in each layout against float64, the A-MN-major wgmma and the bulk reductions on the
# hardware), the backward alone against PyTorch's cuDNN and flash backends (benchmarks/flash_backward.py: the
# two-kernel backward and each setting of FUSED_SETTINGS), then the sweep (head dims 64 and 128, lengths
# 512 to 16k) with the fused backward switched on (FROST_FLASH_FUSED_BACKWARD=1). Results in OUTDIR.
# Usage: bash benchmarks/gpu_flash_fused.sh OUTDIR   (the cuDNN frontend on PYTHONPATH)
set -u
out=${1:?usage: bash benchmarks/gpu_flash_fused.sh OUTDIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
timeout 150 python3 -m pytest -m cuda -n 8 tests -p no:cacheprovider -o addopts="" -q --timeout 100 -rfE \
    > "$out/gpu_tests.txt" 2>&1
grep -E "^FAILED|^ERROR|passed|failed" "$out/gpu_tests.txt" | tail -25
cd benchmarks || exit 1
timeout 150 python3 flash_backward.py --head-dims 128 64 --lengths 2048 4096 --out "$out/flash_backward.json" 2>&1 \
    | tail -44
FROST_FLASH_FUSED_BACKWARD=1 timeout 240 python3 flash_attention.py --sweep --iters 5 \
    --out "$out/flash_attention_sweep_fused.json" 2>&1 | tail -40
