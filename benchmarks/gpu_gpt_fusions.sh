#!/usr/bin/env bash
# What each of the transformer step's fusions is worth, in one device call: the GPU suite, GPT-2 124M (bf16,
# frost.jit, batch 16 x 1024) against torch.compile, then Frost alone with each fusion switched off in turn (LayerNorm's
# autocast copy: FROST_LN_AUTOCAST_COPY=0; LayerNorm's backward adding the stream's gradient so far:
# FROST_LN_ADDS_GRADIENTS=0, which leaves the sum to the pair kernel, then without that too: --without sum_in_dtypes;
# all off),
# the kernel profile beside torch.compile's, and the seed ResNet's step (no regression). Results in OUTDIR.
# Usage: bash benchmarks/gpu_gpt_fusions.sh OUTDIR   (the cuDNN frontend on PYTHONPATH; about nine minutes)
set -u
out=${1:?usage: bash benchmarks/gpu_gpt_fusions.sh OUTDIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
gpt2=(--preset gpt2-124m --batch-size 16 --precision bf16 --jit --steps 40 --warmup 15 --eval-interval 0
      --eval-iters 2 --quiet)
timeout 150 python3 -m pytest -m cuda -n 8 tests -p no:cacheprovider -o addopts="" -q --timeout 100 -rfE \
    > "$out/gpu_tests.txt" 2>&1
grep -E "^FAILED|^ERROR|passed|failed" "$out/gpu_tests.txt" | tail -25
timeout 240 python3 benchmarks/gpt.py "${gpt2[@]}" --torch-modes compile --out "$out/gpt2_124m_bf16_jit.json" 2>&1 \
    | tail -6
FROST_LN_ADDS_GRADIENTS=0 timeout 60 python3 -m frost bench gpt "${gpt2[@]}" --out "$out/gpt2_without_ln_adds.json" \
    2>&1 | tail -3
FROST_LN_ADDS_GRADIENTS=0 timeout 60 python3 -m frost bench gpt "${gpt2[@]}" --without sum_in_dtypes \
    --out "$out/gpt2_without_ln_adds_and_pair_sum.json" 2>&1 | tail -3
FROST_LN_AUTOCAST_COPY=0 timeout 60 python3 -m frost bench gpt "${gpt2[@]}" --out "$out/gpt2_without_ln_copy.json" \
    2>&1 | tail -3
FROST_LN_AUTOCAST_COPY=0 FROST_LN_ADDS_GRADIENTS=0 timeout 60 python3 -m frost bench gpt "${gpt2[@]}" \
    --without sum_in_dtypes --out "$out/gpt2_without_all.json" 2>&1 | tail -3
bash benchmarks/gpt_kernels.sh "$out" gpt2 50 --preset gpt2-124m --batch-size 16 --precision bf16 --steps 6 --warmup 4 \
    --eval-interval 0 --eval-iters 2 --quiet
for precision in fp32 bf16; do
    timeout 60 python3 -m frost bench resnet-cifar10 --sample --steps 20000 --seeds 0 --quiet --precision "$precision" \
        --out "$out/seed_$precision.json" 2>&1 | tail -1
done
